"""The managed-jobs service boundary: the only place npa calls SkyPilot's jobs SDK.

:class:`ManagedJobsService` is what the backend needs from SkyPilot, shaped like the SDK
itself: requests are identified by a request id resolved with ``get``; the queue returns
SkyPilot's own ``ManagedJobRecord`` models. :class:`SkyManagedJobs` is the real one (``sky`` is
imported on first use, with ``KUBECONFIG`` pointing at the selected context's file).
Another implementation of the same protocol (a test double) is passed to the backend's
constructor (:class:`npa.backends.skypilot.backend.SkyPilotBackend`). The protocol is typed with
SkyPilot's own models, so a double that answers anything else fails type checking as well as
the tests.

The SDK never starts an API server here (SkyPilot's ``SKYPILOT_DISABLE_LOCAL_API_SERVER`` is set
around every call). A service made to read (``start_server=False``: status, logs, cancel, the
supervisor) answers "unavailable" with the command that starts one when the configured server
does not answer, before SkyPilot is even imported; one allowed to start it (``submit``, through
the backend's ``prepare_launch``) starts the local server through
:mod:`npa.adapters.skypilot.keeper` first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from npa.adapters.skypilot import layer
from npa.adapters.skypilot.api import (
    NO_LOCAL_SERVER_ENV,
    ApiServerDown,
    configured_server_url,
    kubeconfig_env,
    server_reachable,
)
from npa.adapters.skypilot.home import private_home

if TYPE_CHECKING:
    from sky.schemas.api.responses import ManagedJobRecord

T = TypeVar("T")


class ManagedJobsService(Protocol):
    def launch(self, task_yamls: list[str], name: str, config: dict[str, Any] | None = None) -> str:
        """``sky.jobs.launch`` of the chained tasks, with ``config`` laid over SkyPilot's client
        configuration for this request (:mod:`npa.adapters.skypilot.layer`); returns the
        request id."""

    def get(self, request_id: str) -> Any:
        """``sky.get``: the request's result, or the exception it raised."""

    def queue(self, name: str) -> list[ManagedJobRecord]:
        """The ``ManagedJobRecord``s whose name contains ``name`` (finished ones included)."""

    def cancel(self, job_ids: list[int]) -> None:
        """``sky.jobs.cancel(job_ids=...)``, resolved."""

    def tail_logs(self, job_id: int, follow: bool, task: str | int | None = None) -> Iterator[str]:
        """``sky.jobs.tail_logs(job_id=..., task=...)`` as lines: ``task`` (a task name, or its
        id in the job) selects one task of a pipeline; None tails every task."""

    def controller_log(self, job_id: int) -> list[str]:
        """``sky.jobs.tail_logs(job_id=..., controller=True, follow=False)`` as lines: what the
        jobs controller logged while it ran the job (each launch it tried, and why one
        failed)."""


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


# How many times a request is asked when only SkyPilot's health check in front of it failed.
HEALTH_TRIES = 3
# What SkyPilot's SDK raises when its health check found no server and it may not start one.
_NO_LOCAL_START = "starting a local API server on this machine is disabled"


def _health_check_failed(exc: RuntimeError) -> bool:
    """Whether ``exc`` is SkyPilot's SDK giving up on the server's health before any request
    was sent: no healthy answer in time, and no local server it may start instead."""
    from sky import exceptions

    return isinstance(exc, exceptions.ApiServerConnectionError) or _NO_LOCAL_START in str(exc)


