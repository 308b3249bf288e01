"""Quota arithmetic: the figures the gate prints are exact, and unknown evidence never passes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from npa.core.errors import InvalidInput, Unavailable
from npa.core.layout import wave_count
from npa.plan.dag import levels, topological_order
from npa.plan.evidence import StackState, check_existing
from npa.plan.infra import (
    DISK_COUNT,
    GIB,
    LOCAL_STORE_SIZE,
    cluster_requirements,
    disk_needs,
    local_requirements,
)
from npa.plan.model import build_plan
from npa.plan.quota import (
    ExistingCheck,
    ExistingDisk,
    PulumiOutputRef,
    QuotaReading,
    QuotaScope,
    assess,
)
from npa.plan.quota_sources import FileQuotaSource, LocalStoreSource, load_existing
from npa.spec.model import DiskType, Infrastructure, Workflow
from tests.harness.stackstate import agent_disk
from tests.unit.specdata import base_spec

pytestmark = pytest.mark.unit

SSD = "compute.disk.size.network-ssd"
WHOLE_PATH_BYTES = 1_343_251_021_824  # 1,251 GiB
NEEDS = disk_needs(Infrastructure())
REQUIREMENTS = cluster_requirements(NEEDS)


class Fixed:
    """A quota source that answers from a dict (or fails)."""

    def __init__(self, name: str, readings: dict[str, tuple[int, int]], *, fail: bool = False):
        self._name = name
        self.readings = readings
        self.fail = fail

    @property
    def name(self) -> str:
        return self._name

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        if self.fail:
            raise Unavailable("connection refused")
        return [
            QuotaReading(source=self.name, name=n, limit=lim, usage=use)
            for n, (lim, use) in self.readings.items()
            if n in names
        ]


def with_available(ssd_gib: int, disks: int = 10, name: str = "f") -> Fixed:
    limit = 4096 * GIB
    return Fixed(name, {SSD: (limit, limit - ssd_gib * GIB), DISK_COUNT: (32, 32 - disks)})


def line(assessment, name: str):  # type: ignore[no-untyped-def]
    return next(x for x in assessment.lines if x.name == name)


def test_default_whole_path_needs_1251_gib() -> None:
    assert [(n.role, n.count, n.size_gib, n.disk_type) for n in NEEDS] == [
        ("agent", 1, 100, DiskType.NETWORK_SSD),
        ("cpu_node", 1, 128, DiskType.NETWORK_SSD),
        ("gpu_node", 1, 1023, DiskType.NETWORK_SSD),
    ]
    assert WHOLE_PATH_BYTES == 1251 * 2**30
    assert [(r.name, r.unit, r.required) for r in REQUIREMENTS] == [
        (SSD, "bytes", WHOLE_PATH_BYTES),
        (DISK_COUNT, "count", 3),
    ]


def test_21_gib_available_is_blocked_with_a_1230_gib_shortfall() -> None:
    result = assess(REQUIREMENTS, [with_available(21)], needs=NEEDS)
    assert result.verdict == "blocked"
    ssd = line(result, SSD)
    assert ssd.verdict == "blocked"
    assert (ssd.required, ssd.required_gib) == (WHOLE_PATH_BYTES, 1251)
    assert (ssd.available, ssd.available_gib) == (22_548_578_304, 21)
    assert (ssd.shortfall, ssd.shortfall_gib) == (1_320_702_443_520, 1230)
    count = line(result, DISK_COUNT)
    assert (count.required, count.available, count.shortfall, count.verdict) == (3, 10, 0, "ok")


def proven(*claims: ExistingDisk) -> list[ExistingCheck]:
    return [ExistingCheck(disk=c, status="proven", detail="read back") for c in claims]


def test_existing_agent_disk_is_deducted() -> None:
    existing = proven(ExistingDisk(role="agent", size_gib=100, evidence="stack output agentDisk"))
    result = assess(REQUIREMENTS, [with_available(21)], needs=NEEDS, existing=existing)
    ssd = line(result, SSD)
    assert (ssd.existing, ssd.existing_gib) == (107_374_182_400, 100)
    assert (ssd.required_new, ssd.required_new_gib) == (1_235_876_839_424, 1151)
    assert (ssd.shortfall, ssd.shortfall_gib) == (1_213_328_261_120, 1130)
    assert line(result, DISK_COUNT).required_new == 2
    ok = assess(REQUIREMENTS, [with_available(1151)], needs=NEEDS, existing=existing)
    assert ok.verdict == "ok" and line(ok, SSD).shortfall == 0
    short_by_one_byte = Fixed("f", {SSD: (1151 * GIB - 1, 0), DISK_COUNT: (2, 0)})
    edge = assess(REQUIREMENTS, [short_by_one_byte], needs=NEEDS, existing=existing)
    assert edge.verdict == "blocked"
    assert (line(edge, SSD).shortfall, line(edge, SSD).shortfall_gib) == (1, 1)
    assert line(edge, SSD).available_gib == 1150


def test_disk_count_is_a_separate_quota() -> None:
    result = assess(REQUIREMENTS, [with_available(2000, disks=2)], needs=NEEDS)
    assert line(result, SSD).verdict == "ok"
    count = line(result, DISK_COUNT)
    assert (count.verdict, count.shortfall, count.required_gib) == ("blocked", 1, None)
    assert result.verdict == "blocked"


@pytest.mark.parametrize(
    ("sources", "why"),
    [
        ([], "no source reported"),
        ([Fixed("down", {}, fail=True)], "unavailable: connection refused"),
        ([Fixed("f", {SSD: (10 * GIB, 11 * GIB), DISK_COUNT: (5, 1)})], "above its limit"),
        ([Fixed("f", {SSD: (-1, 0), DISK_COUNT: (5, 1)})], "negative"),
        ([Fixed("f", {SSD: (5000 * GIB, -GIB), DISK_COUNT: (5, 1)})], "negative"),
        ([with_available(2000, name="a"), with_available(1999, name="b")], "disagree"),
        ([with_available(2000), Fixed("down", {}, fail=True)], "unavailable"),
    ],
)
def test_unknown_or_contradictory_evidence_is_never_ok(sources: list[Fixed], why: str) -> None:
    result = assess(REQUIREMENTS, sources, needs=NEEDS)
    assert result.verdict == "blocked-unknown"
    ssd = line(result, SSD)
    assert ssd.verdict == "unknown" and ssd.shortfall is None
    assert why in ssd.reason
    assert any(why in p for p in result.problems)


def test_agreeing_sources_are_fine() -> None:
    result = assess(REQUIREMENTS, [with_available(2000, name="a"), with_available(2000, name="b")])
    assert result.verdict == "ok"
    assert line(result, SSD).sources == ["a", "b"]


@pytest.mark.parametrize(
    "claim",
    [
        ExistingDisk(role="agent", size_gib=50, evidence="x"),
        ExistingDisk(role="agent", size_gib=100, count=2, evidence="x"),
        ExistingDisk(role="agent", size_gib=100, disk_type=DiskType.NETWORK_HDD, evidence="x"),
    ],
)
def test_existing_claims_that_do_not_match_the_plan_are_unknown(claim: ExistingDisk) -> None:
    result = assess(REQUIREMENTS, [with_available(2000)], needs=NEEDS, existing=proven(claim))
    assert result.verdict == "blocked-unknown"
    assert all(x.existing == 0 for x in result.lines)


def test_existing_claims_need_evidence() -> None:
    with pytest.raises(ValueError):
        ExistingDisk(role="agent", size_gib=100, evidence="")


def test_file_source(tmp_path: Path) -> None:
    f = tmp_path / "q.yaml"
    f.write_text(
        f"quotas:\n  {SSD}: {{limit: {2048 * GIB}, usage: {2027 * GIB}}}\n"
        f"  {DISK_COUNT}: {{limit: 32, usage: 5}}\n"
    )
    result = assess(REQUIREMENTS, [FileQuotaSource(f)], needs=NEEDS)
    assert line(result, SSD).shortfall_gib == 1230
    assert line(result, SSD).sources == ["file:q.yaml"]
    for bad in ("quotas: []\n", f"quotas:\n  {SSD}: {{limit: 1.5}}\n", "quota: {}\n", "a: [\n"):
        f.write_text(bad)
        with pytest.raises(InvalidInput):
            FileQuotaSource(f)
    with pytest.raises(InvalidInput):
        FileQuotaSource(tmp_path / "missing.yaml")


def test_example_quota_files_give_the_documented_verdicts() -> None:
    scope = QuotaScope(region="eu-north1")
    blocked = assess(
        REQUIREMENTS,
        [FileQuotaSource(Path("examples/quota-21gib.yaml"))],
        needs=NEEDS,
        scope=scope,
    )
    assert (blocked.verdict, line(blocked, SSD).shortfall_gib) == ("blocked", 1230)
    claims = load_existing(Path("examples/existing-agent.yaml"))

    def stack_state(ref: PulumiOutputRef) -> StackState:
        assert (ref.stack, ref.output) == ("npa-physai-nebius", "agent_boot_disk_id")
        disk = agent_disk(ref.stack, "computedisk-e00example", 100)
        return StackState({"agent_boot_disk_id": "computedisk-e00example"}, [disk])

    existing = check_existing(claims, scope, read_state=stack_state)
    ok = assess(
        REQUIREMENTS,
        [FileQuotaSource(Path("examples/quota-ample.yaml"))],
        needs=NEEDS,
        existing=existing,
        scope=scope,
    )
    assert ok.verdict == "ok" and line(ok, SSD).required_new_gib == 1151


def test_local_source_reports_free_disk_of_the_nearest_existing_parent(tmp_path: Path) -> None:
    import os

    store = tmp_path / "not" / "yet" / "store"
    source = LocalStoreSource(store)
    (reading,) = source.read([LOCAL_STORE_SIZE])
    st = os.statvfs(tmp_path)
    assert reading.limit is not None and reading.usage is not None
    free = reading.limit - reading.usage
    # Free space moves as other processes write; it must match statvfs closely.
    assert abs(free - st.f_bavail * st.f_frsize) < 64 * 1024 * 1024
    assert not store.exists() and not (tmp_path / "not").exists()
    assert source.read([SSD]) == []


def test_local_target_requirement_and_verdict(tmp_path: Path) -> None:
    workflow = Workflow.model_validate(base_spec())
    assert local_requirements(workflow)[0].required == 0
    spec = base_spec()
    spec["stages"][1]["resources"]["disk_gib"] = 3  # 4 shards at once
    spec["stages"][0]["resources"] = {"disk_gib": 2}
    (req,) = local_requirements(Workflow.model_validate(spec))
    assert req.required == 14 * GIB
    result = assess([req], [LocalStoreSource(tmp_path)])
    assert result.verdict in {"ok", "blocked"}  # real disk: either, but never unknown
    huge = assess([req.model_copy(update={"required": 2**62})], [LocalStoreSource(tmp_path)])
    assert huge.verdict == "blocked"


def test_dag_order_levels_and_waves() -> None:
    spec = base_spec()
    spec["stages"].reverse()
    workflow = Workflow.model_validate(spec)
    order = topological_order(workflow)
    assert order == ["curate", "augment", "evaluate"]
    assert levels(workflow, order) == {"curate": 0, "augment": 1, "evaluate": 2}
    assert (wave_count(10, 4), wave_count(8, 4), wave_count(1, 1)) == (3, 2, 1)
    plan = build_plan(workflow, "run-1")
    augment = plan.stages[1]
    assert (augment.waves.shards, augment.waves.parallel, augment.waves.waves) == (10, 4, 3)
    assert augment.inputs[0].uri == (
        "s3://bucket/workflows/demo/run-1/npa-workflow/stages/curate/outputs/curated/clips/"
    )
    assert plan.run_prefix == "s3://bucket/workflows/demo/run-1"
    assert augment.resources.accelerator == "H100" and augment.resources.accelerator_count == 8


@pytest.mark.parametrize("run_id", ["../x", "a/b", "", ".hidden"])
def test_run_ids_that_could_escape_are_refused(run_id: str) -> None:
    with pytest.raises(InvalidInput):
        build_plan(Workflow.model_validate(base_spec()), run_id)
