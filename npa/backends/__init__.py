"""Execution backends: ``skypilot`` (managed jobs on Kubernetes) and ``local`` (processes).

Each backend is a folder with the same files: ``backend.py`` (the :class:`ExecutionBackend` and
the capabilities it declares), ``jobs.py`` (the job service it launches into and reads from),
``tasks.py`` (how it encodes a stage's task). This module is the only place that knows them by
name: ``--infra`` and a manifest's recorded backend are turned into a backend here. Heavy
libraries are imported inside the backends, never here.
"""

from __future__ import annotations

from npa.backends.base import (
    ExecutionBackend,
    JobRecord,
    JobStages,
    JobState,
    JobSubmission,
    QueueAnswer,
    RunTasks,
    StageTask,
    TaskRecord,
)
from npa.core.errors import BackendUnavailable, InvalidInput, LaunchRejected, TransientRefusal
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
    "RunTasks",
    "StageTask",
    "TaskRecord",
    "TransientRefusal",
    "backend_for_infra",
    "infra_context",
    "open_backend",
]


def infra_context(infra: str) -> str | None:
    """The Kubernetes context an ``--infra`` value names (``k8s/<context>``), else None."""
    kind, _, context = infra.partition("/")
    return context if kind in ("k8s", "kubernetes") and context else None


def backend_for_infra(infra: str, paths: NpaPaths) -> ExecutionBackend:
    """The backend ``--infra`` selects: ``local``, or ``k8s/<context>`` (SkyPilot on that
    context, through the kubeconfig provisioning placed for it)."""
    if infra == "local":
        return open_backend("local", paths)
    context = infra_context(infra)
    if context is None:
        raise InvalidInput(
            f"--infra {infra!r} is neither 'local' nor 'k8s/<context>'",
            fix="--infra local  # or --infra k8s/<context>",
        )
    return open_backend("skypilot", paths, context=context)


def open_backend(name: str, paths: NpaPaths, *, context: str | None = None) -> ExecutionBackend:
    """The backend a manifest or receipt recorded as ``name``, for ``context``."""
    if name == "local":
        from npa.backends.local.backend import LocalBackend

        return LocalBackend(paths)
    if name == "skypilot":
        from npa.backends.skypilot.backend import SkyPilotBackend

        return SkyPilotBackend(paths, context=context)
    raise ValueError(f"unknown backend {name!r}")
