"""Property: mutate a valid spec, quota file and evidence file any way at all, and plan-spec
never shows a traceback, answers bad input with exit 2, and never says ok unless the quota
evidence, checked here by an independent oracle, is complete, consistent, for the plan's region
and sufficient on its own (no claim in these files is provable, so nothing is deducted).

The bulk runs the real command in process (typer's runner: the same parsing, service and exit
code as the console script); a sample of the same inputs goes through a real process in
tests/integration/test_gates_console.py.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from npa.plan.infra import GIB, cluster_requirements, disk_needs, known_quotas
from npa.spec.model import Workflow
from npa.spec.validate import validate_text
from tests.harness.stackstate import agent_disk, node_group
from tests.tiers import examples
from tests.unit.specdata import base_spec, doc_paths

pytestmark = pytest.mark.unit

SSD = "compute.disk.size.network-ssd"
COUNT = "compute.disk.count"
REGION = "eu-north1"
ROLES = ("agent", "cpu_node", "gpu_node")
DISK_TYPES = ("NETWORK_SSD", "NETWORK_HDD", "NETWORK_SSD_NON_REPLICATED", "NETWORK_SSD_IO_M3")


def valid_quota() -> dict[str, Any]:
    return {
        "source": "review",
        "region": REGION,
        "quotas": {
            SSD: {"limit": 4096 * GIB, "usage": 1024 * GIB},
            COUNT: {"limit": 32, "usage": 5},
        },
    }


def valid_existing() -> dict[str, Any]:
    return {
        "existing": [
            {"role": "agent", "size_gib": 100, "evidence": "trust me"},
            {
                "role": "cpu_node",
                "size_gib": 128,
                "evidence": {"pulumi": {"stack": "npa-none", "output": "cpu_node_group_id"}},
            },
        ]
    }


NEAR = [
    0, 1, -1, 5, 10, 32, 2**31, 4096 * GIB, -GIB, 1.5, 2.0, True, False, None, "", "5", "x",
    "eu-north1", "eu-west1", "us-central1", "project-e00a", "NETWORK_HDD", "agent", "gpu_node",
    SSD, COUNT, "compute.disk.size.network_ssd", "local.store.size", [], {}, {"unlimited": True},
    {"unlimited": True, "limit": 5, "usage": 10}, {"limit": 5, "usage": 10}, {"usage": 0},
]  # fmt: skip
KEYS = [
    "limit", "usage", "unlimited", "region", "project", "source", "quotas", "colour", SSD, COUNT,
    "compute.disk.size.network-hdd", "compute.disks.count", "role", "size_gib", "count",
    "disk_type", "evidence", "pulumi", "nebius_disk", "stack", "output", "resource", "value",
    "backend",
]  # fmt: skip
scalars = st.one_of(
    st.sampled_from(NEAR), st.integers(min_value=-(2**64), max_value=2**64), st.text(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=5,
)


@st.composite
def mutated(draw: st.DrawFn, original: dict[str, Any], most: int = 3) -> dict[str, Any]:
    doc = copy.deepcopy(original)
    for _ in range(draw(st.integers(min_value=0, max_value=most))):
        path = draw(st.sampled_from(doc_paths(doc)))
        parent: Any = doc
        for part in path[:-1]:
            parent = parent[part]
        target = parent[path[-1]] if path else doc
        action = draw(st.sampled_from(["replace", "delete", "add", "rename"]))
        if action == "replace" and path:
            # A copy: NEAR's lists and dicts are shared by every example, and a later "add"
            # would change them for the next one (hypothesis then sees data drawn differently).
            parent[path[-1]] = copy.deepcopy(draw(values))
        elif action == "delete" and path and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(target, dict):
            target[draw(st.sampled_from(KEYS))] = copy.deepcopy(draw(values))
        elif action == "rename" and path and isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS))] = parent.pop(path[-1])
    return doc


@st.composite
def quota_mutations(draw: st.DrawFn) -> dict[str, Any]:
    """Changes that keep a quota file well formed but make its evidence wrong in the ways the
    gate must notice (contradiction, another region, a missing line, too little), then any
    change at all."""
    doc = valid_quota()
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        name = draw(st.sampled_from([SSD, COUNT]))
        entry = doc["quotas"].get(name)
        change = draw(
            st.sampled_from(
                ["contradict", "unlimited", "region", "line-region", "drop", "over", "short"]
            )
        )
        if change == "region":
            doc["region"] = draw(st.sampled_from(["eu-west1", "us-central1"]))
        elif change == "drop":
            doc["quotas"].pop(name, None)
        elif not isinstance(entry, dict):
            continue
        elif change == "contradict":
            entry["unlimited"] = True
        elif change == "unlimited":
            doc["quotas"][name] = {"unlimited": True}
        elif change == "line-region":
            entry["region"] = draw(st.sampled_from(["eu-west1", REGION]))
        elif change == "over" and _int(entry.get("limit")):
            entry["usage"] = entry["limit"] + draw(st.integers(min_value=1, max_value=GIB))
        elif change == "short" and _int(entry.get("usage")):
            entry["limit"] = entry["usage"] + draw(st.integers(min_value=0, max_value=2000 * GIB))
    return draw(mutated(doc, most=2))


def cluster_spec() -> dict[str, Any]:
    """A valid spec with a cluster shape (what the quota is computed from)."""
    spec = base_spec()
    spec["infrastructure"] = {
        "context": "test-ctx",
        "region": REGION,
        "agent": {"disk_gib": 100},
        "cpu_nodes": {"count": 1, "disk_gib": 128},
        "gpu_nodes": {"count": 1, "disk_gib": 1023},
    }
    return spec


def spec_mutations() -> st.SearchStrategy[dict[str, Any]]:
    """The spec with its cluster shape changed."""
    return mutated(cluster_spec(), most=2)


# --- the oracles ------------------------------------------------------------------------------


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def quota_input_ok(doc: Any) -> bool:
    """Whether a quota file is well formed (a separate reading of docs/spec.md)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("quotas"), dict):
        return False
    if set(doc) - {"source", "region", "project", "quotas"}:
        return False
    if any(doc.get(k) is not None and not _text(doc[k]) for k in ("source", "region", "project")):
        return False
    for name, entry in doc["quotas"].items():
        if name not in known_quotas() or not isinstance(entry, dict):
            return False
        if set(entry) - {"limit", "usage", "unlimited", "region", "project"}:
            return False
        if any(entry.get(k) is not None and not _int(entry[k]) for k in ("limit", "usage")):
            return False
        if not isinstance(entry.get("unlimited", False), bool):
            return False
        if any(entry.get(k) is not None and not _text(entry[k]) for k in ("region", "project")):
            return False
    return True


