"""Execution backends: ``skypilot`` (managed jobs on Kubernetes) and ``local`` (processes).

Each backend is a folder with the same files: ``backend.py`` (the :class:`ExecutionBackend`),
``jobs.py`` (the job service it launches into and reads from), ``tasks.py`` (what it renders
for each stage). Heavy libraries are imported inside them, never here.
"""

from __future__ import annotations

from npa.backends.base import (
    BackendUnavailable,
    ExecutionBackend,
    JobRecord,
    JobStages,
    JobState,
    JobSubmission,
    LaunchRejected,
    QueueAnswer,
    TaskContext,
    TaskRecord,
    TransientRefusal,
)
from npa.core.paths import NpaPaths

__all__ = [
    "BackendUnavailable",
    "ExecutionBackend",
    "JobRecord",
    "JobStages",
    "JobState",
    "JobSubmission",
    "LaunchRejected",
    "QueueAnswer",
    "TaskContext",
    "TaskRecord",
    "TransientRefusal",
    "open_backend",
]


def open_backend(
    name: str, paths: NpaPaths, *, kubeconfig: str | None = None, start_server: bool = False
) -> ExecutionBackend:
    """The backend called ``name`` (``local`` or ``skypilot``). ``start_server``: the backend may
    start the local SkyPilot API server (only ``submit`` asks for that)."""
    if name == "local":
        from npa.backends.local.backend import LocalBackend

        return LocalBackend(paths)
    if name == "skypilot":
        from npa.backends.skypilot.backend import SkyPilotBackend

        return SkyPilotBackend(kubeconfig=kubeconfig, start_server=start_server)
    raise ValueError(f"unknown backend {name!r}")
