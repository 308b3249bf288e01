"""Kubernetes reads npa needs outside SkyPilot: why a job's pods wait, and what GPUs nodes offer.

Each function takes a kubeconfig file and a context (the same file SkyPilot is pointed at) and
imports the kubernetes client inside, so nothing here costs start-up time.
"""
