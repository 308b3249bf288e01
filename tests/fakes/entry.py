"""Entry points that run npa with the managed-jobs double, passed to the SkyPilot backend's
constructor the way a test composes its process (production code never looks for it):

- ``python -m tests.fakes.cli ARGS...``: the ``npa`` CLI;
- ``python -m tests.fakes.watch DIR``: the detached run watcher the CLI starts.

The double keeps its state in the file ``$NPA_FAKE_JOBS_STATE`` names (see
:mod:`tests.fakes.managed_jobs`), so every process of a test sees the same jobs.
"""

from __future__ import annotations

from npa.backends import Backends, ExecutionBackend, default_backends, use_backends
from npa.core.paths import NpaPaths

CLI_MODULE = "tests.fakes.cli"
WATCHER_MODULE = "tests.fakes.watch"


def _skypilot(paths: NpaPaths, context: str | None) -> ExecutionBackend:
    from npa.backends.skypilot.backend import SkyPilotBackend
    from tests.fakes.managed_jobs import FakeManagedJobs

    real = SkyPilotBackend(paths, context=context)
    fake = FakeManagedJobs(kubeconfig=real.kubeconfig)
    return SkyPilotBackend(paths, context=context, service=fake, observe=fake.observe)


def install() -> None:
    """The real backends, but SkyPilot's job service is the double; watchers run here too."""
    factories = dict(default_backends().factories)
    factories["skypilot"] = _skypilot
    use_backends(Backends(factories=factories, watcher_module=WATCHER_MODULE))
