"""Launching a run exactly once: readiness probe, launch transaction, supervision policy."""
