"""The local backend: a run's stages as processes on this machine, under a detached supervisor."""
