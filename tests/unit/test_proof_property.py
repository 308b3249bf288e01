"""Property: over any claims and any proofs they cite, a disk is deducted as existing only when
the state its proof cites records exactly that disk (role, type, size and count), and a proof
proves one claim only (an output, a resource or a disk id cited by an earlier claim proves
nothing more).

The states are data (a stack's outputs and resources, the provider's disks), so nothing starts
pulumi or asks an API. The oracle below is a second reading of docs/spec.md#existing-resources,
written without npa's evidence module: it predicts every claim's outcome (proven, refused, or
not deducted) and the bytes the quota gate may deduct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from npa.core.errors import InvalidInput
from npa.plan.evidence import DiskFacts, StackState, check_existing
from npa.plan.infra import GIB, cluster_requirements, disk_needs
from npa.plan.quota import ExistingDisk, QuotaReading, QuotaScope, assess
from npa.spec.model import Infrastructure
from tests.harness.stackstate import agent_disk, node_group, urn
from tests.tiers import examples

pytestmark = pytest.mark.unit

STACK = "npa-prop"
PROJECT = "project-e00a"
SCOPE = QuotaScope(region="eu-north1", project=PROJECT)
ROLES = ("agent", "cpu_node", "gpu_node")
TYPES = ("NETWORK_SSD", "NETWORK_HDD")
SIZES = (100, 128, 1023)
COUNTS = (1, 2, 3)
IDS = ("computedisk-a", "d1", "d2", "ng-cpu")
OUTPUTS = (
    "agent_boot_disk_id", "cpu_node_group_id", "gpu_node_group_id", "cluster_id", "stray",
    "empty", "pw", "listed", "one", "missing", "gpu_new",
)  # fmt: skip
RESOURCES = ("agent-boot-disk", "cpu-nodes", "gpu-nodes", "cluster", "nope", "URN:cpu-nodes")
NEBIUS = ("computedisk-a", "d1", "creating", "nx")

kinds = st.tuples(st.sampled_from(ROLES), st.sampled_from(TYPES), st.sampled_from(SIZES))


@st.composite
def entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A disk-record output: entries with ids that may repeat and kinds that may differ."""
    out = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        role, disk_type, size = draw(kinds)
        entry = {"id": draw(st.sampled_from(IDS)), "role": role, "size_gib": size}
        entry["disk_type"] = disk_type
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            del entry["role"]  # now and then an entry that is not a record
        out.append(entry)
    return out


@dataclass
class World:
    state: StackState
    disks: dict[str, DiskFacts]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    def pick(values: tuple[Any, ...]) -> Any:
        return draw(st.sampled_from(values))

    agent = agent_disk(STACK, "computedisk-a", pick(SIZES), pick(TYPES))
    cpu = node_group(STACK, "cpu", "ng-cpu", pick(COUNTS), pick(SIZES), pick(TYPES))
    gpu = node_group(STACK, "gpu", "ng-gpu", pick(COUNTS), pick(SIZES), pick(TYPES))
    kind = "nebius:index/mk8sV1Cluster:Mk8sV1Cluster"
    cluster = {"urn": urn(STACK, kind, "cluster"), "type": kind, "id": "cluster-1", "outputs": {}}
    resources = [agent, cpu, gpu, cluster]
    if draw(st.booleans()):
        # An update replaced the GPU group and stopped before writing the outputs: the old
        # group stays in the state marked for deletion, gpu_node_group_id still names it.
        resources[2] = {**gpu, "delete": True}
        resources.append(
            node_group(STACK, "gpu", "ng-gpu2", pick(COUNTS), pick(SIZES), pick(TYPES))
        )
    listed = draw(entries())
    one = draw(entries())
    outputs = {
        "agent_boot_disk_id": "computedisk-a",
        "cpu_node_group_id": "ng-cpu",
        "gpu_node_group_id": "ng-gpu",
        "cluster_id": "cluster-1",
        "stray": "computedisk-z",
        "empty": "",
        "pw": "[secret]",
        "listed": listed,
        "one": one[0] if one else {},
    }
    if len(resources) > 4:
        outputs["gpu_new"] = "ng-gpu2"
    disks = {}
    for disk_id in ("computedisk-a", "d1", "creating"):
        _, disk_type, size = draw(kinds)
        disks[disk_id] = DiskFacts(
            disk_id,
            draw(st.sampled_from([PROJECT, PROJECT, "project-e00b"])),
            size * GIB,
            disk_type,
            "CREATING" if disk_id == "creating" else "READY",
        )
    return World(StackState(outputs, resources), disks)


