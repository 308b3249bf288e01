"""Execution backends: ``skypilot`` (managed jobs on Kubernetes) and ``local`` (this machine, in
containers or as processes).

Each backend is a folder with the same files: ``backend.py`` (the :class:`ExecutionBackend` and
the capabilities it declares), ``jobs.py`` (the job service it launches into and reads from),
``tasks.py`` (how it encodes a stage's task). This module is the only place that knows them by
name: ``--infra`` and a manifest's recorded backend are turned into a backend here. Heavy
libraries are imported inside the backends, never here.

Which classes build the backends of a process is decided once, by its entry point
(:func:`use_backends`): the CLI and the run watcher use :func:`default_backends`; a test entry
point installs factories that pass test doubles to the backends' constructors.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
from npa.core.errors import (
    BackendUnavailable,
    InvalidInput,
    LaunchRejected,
    ToolMissing,
    TransientRefusal,
)
from npa.core.paths import NpaPaths

__all__ = [
    "LOCAL_INFRA",
    "RUNTIMES",
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
    "infra_for_context",
    "open_backend",
    "use_backends",
]

BackendFactory = Callable[[NpaPaths, "str | None"], ExecutionBackend]


@dataclass(frozen=True)
class Backends:
    """How this process builds its backends, and how it starts a detached run watcher."""

    factories: Mapping[str, BackendFactory]  # recorded name -> (paths, kube context) -> backend
    watcher_module: str = "npa.launch.watch"  # started as ``python -m <module> DIR``


def _local(paths: NpaPaths, context: str | None) -> ExecutionBackend:
    from npa.backends.local.backend import LocalBackend

    return LocalBackend(paths)


def _skypilot(paths: NpaPaths, context: str | None) -> ExecutionBackend:
    from npa.backends.skypilot.backend import SkyPilotBackend

    return SkyPilotBackend(paths, context=context)


def default_backends() -> Backends:
    """The real backends."""
    return Backends(factories={"local": _local, "skypilot": _skypilot})


_installed: list[Backends] = []


def use_backends(backends: Backends) -> None:
    """Make ``backends`` the ones this process opens (its entry point calls this once)."""
    _installed[:] = [backends]


def installed_backends() -> Backends:
    """The backends this process opens: what its entry point installed, else the real ones."""
    return _installed[0] if _installed else default_backends()


#: ``--infra`` for this machine, and what ``submit`` runs on when ``--infra`` is not given.
LOCAL_INFRA = "local"

#: ``--runtime`` values: where ``--infra local`` runs a stage. ``auto`` is a container when an
#: engine answers on this machine, else a host process.
RUNTIMES = ("auto", "container", "process")


def _local_runtime(paths: NpaPaths, runtime: str) -> ExecutionBackend:
    from npa.adapters.containers import find_engine
    from npa.backends.local.backend import LocalContainerBackend

    if runtime == "process":
        return open_backend("local", paths)
    engine = find_engine("auto")
    if engine is None:
        if runtime == "auto":
            return open_backend("local", paths)
        raise ToolMissing(
            "--runtime container needs a container engine (podman or docker) that answers",
            fix="apt-get install -y podman  # or --runtime process",
        )
    return LocalContainerBackend(paths, engine)


def infra_context(infra: str) -> str | None:
    """The Kubernetes context an ``--infra`` value names (``k8s/<context>``), else None."""
    kind, _, context = infra.partition("/")
    return context if kind in ("k8s", "kubernetes") and context else None


def infra_for_context(context: str) -> str:
    """The ``--infra`` value that runs on the Kubernetes context ``context``."""
    return f"k8s/{context}"


def backend_for_infra(infra: str, paths: NpaPaths, *, runtime: str = "auto") -> ExecutionBackend:
    """The backend ``--infra`` selects: ``local`` (stages in their images or as processes, as
    ``--runtime`` says), or ``k8s/<context>`` (SkyPilot on that context, through the kubeconfig
    provisioning placed for it; every stage runs in its image there)."""
    if runtime not in RUNTIMES:
        raise InvalidInput(
            f"--runtime {runtime!r} is not one of {', '.join(RUNTIMES)}", fix="--runtime auto"
        )
    if infra == LOCAL_INFRA:
        return _local_runtime(paths, runtime)
    if runtime == "process":
        raise InvalidInput(
            f"--runtime process is for --infra local; on {infra} every stage runs in its image",
            fix=f"--infra {infra} --runtime auto",
        )
    context = infra_context(infra)
    if context is None:
        raise _unknown_infra(infra)
    return open_backend("skypilot", paths, context=context)


def _unknown_infra(infra: str) -> InvalidInput:
    """An ``--infra`` value that selects no backend, with the value it most likely meant."""
    kind, _, context = infra.partition("/")
    if kind in ("k8s", "kubernetes"):
        return InvalidInput(
            f"--infra {infra!r} names no kube context after the slash",
            fix="kubectl config get-contexts -o name  # the names --infra k8s/ takes",
        )
    meant = "k8s/" + (context or kind)
    return InvalidInput(
        f"--infra {infra!r} is neither 'local' nor 'k8s/<context>'"
        + (f"; did you mean {meant!r}?" if kind != "local" else ""),
        fix=f"--infra {shlex.quote(meant)}  # or --infra local",
    )


def open_backend(name: str, paths: NpaPaths, *, context: str | None = None) -> ExecutionBackend:
    """The backend a manifest or receipt recorded as ``name``, for ``context``."""
    factory = installed_backends().factories.get(name)
    if factory is None:
        raise ValueError(f"unknown backend {name!r}")
    return factory(paths, context)
