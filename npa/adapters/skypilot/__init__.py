"""What SkyPilot needs around it, asked directly: its API server and jobs controller, its own
check of a Kubernetes context, the cluster objects and permissions it relies on, and the Python
environment it runs in.

Every function imports sky / kubernetes inside, so importing this package costs nothing.
"""
