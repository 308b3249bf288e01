"""SkyPilot's SDK checks the API server's health before each request (three tries of 2.5 s)
and, as npa forbids it to start a server, raises before sending anything when the server is
slow. npa asks such a request again while its own, more patient check finds the server
answering; a server that is really gone is still reported down, with the fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from npa.adapters.skypilot.api import ApiServerDown
from npa.backends.skypilot.jobs import HEALTH_TRIES, SkyManagedJobs
from tests.integration.test_api_server_reachable import serve

pytestmark = pytest.mark.integration

DISABLED = RuntimeError(
    "No SkyPilot API server endpoint is configured, and starting a local API server on this "
    "machine is disabled (SKYPILOT_DISABLE_LOCAL_API_SERVER=1)."
)


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for url in serve(0.0):
        monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", url)
        yield url


def flaky(failures: list[BaseException]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return "request-id"

    return calls, call


def test_a_request_whose_health_check_timed_out_is_asked_again(answering: str) -> None:
    from sky import exceptions

    calls, call = flaky([DISABLED, exceptions.ApiServerConnectionError(answering)])
    assert SkyManagedJobs(kubeconfig=None)._request(call) == "request-id"
    assert len(calls) == 3


def test_a_server_that_keeps_failing_the_check_is_down_after_the_last_try(answering: str) -> None:
    calls, call = flaky([DISABLED] * HEALTH_TRIES)
    with pytest.raises(ApiServerDown) as err:
        SkyManagedJobs(kubeconfig=None)._request(call)
    assert len(calls) == HEALTH_TRIES and err.value.fix == "sky api start"


def test_a_server_that_is_gone_is_down_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "http://127.0.0.1:9")  # refused
    calls, call = flaky([DISABLED])
    with pytest.raises(ApiServerDown):
        SkyManagedJobs(kubeconfig=None)._request(call)
    assert len(calls) == 1


def test_other_errors_are_not_asked_again(answering: str) -> None:
    calls, call = flaky([RuntimeError("the controller refused the job")])
    with pytest.raises(RuntimeError, match="refused the job"):
        SkyManagedJobs(kubeconfig=None)._request(call)
    assert len(calls) == 1
