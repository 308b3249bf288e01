"""The Nebius quota source against a real gRPC server speaking the quota-allowance service.

The server is an in-process ``grpc.server`` registered under the service's real name and
answering with the SDK's own message types, so the SDK's channel, serialisation, metadata and
status handling are all exercised; only the cloud is replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from npa.plan.infra import DISK_COUNT, GIB, cluster_requirements, disk_needs
from npa.plan.quota import assess
from npa.plan.quota_sources import FileQuotaSource, NebiusQuotaSource
from npa.spec.model import Infrastructure

pytestmark = pytest.mark.integration

SSD = "compute.disk.size.network-ssd"
SERVICE = "nebius.quotas.v1.QuotaAllowanceService"
NEEDS = disk_needs(Infrastructure())

Answer = Callable[[Any, grpc.ServicerContext], Any]


class FakeQuotaApi:
    """Answers GetByName from a table; records every request and its metadata."""

    def __init__(self) -> None:
        from nebius.api.nebius.quotas.v1 import GetByNameRequest

        self.table: dict[str, Answer] = {}
        self.requests: list[tuple[str, str, str, dict[str, str]]] = []
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "GetByName": grpc.unary_unary_rpc_method_handler(
                    self._get_by_name,
                    request_deserializer=GetByNameRequest.FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def _get_by_name(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(
            (request.parent_id, request.name, request.region, dict(context.invocation_metadata()))
        )
        answer = self.table.get(request.name)
        if answer is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"quota {request.name} not found")
        return answer(request, context)

    def source(self, **kwargs: Any) -> NebiusQuotaSource:
        return NebiusQuotaSource(
            "project-e00test",
            "eu-north1",
            endpoint=f"127.0.0.1:{self.port}",
            credentials="test-token",
            **kwargs,
        )


def allowance(
    limit: int | None, usage: int, *, unit: str = "byte", state: str = "STATE_ACTIVE"
) -> Answer:
    def answer(request: Any, context: grpc.ServicerContext) -> Any:
        from nebius.api.nebius.quotas.v1 import (
            QuotaAllowance,
            QuotaAllowanceSpec,
            QuotaAllowanceStatus,
        )

        return QuotaAllowance(
            spec=QuotaAllowanceSpec(limit=limit, region=request.region),
            status=QuotaAllowanceStatus(
                usage=usage,
                unit=unit,
                state=getattr(QuotaAllowanceStatus.State, state),
                usage_state=QuotaAllowanceStatus.UsageState.USAGE_STATE_USED,
            ),
        )

    return answer


@pytest.fixture
def api() -> Iterator[FakeQuotaApi]:
    server = FakeQuotaApi()
    server.server.start()
    try:
        yield server
    finally:
        server.server.stop(0)


def test_21_gib_from_the_api_blocks_with_the_exact_shortfall(api: FakeQuotaApi) -> None:
    api.table[SSD] = allowance(2048 * GIB, 2027 * GIB)
    api.table[DISK_COUNT] = allowance(32, 5, unit="")
    result = assess(cluster_requirements(NEEDS), [api.source()], needs=NEEDS)
    ssd = result.lines[0]
    assert result.verdict == "blocked"
    assert (ssd.available, ssd.shortfall, ssd.shortfall_gib) == (21 * GIB, 1230 * GIB, 1230)
    assert ssd.sources == ["nebius:eu-north1"]
    assert result.lines[1].available == 27
    asked = {(p, n, r) for p, n, r, _ in api.requests}
    assert asked == {
        ("project-e00test", SSD, "eu-north1"),
        ("project-e00test", DISK_COUNT, "eu-north1"),
    }
    metadata = api.requests[0][3]
    assert metadata["authorization"] == "Bearer test-token"
    assert metadata["user-agent"].startswith("npa/")


def test_api_answers_that_are_not_evidence_give_blocked_unknown(api: FakeQuotaApi) -> None:
    api.table[DISK_COUNT] = allowance(32, 5, unit="")
    cases: dict[str, Answer] = {
        "not found": lambda r, c: c.abort(grpc.StatusCode.NOT_FOUND, "no such quota"),
        "denied": lambda r, c: c.abort(grpc.StatusCode.PERMISSION_DENIED, "no"),
        "frozen": allowance(4096 * GIB, 0, state="STATE_FROZEN"),
        "no limit": allowance(None, 0),
        "wrong unit": allowance(4096 * GIB, 0, unit="GiB"),
        "over limit": allowance(10 * GIB, 11 * GIB),
    }
    for label, answer in cases.items():
        api.table[SSD] = answer
        result = assess(cluster_requirements(NEEDS), [api.source()], needs=NEEDS)
        assert result.verdict == "blocked-unknown", label
        assert result.lines[0].verdict == "unknown", label
        assert result.lines[1].verdict == "ok", label


def test_api_and_file_must_agree(api: FakeQuotaApi, tmp_path: Any) -> None:
    api.table[SSD] = allowance(2048 * GIB, 0)
    api.table[DISK_COUNT] = allowance(32, 5, unit="")
    review = tmp_path / "q.yaml"
    review.write_text(
        f"quotas:\n  {SSD}: {{limit: {2048 * GIB}, usage: {2027 * GIB}}}\n"
        f"  {DISK_COUNT}: {{limit: 32, usage: 5}}\n"
    )
    result = assess(
        cluster_requirements(NEEDS), [FileQuotaSource(review), api.source()], needs=NEEDS
    )
    assert result.verdict == "blocked-unknown"
    assert "disagree" in result.lines[0].reason
    assert result.lines[1].verdict == "ok"


def test_unreachable_api_is_unknown_not_absent() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = NebiusQuotaSource(
        "project-e00test", "eu-north1", endpoint=f"127.0.0.1:{port}", credentials="t", timeout=1.5
    )
    result = assess(cluster_requirements(NEEDS), [source], needs=NEEDS)
    assert result.verdict == "blocked-unknown"
    assert all(line.verdict == "unknown" for line in result.lines)


def test_plan_spec_cli_asks_the_api(api: FakeQuotaApi) -> None:
    from tests.harness.cli import run_npa

    api.table[SSD] = allowance(2048 * GIB, 2027 * GIB)
    api.table[DISK_COUNT] = allowance(32, 5, unit="")
    res = run_npa(
        "workbench",
        "workflow",
        "plan-spec",
        "examples/physical-ai.yaml",
        "--run-id",
        "demo-1",
        "--nebius-project",
        "project-e00cli",
        "--nebius-endpoint",
        f"127.0.0.1:{api.port}",
        "--json",
        env={"NEBIUS_IAM_TOKEN": "cli-token"},
    )
    assert res.code == 1, res.stderr
    quota = res.json()["quota"]
    assert quota["sources"] == ["nebius:eu-north1"]  # region from the spec's infrastructure
    assert quota["lines"][0]["shortfall_gib"] == 1230
    assert {r[0] for r in api.requests} == {"project-e00cli"}
    assert api.requests[0][3]["authorization"] == "Bearer cli-token"
    assert "cli-token" not in res.stdout