GROUP = "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup"


@st.composite
def cases(draw: st.DrawFn) -> tuple[World, list[ExistingDisk]]:
    """A world and claims on it; half the claims say what their proof records (so proofs that
    hold, and proofs used twice, are common), the others anything at all."""
    world = draw(worlds())
    out: list[ExistingDisk] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        how = draw(st.sampled_from(["output", "output", "resource", "nebius", "text"]))
        if how == "output":
            evidence: Any = {"pulumi": {"stack": STACK, "output": draw(st.sampled_from(OUTPUTS))}}
        elif how == "resource":
            name = draw(st.sampled_from(RESOURCES))
            name = urn(STACK, GROUP, "cpu-nodes") if name == "URN:cpu-nodes" else name
            evidence = {"pulumi": {"stack": STACK, "resource": name}}
        elif how == "nebius":
            evidence = {"nebius_disk": draw(st.sampled_from(NEBIUS))}
        else:
            evidence = "it is there, trust me"
        role, disk_type, size = draw(kinds)
        count = draw(st.sampled_from(COUNTS))
        probe = ExistingDisk.model_validate({"role": "agent", "size_gib": 1, "evidence": evidence})
        outcome, record, _ = expect(world, probe, cross=False)
        if outcome == "resolved" and record and len(record) == 1 and draw(st.booleans()):
            recorded_role, disk_type, size, count = record[0]
            role = recorded_role or role
        out.append(
            ExistingDisk.model_validate(
                {"role": role, "disk_type": disk_type, "size_gib": size, "count": count,
                 "evidence": evidence}
            )
        )  # fmt: skip
    return world, out


# --- the oracle --------------------------------------------------------------------------------

Kind = tuple[str | None, str, int, int]  # role (None: not recorded), type, GiB, count


def from_resource(resource: dict[str, Any]) -> tuple[Kind | None, set[str]]:
    """What one resource says, read the way docs/spec.md describes npa's nebius stack."""
    name = resource["urn"].split("::")[-1]
    out = resource["outputs"]
    keys = {"resource:" + resource["urn"], "id:" + resource["id"]}
    if name == "agent-boot-disk":
        return ("agent", out["type"], out["sizeGibibytes"], 1), keys
    if name in ("cpu-nodes", "gpu-nodes"):
        boot = out["template"]["bootDisk"]
        role = name.split("-")[0] + "_node"
        return (role, boot["type"], boot["sizeGibibytes"], out["fixedNodeCount"]), keys
    return None, keys


def from_entries(value: Any) -> tuple[list[Kind] | None, set[str]]:
    items = value if isinstance(value, list) else [value]
    ids = [e.get("id") for e in items]
    if any(set(e) != {"id", "role", "size_gib", "disk_type"} for e in items) or len(
        set(ids)
    ) != len(ids):
        return None, set()
    kinds_seen: dict[tuple[str, str, int], int] = {}
    for e in items:
        key = (e["role"], e["disk_type"], e["size_gib"])
        kinds_seen[key] = kinds_seen.get(key, 0) + 1
    return [(r, t, s, n) for (r, t, s), n in kinds_seen.items()], {"id:" + i for i in ids}