class SkyManagedJobs:
    """The real service, through SkyPilot's Python SDK."""

    def __init__(self, *, kubeconfig: str | None, start_server: bool = False) -> None:
        self.kubeconfig = kubeconfig
        self.start_server = start_server

    @contextlib.contextmanager
    def _sdk(self, private: bool = True) -> Iterator[None]:
        """Around every SDK call: this kubeconfig, a server that answers (started through the
        keeper only when this service may start one), and no implicit start by the SDK. A read
        (``private``) runs SkyPilot with a home of its own (:mod:`npa.adapters.skypilot.home`):
        it leaves ``~/.sky`` as it was."""
        with private_home() if private else contextlib.nullcontext(), self._server():
            yield

    @contextlib.contextmanager
    def _server(self) -> Iterator[None]:
        if self.start_server:
            from npa.adapters.skypilot.keeper import ensure_local_server
            from npa.core.paths import NpaPaths

            paths = NpaPaths.from_env()
            placed = sorted(paths.clusters_dir.glob("*/kubeconfig"))
            ensure_local_server(paths.root / "skypilot" / "api-keeper.log", placed)
        else:
            url = configured_server_url()
            if not server_reachable(url):
                raise ApiServerDown(url)
        before = os.environ.get(NO_LOCAL_SERVER_ENV)
        os.environ[NO_LOCAL_SERVER_ENV] = "1"
        try:
            with kubeconfig_env(self.kubeconfig):
                yield
        finally:
            if before is None:
                os.environ.pop(NO_LOCAL_SERVER_ENV, None)
            else:
                os.environ[NO_LOCAL_SERVER_ENV] = before

    def _request(self, call: Callable[[], T]) -> T:
        """One SDK request, asked again when only SkyPilot's health check in front of it
        failed.

        Each SDK request first asks the server's health, giving it three tries of 2.5 s; a
        server that has not answered by then counts as down, and the SDK would start one, which
        npa forbids, so it raises before sending the request. A server busy with a launch on a
        loaded machine stalls that long (3 to 4.5 s stalls of its event loop were logged). When
        npa's own check (:data:`~npa.adapters.skypilot.api.PATIENCE`) finds it answering, it is
        busy, not down, and the request is asked again: at most :data:`HEALTH_TRIES` times."""
        from sky.server import common

        attempt = 1
        while True:
            try:
                return call()
            except RuntimeError as exc:
                if not _health_check_failed(exc):
                    raise
                url = configured_server_url()
                if attempt == HEALTH_TRIES or not server_reachable(url):
                    raise ApiServerDown(
                        url, f"it did not answer SkyPilot's health check {attempt} times"
                    ) from None
                # The SDK keeps a health answer (here: none) for 5 s; ask afresh.
                common.get_api_server_status_response.cache_clear()
                attempt += 1

    def launch(self, task_yamls: list[str], name: str, config: dict[str, Any] | None = None) -> str:
        with self._sdk(private=False), layer.applied(config):
            import sky

            dag = build_dag(task_yamls, name)
            return str(self._request(lambda: sky.jobs.launch(dag, name=name)))

    def get(self, request_id: str) -> Any:
        with self._sdk(private=False):  # the answer to submit's launch
            import sky

            return sky.get(request_id)  # type: ignore[arg-type]

    def queue(self, name: str) -> list[ManagedJobRecord]:
        with self._sdk():
            import sky

            request = self._request(
                lambda: sky.jobs.queue_v2(
                    refresh=False, skip_finished=False, name_match=name, fields=None
                )
            )
            records, _total, _counts, _unfiltered = sky.get(request)
            return list(records)

    def cancel(self, job_ids: list[int]) -> None:
        with self._sdk():
            import sky

            sky.get(self._request(lambda: sky.jobs.cancel(job_ids=job_ids)))

    def tail_logs(self, job_id: int, follow: bool, task: str | int | None = None) -> Iterator[str]:
        with self._sdk():
            import sky

            chunks = self._request(
                lambda: sky.jobs.tail_logs(
                    job_id=job_id, follow=follow, task=task, preload_content=False
                )
            )
            for chunk in chunks:
                if chunk:
                    yield from chunk.splitlines()

    def controller_log(self, job_id: int) -> list[str]:
        with self._sdk():
            import sky

            chunks = self._request(
                lambda: sky.jobs.tail_logs(
                    job_id=job_id, follow=False, controller=True, preload_content=False
                )
            )
            return [line for chunk in chunks if chunk for line in chunk.splitlines()]