def evidence_input_ok(doc: Any) -> bool:
    items = doc.get("existing") if isinstance(doc, dict) and set(doc) == {"existing"} else doc
    if not isinstance(items, list):
        return False
    for item in items:
        if not isinstance(item, dict) or set(item) - {
            "role", "disk_type", "size_gib", "count", "evidence",
        }:  # fmt: skip
            return False
        if item.get("role") not in ROLES or item.get("disk_type", "NETWORK_SSD") not in DISK_TYPES:
            return False
        if not (_int(item.get("size_gib")) and 1 <= item["size_gib"] <= 1_048_576):
            return False
        if not (_int(item.get("count", 1)) and 1 <= item.get("count", 1) <= 1000):
            return False
        if not evidence_ok(item.get("evidence")):
            return False
    return True


def evidence_ok(evidence: Any) -> bool:
    if isinstance(evidence, str):
        return len(evidence) >= 1
    if not isinstance(evidence, dict) or len(evidence) != 1:
        return False
    if "nebius_disk" in evidence:
        disk = evidence["nebius_disk"]
        return (
            isinstance(disk, str)
            and 1 <= len(disk) <= 128
            and all(c.isascii() and (c.isalnum() or c == "-") for c in disk)
        )
    ref = evidence.get("pulumi")
    if not isinstance(ref, dict) or set(ref) - {"stack", "output", "resource", "backend", "value"}:
        return False
    for key in ("stack", "output", "resource", "backend"):
        if key not in ref or (key != "stack" and ref[key] is None):
            continue
        if not (isinstance(ref[key], str) and 1 <= len(ref[key]) <= 512):
            return False
    # It cites exactly one thing in the stack's state: an output or a resource.
    cites = [key for key in ("output", "resource") if ref.get(key) is not None]
    value = ref.get("value")
    return "stack" in ref and len(cites) == 1 and (value is None or isinstance(value, str))


