"""The ``kubernetes`` target: a cluster that exists, reached through a kube context."""
