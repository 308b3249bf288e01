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

from npa.core.errors import InvalidInput
from npa.plan.infra import DISK_COUNT, GIB, cluster_requirements, disk_needs
from npa.plan.quota import QuotaScope, assess
from npa.plan.quota_sources import FileQuotaSource, NebiusQuotaSource
from npa.spec.model import Infrastructure

pytestmark = pytest.mark.integration

SSD = "compute.disk.size.network-ssd"
SERVICE = "nebius.quotas.v1.QuotaAllowanceService"
NEEDS = disk_needs(Infrastructure())
SCOPE = QuotaScope(region="eu-north1", project="project-e00test")

Answer = Callable[[Any, grpc.ServicerContext], Any]


class FakeQuotaApi:
    """Answers GetByName from a table; records every request and its metadata."""

    def __init__(self) -> None:
        from nebius.api.nebius.quotas.v1 import GetByNameRequest

        self.table: dict[str, Answer] = {}
        self.requests: list[tuple[str, str, str, dict[str, str]]] = []
        self.handler = grpc.method_handlers_generic_handler(
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
        self.server.add_generic_rpc_handlers((self.handler,))
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
    result = assess(cluster_requirements(NEEDS), [api.source()], needs=NEEDS, scope=SCOPE)
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
        result = assess(cluster_requirements(NEEDS), [api.source()], needs=NEEDS, scope=SCOPE)
        assert result.verdict == "blocked-unknown", label
        assert result.lines[0].verdict == "unknown", label
        assert result.lines[1].verdict == "ok", label


def test_api_and_file_must_agree(api: FakeQuotaApi, tmp_path: Any) -> None:
    api.table[SSD] = allowance(2048 * GIB, 0)
    api.table[DISK_COUNT] = allowance(32, 5, unit="")
    review = tmp_path / "q.yaml"
    review.write_text(
        "region: eu-north1\n"
        f"quotas:\n  {SSD}: {{limit: {2048 * GIB}, usage: {2027 * GIB}}}\n"
        f"  {DISK_COUNT}: {{limit: 32, usage: 5}}\n"
    )
    result = assess(
        cluster_requirements(NEEDS),
        [FileQuotaSource(review), api.source()],
        needs=NEEDS,
        scope=SCOPE,
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
    result = assess(cluster_requirements(NEEDS), [source], needs=NEEDS, scope=SCOPE)
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


def test_evidence_read_for_another_project_is_not_evidence(api: FakeQuotaApi) -> None:
    api.table[SSD] = allowance(4096 * GIB, 0)
    api.table[DISK_COUNT] = allowance(32, 5, unit="")
    other = QuotaScope(region="eu-north1", project="project-e00other")
    result = assess(cluster_requirements(NEEDS), [api.source()], needs=NEEDS, scope=other)
    assert result.verdict == "blocked-unknown"
    assert "not project-e00other" in result.lines[0].reason
    west = QuotaScope(region="eu-west1", project="project-e00test")
    result = assess(cluster_requirements(NEEDS), [api.source()], needs=NEEDS, scope=west)
    assert result.verdict == "blocked-unknown"
    assert "not eu-west1" in result.lines[0].reason


# --- the provider lookup that proves an existing disk ---------------------------------------

DISKS = "nebius.compute.v1.DiskService"


class FakeDiskApi:
    """Answers DiskService.Get from a table of disks (SDK message types, real gRPC)."""

    def __init__(self) -> None:
        from nebius.api.nebius.compute.v1 import GetDiskRequest

        self.disks: dict[str, Any] = {}
        self.asked: list[str] = []
        self.handler = grpc.method_handlers_generic_handler(
            DISKS,
            {
                "Get": grpc.unary_unary_rpc_method_handler(
                    self._get,
                    request_deserializer=GetDiskRequest.FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((self.handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def _get(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.asked.append(request.id)
        disk = self.disks.get(request.id)
        if disk is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"disk {request.id} not found")
        return disk

    def add(self, disk_id: str, project: str, gib: int, kind: str, state: str = "READY") -> None:
        from nebius.api.nebius.common.v1 import ResourceMetadata
        from nebius.api.nebius.compute.v1 import Disk, DiskSpec, DiskStatus

        self.disks[disk_id] = Disk(
            metadata=ResourceMetadata(id=disk_id, parent_id=project),
            spec=DiskSpec(size_gibibytes=gib, type=getattr(DiskSpec.DiskType, kind)),
            status=DiskStatus(state=getattr(DiskStatus.State, state), size_bytes=gib * GIB),
        )


@pytest.fixture
def disks() -> Iterator[FakeDiskApi]:
    server = FakeDiskApi()
    server.server.start()
    try:
        yield server
    finally:
        server.server.stop(0)


def test_a_disk_the_compute_api_confirms_is_proven(disks: FakeDiskApi) -> None:
    from npa.plan.evidence import check_existing
    from npa.plan.quota import ExistingDisk, NebiusDiskProof
    from npa.plan.quota_sources import NebiusDiskLookup

    disks.add("computedisk-ok", "project-e00test", 100, "NETWORK_SSD")
    disks.add("computedisk-small", "project-e00test", 50, "NETWORK_SSD")
    disks.add("computedisk-hdd", "project-e00test", 100, "NETWORK_HDD")
    disks.add("computedisk-away", "project-e00other", 100, "NETWORK_SSD")
    disks.add("computedisk-going", "project-e00test", 100, "NETWORK_SSD", state="DELETING")
    lookup = NebiusDiskLookup(endpoint=f"127.0.0.1:{disks.port}", credentials="t")

    def check(disk_id: str, scope: QuotaScope = SCOPE) -> tuple[str, str]:
        claim = ExistingDisk(
            role="agent", size_gib=100, evidence=NebiusDiskProof(nebius_disk=disk_id)
        )
        try:
            (result,) = check_existing([claim], scope, read_state=dict, read_disk=lookup.get)
        except InvalidInput as error:  # the disk is there, and it is not the claimed one
            return "refused", error.message
        return result.status, result.detail

    assert check("computedisk-ok")[0] == "proven"
    assert check("computedisk-small") == (
        "refused",
        "the --existing file: a proof must prove exactly the disks its claim names, and one "
        "proof proves one claim; existing[0] (agent: 1 x 100 GiB NETWORK_SSD): nebius disk "
        "computedisk-small, READY in project-e00test records 1 x 50 GiB NETWORK_SSD "
        "(no role recorded)",
    )
    status, why = check("computedisk-hdd")
    assert status == "refused" and "records 1 x 100 GiB NETWORK_HDD" in why, why
    assert "project-e00other" in check("computedisk-away")[1]
    assert "DELETING" in check("computedisk-going")[1]
    assert check("computedisk-none")[0] == "refuted"
    assert check("computedisk-ok", QuotaScope(region="eu-north1"))[0] == "unproven"
    assert disks.asked[:2] == ["computedisk-ok", "computedisk-small"]


def test_plan_spec_deducts_a_disk_only_the_api_proves(
    api: FakeQuotaApi, disks: FakeDiskApi, tmp_path: Any
) -> None:
    from tests.harness.cli import run_npa

    # The CLI reaches the quota API and the compute API through one endpoint: one server
    # answering both services.
    both = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    both.add_generic_rpc_handlers((api.handler, disks.handler))
    port = both.add_insecure_port("127.0.0.1:0")
    both.start()
    try:
        api.table[SSD] = allowance(4096 * GIB, 4096 * GIB - 1151 * GIB)
        api.table[DISK_COUNT] = allowance(32, 5, unit="")
        disks.add("computedisk-agent", "project-e00cli", 100, "NETWORK_SSD")
        existing = tmp_path / "existing.yaml"
        existing.write_text(
            "existing:\n"
            "  - {role: agent, size_gib: 100, evidence: {nebius_disk: computedisk-agent}}\n"
        )
        args = (
            "workbench", "workflow", "plan-spec", "examples/physical-ai.yaml", "--run-id",
            "demo-1", "--nebius-project", "project-e00cli", "--nebius-endpoint",
            f"127.0.0.1:{port}", "--existing", str(existing), "--json",
        )  # fmt: skip
        res = run_npa(*args, env={"NEBIUS_IAM_TOKEN": "cli-token"})
        assert res.code == 0, res.stdout + res.stderr
        quota = res.json()["quota"]
        assert quota["existing"][0]["status"] == "proven"
        assert quota["lines"][0]["required_new_gib"] == 1151
        # The same disk claimed for another project deducts nothing, and 1151 GiB is short.
        other = run_npa(
            *[a if a != "project-e00cli" else "project-e00else" for a in args],
            env={"NEBIUS_IAM_TOKEN": "cli-token"},
        )
        assert other.code == 1, other.stdout + other.stderr
        assert other.json()["quota"]["existing"][0]["status"] == "refuted"
    finally:
        both.stop(0)