def quota_supports_ok(
    doc: dict[str, Any], spec: dict[str, Any], deducted: dict[str, int] | None = None
) -> bool:
    """Every line the plan needs has one consistent, in-region figure that is enough for what
    is left to create once ``deducted`` (per quota name) is taken off."""
    infra = Workflow.model_validate(spec).infrastructure
    region = infra.region or REGION
    needed = {r.name: r.required for r in cluster_requirements(disk_needs(infra))}
    for name, required in needed.items():
        required = max(required - (deducted or {}).get(name, 0), 0)
        entry = doc["quotas"].get(name)
        if not isinstance(entry, dict) or entry.get("region", doc.get("region")) != region:
            return False
        if entry.get("unlimited") is True:
            if entry.get("limit") is not None:
                return False
            if entry.get("usage") is not None and entry["usage"] < 0:
                return False
            continue
        limit, usage = entry.get("limit"), entry.get("usage")
        if limit is None or usage is None or limit < 0 or usage < 0 or usage > limit:
            return False
        if limit - usage < required:
            return False
    return True


# --- the property ------------------------------------------------------------------------------

RUNNER = CliRunner()


def write_inputs(root: Path, spec: Any, quota: Any, existing: Any) -> list[str]:
    (root / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "quota.yaml").write_text(yaml.safe_dump(quota, sort_keys=False))
    (root / "existing.yaml").write_text(yaml.safe_dump(existing, sort_keys=False))
    return [
        "workbench", "workflow", "plan-spec", str(root / "spec.yaml"), "--run-id", "prop-1",
        "--quota-file", str(root / "quota.yaml"), "--existing", str(root / "existing.yaml"),
        "--json",
    ]  # fmt: skip


def expect(spec: Any, quota: Any, existing: Any, code: int, output: str) -> None:
    spec_ok = validate_text(yaml.safe_dump(spec, sort_keys=False))[0] is not None
    inputs_ok = spec_ok and quota_input_ok(quota) and evidence_input_ok(existing)
    if not inputs_ok:
        assert code == 2, (code, output[-800:])
        assert json.loads(output)["error"]["kind"] == "invalid_input"
        return
    assert code in (0, 1, 4), (code, output[-800:])
    result = json.loads(output)
    assert all(c["status"] != "proven" for c in result["quota"]["existing"])
    assert all(line["existing"] == 0 for line in result["quota"]["lines"])
    if code == 0:
        assert result["quota"]["verdict"] == "ok"
        assert quota_supports_ok(quota, spec), (quota, result["quota"])


inputs = st.tuples(spec_mutations(), quota_mutations(), mutated(valid_existing()))


# --- the same evidence through provision-if-absent's gate -------------------------------------


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Half the specs valid as written: the gate's verdicts are the point here.
@given(spec=st.one_of(st.just(cluster_spec()), spec_mutations()), quota=quota_mutations())
def test_provision_never_creates_on_evidence_that_is_not_evidence(
    spec: dict[str, Any], quota: Any, npa_home: Path
) -> None:
    """provision-if-absent's quota gate reads the same files: malformed ones are an input
    error (exit 2), and it never says ok unless the evidence alone supports it."""
    from npa.core.errors import InvalidInput
    from npa.core.paths import NpaPaths
    from npa.services.provision import ProvisionRequest, quota_gate

    workflow = validate_text(yaml.safe_dump(spec, sort_keys=False))[0]
    if workflow is None:
        return  # a spec provision would refuse before its gate (the property above covers it)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "quota.yaml"
        path.write_text(yaml.safe_dump(quota, sort_keys=False))
        req = ProvisionRequest(project=None, target="nebius", quota_files=[path])
        try:
            assessment = quota_gate(req, NpaPaths(npa_home), workflow.infrastructure)
        except InvalidInput as error:
            assert not quota_input_ok(quota), error.message
            assert error.exit_code == 2
            event("input error")
            return
    assert quota_input_ok(quota), quota
    assert assessment.verdict in ("ok", "blocked", "blocked-unknown")
    event(assessment.verdict)  # --hypothesis-show-statistics: every outcome is reached
    if assessment.verdict == "ok":
        assert quota_supports_ok(quota, spec), (quota, assessment)
    assert all(line.existing == 0 for line in assessment.lines)


