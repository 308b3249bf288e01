"""The ``nebius`` target: a Managed Kubernetes cluster npa creates on Nebius."""
