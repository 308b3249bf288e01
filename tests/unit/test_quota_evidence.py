"""Evidence that is not evidence never makes the quota gate say ok.

Contradictory lines, figures read for another region or project, misspelt quota names, and
existing-resource claims nobody can check are each a class: every member of it must end in
``blocked-unknown``, an input error, or "claimed, unproven" (nothing deducted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npa.core.errors import InvalidInput, Unavailable
from npa.plan.evidence import (
    DiskFacts,
    StackState,
    check_existing,
    leaving,
    state_from_deployment,
)
from npa.plan.infra import DISK_COUNT, GIB, cluster_requirements, disk_needs, known_quotas
from npa.plan.quota import (
    ExistingDisk,
    NebiusDiskProof,
    PulumiOutputProof,
    PulumiOutputRef,
    QuotaReading,
    QuotaScope,
    assess,
)
from npa.plan.quota_sources import FileQuotaSource, load_existing
from npa.spec.model import Infrastructure
from tests.harness.stackstate import agent_disk, checkpoint, node_group

pytestmark = pytest.mark.unit

SSD = "compute.disk.size.network-ssd"
NEEDS = disk_needs(Infrastructure())
REQUIREMENTS = cluster_requirements(NEEDS)
NORTH = QuotaScope(region="eu-north1", project="project-e00a")
PLENTY = 4096 * GIB


def quota_file(tmp_path: Path, body: str, name: str = "q.yaml") -> FileQuotaSource:
    path = tmp_path / name
    path.write_text(body)
    return FileQuotaSource(path)


def ample(region: str = "eu-north1", extra: str = "") -> str:
    return (
        f"region: {region}\n{extra}quotas:\n  {SSD}: {{limit: {PLENTY}, usage: 0}}\n"
        f"  {DISK_COUNT}: {{limit: 32, usage: 0}}\n"
    )


def verdict(tmp_path: Path, body: str, scope: QuotaScope = NORTH) -> Any:
    return assess(REQUIREMENTS, [quota_file(tmp_path, body)], needs=NEEDS, scope=scope)


# --- contradictory lines ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        "{unlimited: true, limit: 5, usage: 10}",
        "{unlimited: true, limit: 0}",
        f"{{unlimited: true, limit: {PLENTY}, usage: 0}}",
        "{unlimited: true, usage: -1}",
        "{limit: 5, usage: 10}",
        "{limit: -5, usage: 0}",
        "{usage: 0}",
        "{limit: 5}",
        "{unlimited: false}",
        "{}",
    ],
)
def test_contradictory_or_incomplete_lines_block_as_unknown(tmp_path: Path, entry: str) -> None:
    body = (
        f"region: eu-north1\nquotas:\n  {SSD}: {entry}\n  {DISK_COUNT}: {{limit: 32, usage: 0}}\n"
    )
    result = verdict(tmp_path, body)
    assert result.verdict == "blocked-unknown", entry
    ssd = result.lines[0]
    assert ssd.verdict == "unknown" and ssd.shortfall is None and ssd.available is None


def test_unlimited_alone_or_with_a_usage_is_not_a_contradiction(tmp_path: Path) -> None:
    for entry in ("{unlimited: true}", "{unlimited: true, usage: 12}"):
        body = (
            f"region: eu-north1\nquotas:\n  {SSD}: {entry}\n"
            f"  {DISK_COUNT}: {{limit: 9, usage: 0}}\n"
        )
        result = verdict(tmp_path, body)
        assert result.verdict == "ok" and result.lines[0].unlimited


# --- scope: region and project ---------------------------------------------------------------


def test_evidence_for_another_region_is_no_evidence(tmp_path: Path) -> None:
    result = verdict(tmp_path, ample("eu-west1"))
    assert result.verdict == "blocked-unknown"
    assert all(line.verdict == "unknown" for line in result.lines)
    assert "names region eu-west1, not eu-north1" in result.lines[0].reason
    assert result.lines[0].not_counted and result.lines[0].sources == []


def test_a_file_that_names_no_region_is_not_evidence_for_a_cloud_plan(tmp_path: Path) -> None:
    body = ample().replace("region: eu-north1\n", "")
    result = verdict(tmp_path, body)
    assert result.verdict == "blocked-unknown"
    assert "names no region" in result.lines[0].reason


def test_a_line_can_name_its_own_region_and_only_that_counts(tmp_path: Path) -> None:
    body = (
        f"region: eu-north1\nquotas:\n  {SSD}: {{limit: {PLENTY}, usage: 0, region: eu-west1}}\n"
        f"  {DISK_COUNT}: {{limit: 32, usage: 0}}\n"
    )
    result = verdict(tmp_path, body)
    assert [line.verdict for line in result.lines] == ["unknown", "ok"]


def test_evidence_for_another_project_is_no_evidence(tmp_path: Path) -> None:
    other = verdict(tmp_path, ample(extra="project: project-e00b\n"))
    assert other.verdict == "blocked-unknown"
    assert "not project-e00a" in other.lines[0].reason
    same = verdict(tmp_path, ample(extra="project: project-e00a\n"))
    assert same.verdict == "ok"
    # A plan that names no project cannot be contradicted by the file's.
    unnamed = verdict(
        tmp_path, ample(extra="project: project-e00b\n"), QuotaScope(region="eu-north1")
    )
    assert unnamed.verdict == "ok"


def test_in_scope_evidence_still_decides_when_other_evidence_is_set_aside(
    tmp_path: Path,
) -> None:
    here = quota_file(tmp_path, ample(), "here.yaml")
    there = quota_file(tmp_path, ample("us-central1").replace(f"{PLENTY}", "1"), "there.yaml")
    result = assess(REQUIREMENTS, [here, there], needs=NEEDS, scope=NORTH)
    assert result.verdict == "ok"
    assert result.lines[0].sources == ["file:here.yaml"]
    assert "us-central1" in result.lines[0].not_counted[0]


def test_the_local_target_counts_only_readings_for_no_region(tmp_path: Path) -> None:
    class Cloudy:
        name = "cloudy"

        def read(self, names: Any) -> list[QuotaReading]:
            return [
                QuotaReading(source="cloudy", name=n, limit=10, usage=0, region="x") for n in names
            ]

    result = assess(REQUIREMENTS, [Cloudy()], needs=NEEDS)
    assert result.verdict == "blocked-unknown"


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("compute.disk.size.network_ssd", SSD),
        ("compute.disk.size.networkssd", SSD),
        ("compute.disks.count", DISK_COUNT),
        ("local.store.sizes", "local.store.size"),
        ("gpus", None),
    ],
)
def test_a_misspelt_quota_name_is_an_input_error_with_a_suggestion(
    tmp_path: Path, name: str, suggestion: str | None
) -> None:
    with pytest.raises(InvalidInput) as caught:
        quota_file(tmp_path, f"region: eu-north1\nquotas:\n  {name}: {{limit: 1, usage: 0}}\n")
    message = caught.value.message
    assert repr(name) in message and "npa knows:" in message
    if suggestion:
        assert f"did you mean {suggestion!r}" in message
    else:
        assert "did you mean" not in message
    assert caught.value.details["known"] == known_quotas()


@pytest.mark.parametrize(
    "body",
    [
        "region: 5\nquotas: {}\n",
        "project: [a]\nquotas: {}\n",
        "source: ''\nquotas: {}\n",
        "quotas:\n  compute.disk.count: {limit: 1, usage: 0, region: 7}\n",
        "quotas:\n  compute.disk.count: {limit: '1', usage: 0}\n",
        "quotas:\n  compute.disk.count: {limit: 1.5, usage: 0}\n",
        "quotas:\n  compute.disk.count: {limit: true, usage: 0}\n",
        "quotas:\n  compute.disk.count: {limit: 1, usage: 0, unlimited: 'yes'}\n",
        "quotas:\n  compute.disk.count: {limit: 1, usage: 0, colour: red}\n",
        "quotas:\n  compute.disk.count: [1, 0]\n",
        "regions: eu-north1\nquotas: {}\n",
        "quotas: []\n",
        "- a\n",
    ],
)
def test_malformed_quota_files_are_input_errors(tmp_path: Path, body: str) -> None:
    with pytest.raises(InvalidInput):
        quota_file(tmp_path, body)


# --- existing resources ----------------------------------------------------------------------


def claim(evidence: Any, size: int = 100) -> ExistingDisk:
    return ExistingDisk(role="agent", size_gib=size, evidence=evidence)


def states_of(stacks: dict[str, StackState]) -> Any:
    asked: list[str] = []

    def read(ref: PulumiOutputRef) -> StackState | None:
        asked.append(ref.stack)
        if ref.stack == "broken":
            raise Unavailable("the state backend cannot be read")
        return stacks.get(ref.stack)

    read.asked = asked  # type: ignore[attr-defined]
    return read


def pulumi(stack: str, output: str, value: str | None = None) -> PulumiOutputProof:
    return PulumiOutputProof(pulumi=PulumiOutputRef(stack=stack, output=output, value=value))


AGENT = agent_disk("npa-a", "computedisk-1", 100)
RECORD = {"id": "computedisk-9", "role": "agent", "size_gib": 100, "disk_type": "NETWORK_SSD"}
STACKS = {
    "npa-a": StackState(
        outputs={
            "agent_boot_disk_id": "computedisk-1",
            "agent_disk": RECORD,
            "empty": "",
            "pw": "[secret]",
        },
        resources=[AGENT],
    )
}


@pytest.mark.parametrize(
    ("evidence", "status"),
    [
        ("trust me", "unproven"),
        ("pulumi stack npa-a output agent_boot_disk_id=computedisk-1", "unproven"),
        (pulumi("npa-a", "agent_boot_disk_id"), "proven"),
        (pulumi("npa-a", "agent_boot_disk_id", "computedisk-1"), "proven"),
        (pulumi("npa-a", "agent_disk"), "proven"),
        (PulumiOutputProof(pulumi=PulumiOutputRef(stack="npa-a", resource="agent-boot-disk")),
         "proven"),
        (pulumi("npa-a", "agent_boot_disk_id", "computedisk-2"), "refuted"),
        (pulumi("npa-a", "pw"), "unproven"),
        (pulumi("npa-a", "pw", "hunter2"), "unproven"),
        (pulumi("npa-a", "empty"), "refuted"),
        (pulumi("npa-a", "nothing"), "refuted"),
        (pulumi("npa-b", "agent_boot_disk_id"), "refuted"),
        (pulumi("broken", "agent_boot_disk_id"), "unavailable"),
        (NebiusDiskProof(nebius_disk="computedisk-1"), "unavailable"),  # no API client given
    ],
)  # fmt: skip
def test_only_a_proof_npa_checked_is_deducted(evidence: Any, status: str) -> None:
    available = 1151  # exactly what is left to create once the agent's 100 GiB exist
    (check,) = check_existing([claim(evidence)], NORTH, read_state=states_of(STACKS))
    assert check.status == status, check.detail
    source = FixedSource({SSD: (available * GIB, 0), DISK_COUNT: (2, 0)})
    result = assess(REQUIREMENTS, [source], needs=NEEDS, existing=[check], scope=NORTH)
    if status == "proven":
        assert result.verdict == "ok" and result.lines[0].existing_gib == 100
    else:
        assert "not deducted" in check.detail
        assert result.verdict == "blocked" and result.lines[0].existing == 0


class FixedSource:
    name = "fixed"

    def __init__(self, figures: dict[str, tuple[int, int]]) -> None:
        self.figures = figures

    def read(self, names: Any) -> list[QuotaReading]:
        return [
            QuotaReading(source=self.name, name=n, limit=lim, usage=use, region="eu-north1")
            for n, (lim, use) in self.figures.items()
            if n in names
        ]


def test_a_stack_is_read_once_however_often_it_is_named() -> None:
    read = states_of(STACKS)
    claims = [claim(pulumi("npa-a", "agent_boot_disk_id")), claim(pulumi("npa-a", "pw"))]
    checks = check_existing(claims, NORTH, read_state=read)
    assert [c.status for c in checks] == ["proven", "unproven"]
    assert read.asked == ["npa-a"]


@pytest.mark.parametrize(
    ("claimed", "evidence", "why"),
    [
        # The agent disk's id does not prove GPU node disks, nor two agent disks.
        ({"role": "gpu_node", "size_gib": 100}, pulumi("npa-a", "agent_boot_disk_id"),
         "records agent: 1 x 100 GiB NETWORK_SSD"),
        ({"role": "agent", "size_gib": 100, "count": 2}, pulumi("npa-a", "agent_disk"),
         "records agent: 1 x 100 GiB NETWORK_SSD"),
        ({"role": "agent", "size_gib": 101}, pulumi("npa-a", "agent_boot_disk_id"),
         "records agent: 1 x 100 GiB NETWORK_SSD"),
        ({"role": "agent", "size_gib": 100, "disk_type": "NETWORK_HDD"},
         pulumi("npa-a", "agent_boot_disk_id"), "records agent: 1 x 100 GiB NETWORK_SSD"),
        # An output that is an id of nothing in the state, or of something holding no disk.
        ({"role": "agent", "size_gib": 100}, pulumi("npa-c", "disk_id"),
         "no resource with that id"),
        ({"role": "agent", "size_gib": 100}, pulumi("npa-c", "cluster_id"),
         "records no disk size and count"),
        ({"role": "agent", "size_gib": 100}, pulumi("npa-c", "half"),
         "must have exactly id, role, size_gib and disk_type"),
    ],
)  # fmt: skip
def test_a_proof_of_other_disks_is_refused(
    claimed: dict[str, Any], evidence: Any, why: str
) -> None:
    stacks = {
        **STACKS,
        "npa-c": StackState(
            outputs={"disk_id": "computedisk-404", "cluster_id": "mk8s-1", "half": {"id": "x"}},
            resources=[{"urn": "urn:pulumi:c::npa::nebius:index/mk8sV1Cluster:Mk8sV1Cluster::"
                        "cluster", "type": "nebius:index/mk8sV1Cluster:Mk8sV1Cluster",
                        "id": "mk8s-1", "outputs": {}}],
        ),
    }  # fmt: skip
    with pytest.raises(InvalidInput) as caught:
        check_existing(
            [ExistingDisk.model_validate({**claimed, "evidence": evidence})],
            NORTH,
            read_state=states_of(stacks),
            origin="existing.yaml",
        )
    error = caught.value
    assert error.message.startswith("existing.yaml: ") and "existing[0] (" in error.message
    assert why in error.message, error.message
    assert error.fix is not None and error.fix.startswith(
        "${EDITOR:-vi} existing.yaml  # existing[0]: "
    )
    assert error.details["refused"][0]["claim"] == "existing[0]"


def test_one_proof_proves_one_claim_whatever_cites_it() -> None:
    # The same disk through the same output, through its resource, and through its id at the
    # provider: the first claim is proven, every later one refused.
    def disk(disk_id: str) -> DiskFacts | None:
        return DiskFacts(disk_id, "project-e00a", 100 * GIB, "NETWORK_SSD", "READY")

    by_resource = PulumiOutputRef(stack="npa-a", resource=AGENT["urn"])
    cited = [
        pulumi("npa-a", "agent_boot_disk_id"),
        pulumi("npa-a", "agent_boot_disk_id"),
        PulumiOutputProof(pulumi=by_resource),
        NebiusDiskProof(nebius_disk="computedisk-1"),
    ]
    with pytest.raises(InvalidInput) as caught:
        check_existing(
            [claim(e) for e in cited], NORTH, read_state=states_of(STACKS), read_disk=disk
        )
    refused = caught.value.details["refused"]
    assert [r["claim"] for r in refused] == ["existing[1]", "existing[2]", "existing[3]"]
    assert all("already proves existing[0]" in r["why"] for r in refused)
    # Two claims of one disk each, from a list output of two disks, is one claim too many:
    # the output records two disks, so it proves a claim of two.
    two = [dict(RECORD, id="d1"), dict(RECORD, id="d2")]
    state = {"s": StackState(outputs={"disks": two})}
    pair = ExistingDisk(role="agent", size_gib=100, count=2, evidence=pulumi("s", "disks"))
    (check,) = check_existing([pair], NORTH, read_state=states_of(state))
    assert check.status == "proven"
    with pytest.raises(InvalidInput):
        check_existing([claim(pulumi("s", "disks"))] * 2, NORTH, read_state=states_of(state))


def test_a_provider_lookup_checks_project_size_type_and_state() -> None:
    def disk(disk_id: str) -> DiskFacts | None:
        table = {
            "ok": DiskFacts("ok", "project-e00a", 100 * GIB, "NETWORK_SSD", "READY"),
            "big": DiskFacts("big", "project-e00a", 101 * GIB, "NETWORK_SSD", "READY"),
            "hdd": DiskFacts("hdd", "project-e00a", 100 * GIB, "NETWORK_HDD", "READY"),
            "new": DiskFacts("new", "project-e00a", 100 * GIB, "NETWORK_SSD", "CREATING"),
            "away": DiskFacts("away", "project-e00b", 100 * GIB, "NETWORK_SSD", "READY"),
        }
        if disk_id == "down":
            raise Unavailable("connection refused")
        return table.get(disk_id)

    def status(disk_id: str, count: int = 1) -> str:
        disk_claim = ExistingDisk(
            role="agent", size_gib=100, count=count, evidence=NebiusDiskProof(nebius_disk=disk_id)
        )
        try:
            (check,) = check_existing([disk_claim], NORTH, read_state=dict, read_disk=disk)
        except InvalidInput:
            return "refused"
        return check.status

    assert status("ok") == "proven"
    assert [status(d) for d in ("new", "gone", "away")] == ["refuted"] * 3
    assert status("down") == "unavailable"
    # One id proves one disk, of the size and type it has: the same rule as a stack's state.
    assert [status("big"), status("hdd"), status("ok", count=2)] == ["refused"] * 3


@pytest.mark.parametrize(
    "item",
    [
        "{role: agent, size_gib: '100', evidence: x}",
        "{role: agent, size_gib: 100}",
        "{role: agent, size_gib: 100, evidence: ''}",
        "{role: agent, size_gib: 100, evidence: 7}",
        "{role: agent, size_gib: 100, evidence: {pulumi: {stack: s}}}",
        "{role: agent, size_gib: 100, evidence: {pulumi: {stack: s, output: o, resource: r}}}",
        "{role: agent, size_gib: 100, evidence: {pulumi: {stack: s, output: o, colour: x}}}",
        "{role: agent, size_gib: 100, evidence: {proof: yes}}",
        "{role: agent, size_gib: 100, evidence: {nebius_disk: 'a b'}}",
        "{role: bastion, size_gib: 100, evidence: x}",
        "{role: agent, size_gib: 0, evidence: x}",
        "{role: agent, size_gib: 100, evidence: x, status: proven}",
    ],
)
def test_malformed_evidence_files_are_input_errors(tmp_path: Path, item: str) -> None:
    path = tmp_path / "existing.yaml"
    path.write_text(f"existing:\n  - {item}\n")
    with pytest.raises(InvalidInput) as caught:
        load_existing(path)
    assert "existing[0]" in caught.value.message


def test_every_problem_of_an_evidence_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "existing.yaml"
    path.write_text(
        "existing:\n  - {role: agent, size_gib: -1, evidence: x}\n"
        "  - {role: nope, size_gib: 100, evidence: {pulumi: {output: o}}}\n"
    )
    with pytest.raises(InvalidInput) as caught:
        load_existing(path)
    problems = caught.value.details["problems"]
    assert any(p.startswith("existing[0].size_gib") for p in problems)
    assert any(p.startswith("existing[1].role") for p in problems)
    assert any(p.startswith("existing[1].evidence.pulumi.stack") for p in problems)


def test_a_resource_the_state_marks_for_deletion_proves_nothing() -> None:
    # An update that replaced the GPU node group (create before delete) and was stopped before
    # the stack's outputs were written: the old group is still in the state, marked
    # ``delete: true``, and the output still holds its id. Its disks are going: nothing is
    # deducted for it, while the group that replaced it (same URN) still proves its disks.
    old = {**node_group("npa-r", "gpu", "ng-old", 2, 1023), "delete": True}
    new = node_group("npa-r", "gpu", "ng-new", 2, 1023)
    gpu = {"role": "gpu_node", "size_gib": 1023, "count": 2}
    by_name = PulumiOutputProof(pulumi=PulumiOutputRef(stack="npa-r", resource="gpu-nodes"))
    for resources, evidence, status in [
        ([old, new], pulumi("npa-r", "gpu_node_group_id"), "refuted"),
        ([old, new], by_name, "proven"),
        ([old], by_name, "refuted"),
        ([new], pulumi("npa-r", "gpu_node_group_id", "ng-new"), "refuted"),
    ]:
        state = {"npa-r": StackState({"gpu_node_group_id": "ng-old"}, resources)}
        disk = ExistingDisk.model_validate({**gpu, "evidence": evidence})
        (check,) = check_existing([disk], NORTH, read_state=states_of(state))
        assert check.status == status, (resources, check.detail)
        if status == "proven":
            assert "ng-new" in check.detail
        elif resources == [new]:
            assert "not 'ng-new'" in check.detail
        else:
            assert "for deletion" in check.detail and check.detail.endswith("not deducted")


def test_a_pending_delete_in_the_checkpoint_marks_its_resource() -> None:
    # A `pulumi destroy` stopped mid-delete leaves the disk in the state and a pending
    # "deleting" operation naming it: npa reads that disk as going.
    disk = agent_disk("npa-d", "computedisk-7", 100)
    deployment = checkpoint("npa-d", {"agent_boot_disk_id": "computedisk-7"}, [disk])
    latest = deployment["checkpoint"]["latest"]
    latest["pending_operations"] = [{"resource": dict(disk), "type": "deleting"}]
    state = state_from_deployment(latest)
    assert [leaving(r) for r in state.resources] == [False, False, True]
    (check,) = check_existing(
        [claim(pulumi("npa-d", "agent_boot_disk_id"))],
        NORTH,
        read_state=states_of({"npa-d": state}),
    )
    assert check.status == "refuted" and "for deletion" in check.detail
    # Without the pending operation the same disk proves the claim.
    latest["pending_operations"] = []
    again = state_from_deployment(latest)
    (check,) = check_existing(
        [claim(pulumi("npa-d", "agent_boot_disk_id"))],
        NORTH,
        read_state=states_of({"npa-d": again}),
    )
    assert check.status == "proven"


def test_provision_counts_no_disks_of_a_replaced_node_group() -> None:
    from npa.targets.nebius.target import existing_disks

    old = {**node_group("s", "gpu", "ng-old", 1, 512), "delete": True}
    new = node_group("s", "gpu", "ng-new", 2, 1023)
    checks = existing_disks("s", [old, new])
    assert [(c.status, c.disk.size_gib, c.disk.count) for c in checks] == [("proven", 1023, 2)]


def test_a_disk_record_must_agree_with_the_resource_its_id_names() -> None:
    # An output that records disks itself, under the id of a resource of the same state: the
    # resource decides. The agent disk's id written as a GPU node disk of 1,023 GiB proves
    # nothing; written as what the resource records, it proves the agent disk.
    wrong = {
        "id": "computedisk-1",
        "role": "gpu_node",
        "size_gib": 1023,
        "disk_type": "NETWORK_SSD",
    }
    right = dict(RECORD, id="computedisk-1")
    state = {"s": StackState(outputs={"wrong": [wrong], "right": right}, resources=[AGENT])}
    gpu = ExistingDisk(role="gpu_node", size_gib=1023, evidence=pulumi("s", "wrong"))
    with pytest.raises(InvalidInput) as caught:
        check_existing([gpu], NORTH, read_state=states_of(state))
    assert "but the state's resource with that id records agent: 1 x 100 GiB" in str(
        caught.value.message
    )
    (check,) = check_existing([claim(pulumi("s", "right"))], NORTH, read_state=states_of(state))
    assert check.status == "proven", check.detail
    gone = {"s": StackState(outputs={"right": right}, resources=[{**AGENT, "delete": True}])}
    with pytest.raises(InvalidInput, match="marks for deletion"):
        check_existing([claim(pulumi("s", "right"))], NORTH, read_state=states_of(gone))