# --- provision's gate deducts only the disks its state records --------------------------------


@st.composite
def nebius_states(draw: st.DrawFn) -> list[dict[str, Any]]:
    """The resources a nebius stack's state may record: the agent disk and each node group,
    present or not, of sizes, types and counts that may or may not be the plan's."""
    # Mostly the plan's own disks (cluster_spec: agent 100, cpu 1 x 128, gpu 1 x 1023 GiB).
    types = st.sampled_from(("NETWORK_SSD", "NETWORK_SSD", "NETWORK_HDD"))
    counts = st.sampled_from((1, 1, 2))
    found = []
    if draw(st.booleans()):
        size = draw(st.sampled_from((100, 100, 128)))
        found.append(agent_disk("s", "computedisk-1", size, draw(types)))
    for role, planned in (("cpu", 128), ("gpu", 1023)):
        if draw(st.booleans()):
            size = draw(st.sampled_from((planned, planned, 100)))
            found.append(node_group("s", role, f"ng-{role}", draw(counts), size, draw(types)))
    return found


def recorded(resource: dict[str, Any]) -> tuple[str, str, int, int]:
    """(role, type, GiB, count) as the resource records it, read independently of npa."""
    name, out = resource["urn"].split("::")[-1], resource["outputs"]
    if name == "agent-boot-disk":
        return "agent", out["type"], out["sizeGibibytes"], 1
    boot = out["template"]["bootDisk"]
    return f"{name.split('-')[0]}_node", boot["type"], boot["sizeGibibytes"], out["fixedNodeCount"]


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(quota=quota_mutations(), resources=nebius_states())
def test_provision_deducts_exactly_what_its_state_records(
    quota: Any, resources: list[dict[str, Any]], npa_home: Path
) -> None:
    """provision-if-absent's gate, given the disks its refreshed state records (checked by the
    rule plan-spec --existing follows), deducts exactly those when they fit the plan, nothing
    otherwise, and says ok only when the quota covers the rest."""
    from npa.core.errors import InvalidInput
    from npa.core.paths import NpaPaths
    from npa.services.provision import ProvisionRequest, quota_gate
    from npa.targets.nebius.target import existing_disks

    spec = cluster_spec()
    infra = Workflow.model_validate(spec).infrastructure
    existing = existing_disks("s", resources)
    claims = [recorded(r) for r in resources]
    assert [c.status for c in existing] == ["proven"] * len(resources)
    assert sorted((c.disk.role, c.disk.disk_type.value, c.disk.size_gib, c.disk.count)
                  for c in existing) == sorted(claims)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "quota.yaml"
        path.write_text(yaml.safe_dump(quota, sort_keys=False))
        req = ProvisionRequest(project=None, target="nebius", quota_files=[path])
        try:
            assessment = quota_gate(req, NpaPaths(npa_home), infra, existing=existing)
        except InvalidInput:
            assert not quota_input_ok(quota)
            event("input error")
            return
    needs = {n.role: n for n in disk_needs(infra)}
    fits = all(
        role in needs
        and (needs[role].disk_type.value, needs[role].size_gib) == (kind, size)
        and count <= needs[role].count
        for role, kind, size, count in claims
    )
    deducted = {COUNT: sum(c[3] for c in claims) if fits else 0}
    for _, kind, size, count in claims:
        name = "compute.disk.size." + kind.lower().replace("_", "-")
        deducted[name] = deducted.get(name, 0) + (count * size * GIB if fits else 0)
    for line in assessment.lines:
        assert line.existing == deducted.get(line.name, 0), (line, claims)
    event(f"{assessment.verdict}, {'deducted' if fits and claims else 'nothing deducted'}")
    if assessment.verdict == "ok":
        assert quota_supports_ok(quota, spec, deducted), (quota, assessment)