def expect(
    world: World, claim: ExistingDisk, cross: bool = True
) -> tuple[str, list[Kind] | None, set[str]]:
    """(outcome, what the cited state records, identities) for one claim, before reuse:
    outcome is ``resolved`` (compare the record), ``refused`` or ``absent``. Without ``cross``
    a record's entries are not checked against the state's resources (so the cases can write
    claims that match a record the state contradicts)."""
    ev: Any = claim.evidence
    if isinstance(ev, str):
        return "absent", None, set()
    if hasattr(ev, "nebius_disk"):
        facts = world.disks.get(ev.nebius_disk)
        if facts is None or facts.state != "READY" or facts.project != PROJECT:
            return "absent", None, set()
        kind = (None, facts.disk_type, facts.size_bytes // GIB, 1)
        return "resolved", [kind], {"id:" + ev.nebius_disk}
    ref = ev.pulumi
    # A resource marked for deletion is going: citing it is citing nothing.
    staying = [r for r in world.state.resources if not r.get("delete")]
    going = {r["id"] for r in world.state.resources if r.get("delete")}
    by_id = {r["id"]: r for r in staying}
    if ref.resource is not None:
        found = [r for r in staying if ref.resource in (r["urn"], r["urn"].split("::")[-1])]
        if not found:
            return "absent", None, set()
        kind, keys = from_resource(found[0])
        return ("resolved", [kind], keys) if kind else ("refused", None, set())
    if ref.output not in world.state.outputs:
        return "absent", None, set()
    value = world.state.outputs[ref.output]
    if value in ("", [], {}) or value == "[secret]":
        return "absent", None, set()
    here = {f"output:{ref.output}"}
    if isinstance(value, str):
        if value in going:
            return "absent", None, set()
        if value not in by_id:
            return "refused", None, set()
        kind, keys = from_resource(by_id[value])
        return ("resolved", [kind], keys | here) if kind else ("refused", None, set())
    listed, keys = from_entries(value)
    if not listed:
        return "refused", None, set()
    # An entry whose id is a resource of the same state must say what that resource records.
    items = (value if isinstance(value, list) else [value]) if cross else []
    for entry in items:
        if entry["id"] in going:
            return "refused", None, set()
        if entry["id"] in by_id:
            kind, _ = from_resource(by_id[entry["id"]])
            if kind != (entry["role"], entry["disk_type"], entry["size_gib"], 1):
                return "refused", None, set()
    return "resolved", listed, keys | here


def exactly(record: list[Kind], claim: ExistingDisk) -> bool:
    if len(record) != 1:
        return False
    role, disk_type, size, count = record[0]
    return (role in (None, claim.role)) and (disk_type, size, count) == (
        claim.disk_type.value,
        claim.size_gib,
        claim.count,
    )


def oracle(world: World, claimed: list[ExistingDisk]) -> list[str]:
    """Each claim's outcome: proven, refused or not-deducted (in order, reuse counted)."""
    used: set[str] = set()
    outcomes = []
    for claim in claimed:
        outcome, record, keys = expect(world, claim)
        if outcome == "resolved":
            assert record is not None
            outcome = "refused" if keys & used or not exactly(record, claim) else "proven"
            used |= keys
        outcomes.append({"absent": "not-deducted"}.get(outcome, outcome))
    return outcomes


class Plenty:
    name = "plenty"

    def read(self, names: Any) -> list[QuotaReading]:
        return [
            QuotaReading(source=self.name, name=n, limit=2**50, usage=0, region="eu-north1")
            for n in names
        ]


@settings(max_examples=examples(300), deadline=None)
@given(case=cases())
def test_a_disk_is_deducted_only_when_its_cited_state_records_exactly_it(
    case: tuple[World, list[ExistingDisk]],
) -> None:
    world, claimed = case
    want = oracle(world, claimed)
    try:
        checks = check_existing(
            claimed,
            SCOPE,
            read_state=lambda ref: world.state if ref.stack == STACK else None,
            read_disk=world.disks.get,
            origin="existing.yaml",
        )
    except InvalidInput as error:
        refused = [r["claim"] for r in error.details["refused"]]
        assert refused == [f"existing[{i}]" for i, o in enumerate(want) if o == "refused"]
        assert error.fix is not None and error.fix.startswith("${EDITOR:-vi} existing.yaml  # ")
        event("refused")
        return
    assert "refused" not in want, (want, [c.detail for c in checks])
    got = ["proven" if c.status == "proven" else "not-deducted" for c in checks]
    assert got == want, [c.detail for c in checks]
    event(f"{got.count('proven')} proven")

    # What the quota gate deducts is exactly the proven claims (or nothing, when the claims
    # do not fit the plan's disks).
    needs = disk_needs(
        Infrastructure.model_validate(
            {"cpu_nodes": {"count": 3}, "gpu_nodes": {"count": 3}, "region": "eu-north1"}
        )
    )
    result = assess(cluster_requirements(needs), [Plenty()], needs=needs, existing=checks)
    proven = [c.disk for c in checks if c.status == "proven"]
    for line in result.lines:
        if line.name.startswith("compute.disk.size."):
            kind = line.name.removeprefix("compute.disk.size.").upper().replace("-", "_")
            expected = sum(d.count * d.size_gib * GIB for d in proven if d.disk_type.value == kind)
        else:
            expected = sum(d.count for d in proven)
        assert line.existing in (0, expected), (line, proven)
        if not any("existing" in p for p in result.problems):
            assert line.existing == expected, (line, proven)
