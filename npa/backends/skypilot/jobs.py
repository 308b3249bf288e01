"""The managed-jobs service boundary: the only place npa calls SkyPilot's jobs SDK.

:class:`ManagedJobsService` is what the backend needs from SkyPilot, shaped like the SDK
itself: requests are identified by a request id resolved with ``get``; the queue returns
SkyPilot's own ``ManagedJobRecord`` models. :class:`SkyManagedJobs` is the real one (``sky`` is
imported on first use, with ``KUBECONFIG`` pointing at the selected context's file).
``NPA_SKYPILOT_JOBS_SERVICE=module:factory`` substitutes another implementation of the same
protocol (a test double, or a site-specific wrapper); the factory is called with
``kubeconfig=``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any, Protocol

from npa.adapters.skypilot import layer
from npa.adapters.skypilot.api import kubeconfig_env

SERVICE_ENV = "NPA_SKYPILOT_JOBS_SERVICE"


class ManagedJobsService(Protocol):
    def launch(self, task_yamls: list[str], name: str, config: dict[str, Any] | None = None) -> str:
        """``sky.jobs.launch`` of the chained tasks, with ``config`` laid over SkyPilot's client
        configuration for this request (:mod:`npa.adapters.skypilot.layer`); returns the
        request id."""

    def get(self, request_id: str) -> Any:
        """``sky.get``: the request's result, or the exception it raised."""

    def queue(self, name: str) -> list[Any]:
        """The ``ManagedJobRecord``s whose name contains ``name`` (finished ones included)."""

    def cancel(self, job_ids: list[int]) -> None:
        """``sky.jobs.cancel(job_ids=...)``, resolved."""

    def tail_logs(self, job_id: int, follow: bool, task: str | int | None = None) -> Iterator[str]:
        """``sky.jobs.tail_logs(job_id=..., task=...)`` as lines: ``task`` (a task name, or its
        id in the job) selects one task of a pipeline; None tails every task."""


def build_dag(task_yamls: list[str], name: str) -> Any:
    """The pipeline a run launches: one ``sky.Task`` per rendered stage, chained in order."""
    import sky
    import yaml

    with sky.Dag() as dag:
        previous = None
        for text in task_yamls:
            task = sky.Task.from_yaml_config(yaml.safe_load(text))
            if previous is not None:
                previous >> task
            previous = task
    dag.name = name
    return dag


class SkyManagedJobs:
    """The real service, through SkyPilot's Python SDK."""

    def __init__(self, *, kubeconfig: str | None) -> None:
        self.kubeconfig = kubeconfig

    def launch(self, task_yamls: list[str], name: str, config: dict[str, Any] | None = None) -> str:
        import sky

        with kubeconfig_env(self.kubeconfig), layer.applied(config):
            return str(sky.jobs.launch(build_dag(task_yamls, name), name=name))

    def get(self, request_id: str) -> Any:
        import sky

        with kubeconfig_env(self.kubeconfig):
            return sky.get(request_id)  # type: ignore[arg-type]

    def queue(self, name: str) -> list[Any]:
        import sky

        with kubeconfig_env(self.kubeconfig):
            request = sky.jobs.queue_v2(
                refresh=False, skip_finished=False, name_match=name, fields=None
            )
            records, _total, _counts, _unfiltered = sky.get(request)
            return list(records)

    def cancel(self, job_ids: list[int]) -> None:
        import sky

        with kubeconfig_env(self.kubeconfig):
            sky.get(sky.jobs.cancel(job_ids=job_ids))

    def tail_logs(self, job_id: int, follow: bool, task: str | int | None = None) -> Iterator[str]:
        import sky

        with kubeconfig_env(self.kubeconfig):
            chunks = sky.jobs.tail_logs(
                job_id=job_id, follow=follow, task=task, preload_content=False
            )
            for chunk in chunks:
                if chunk:
                    yield from chunk.splitlines()


def load_service(kubeconfig: str | None) -> ManagedJobsService:
    """The configured service: ``$NPA_SKYPILOT_JOBS_SERVICE`` or the real SDK."""
    target = os.environ.get(SERVICE_ENV)
    if not target:
        return SkyManagedJobs(kubeconfig=kubeconfig)
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr or "service")
    service: ManagedJobsService = factory(kubeconfig=kubeconfig)
    return service
