"""No error in a spec hides another: independent errors planted together are all reported, each
with its line and column. The planters cover the two passes (the model's field rules and the
whole-document rules) and the sections whose failure used to silence another (an input whose
name is wrong and which also has two sources; an infrastructure error beside a stage that does
not fit a GPU node)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.spec.validate import validate_text
from tests.tiers import examples
from tests.unit.specdata import base_spec, dump


@dataclass(frozen=True)
class Planter:
    name: str
    plant: Callable[[dict[str, Any]], None]
    path: str  # where the error must be reported


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def plant(spec: dict[str, Any]) -> None:
        node: Any = spec
        for key in keys[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
        node[keys[-1]] = value

    return plant


PLANTERS = [
    Planter("input name", _set("stages", 0, "inputs", 0, "name", value="Bad Name!"),
            "stages[0].inputs[0].name"),
    Planter("input with two sources", _set("stages", 1, "inputs", 0, "uri", value="s3://b/x/"),
            "stages[1].inputs[0]"),
    Planter("input with no source", _set("stages", 2, "inputs", 0, "from", value=None),
            "stages[2].inputs[0]"),
    Planter("accelerators beyond a node", _set("stages", 1, "resources", "accelerators",
            value="H100:16"), "stages[1].resources.accelerators"),
    Planter("agent disk", _set("infrastructure", "agent", "disk_gib", value=-5),
            "infrastructure.agent.disk_gib"),
    Planter("region type", _set("infrastructure", "region", value=5), "infrastructure.region"),
    Planter("cpu node count", _set("infrastructure", "cpu_nodes", "count", value=-1),
            "infrastructure.cpu_nodes.count"),
    Planter("gpu node disk", _set("infrastructure", "gpu_nodes", "disk_gib", value=0),
            "infrastructure.gpu_nodes.disk_gib"),
    Planter("unknown tool", _set("stages", 2, "tool", value="nope"), "stages[2].tool"),
    Planter("unknown dependency", _set("stages", 2, "depends_on", value=["ghost"]),
            "stages[2].depends_on[0]"),
    Planter("metadata name", _set("metadata", "name", value="Bad_Name"), "metadata.name"),
    Planter("absolute output path", _set("stages", 0, "outputs", 0, "path", value="/abs/"),
            "stages[0].outputs[0].path"),
    Planter("storage uri", _set("storage", "uri", value="http://x/y"), "storage.uri"),
    Planter("waves parallel", _set("stages", 1, "waves", "parallel", value=0),
            "stages[1].waves.parallel"),
    Planter("unknown field", _set("stages", 0, "colour", value="red"), "stages[0].colour"),
]  # fmt: skip


def _reported(planters: list[Planter]) -> dict[str, list[Any]]:
    spec = base_spec()
    for planter in planters:
        planter.plant(spec)
    workflow, issues = validate_text(dump(spec))
    assert workflow is None
    found: dict[str, list[Any]] = {}
    for issue in issues:
        found.setdefault(issue.path, []).append(issue)
    return found


def _assert_each_reported(planters: list[Planter], found: dict[str, list[Any]]) -> None:
    for planter in planters:
        assert planter.path in found, (planter.name, sorted(found))
        assert all(i.line is not None and i.column is not None for i in found[planter.path])


@pytest.mark.parametrize("planter", PLANTERS, ids=lambda p: p.name)
def test_each_planted_error_alone_is_reported_where_planted(planter: Planter) -> None:
    found = _reported([planter])
    _assert_each_reported([planter], found)


@settings(max_examples=examples(150))
@given(st.lists(st.sampled_from(PLANTERS), min_size=2, max_size=6, unique_by=lambda p: p.name))
def test_independent_errors_planted_together_are_all_reported(planters: list[Planter]) -> None:
    _assert_each_reported(planters, _reported(planters))


def test_the_issue_pair_a_bad_name_and_two_sources_on_one_input() -> None:
    spec = base_spec()
    spec["stages"][0]["inputs"][0] = {"name": "Bad Name!", "uri": "s3://a/b/", "from": "x.y"}
    _, issues = validate_text(dump(spec))
    paths = [(i.path, i.message) for i in issues]
    assert ("stages[0].inputs[0]", "an input needs exactly one of 'uri' or 'from'") in paths
    assert any(p == "stages[0].inputs[0].name" for p, _ in paths)


def test_a_rule_both_passes_check_is_listed_once() -> None:
    spec = base_spec()
    spec["stages"][1]["inputs"][0]["uri"] = "s3://b/x/"  # every field valid: the model checks too
    _, issues = validate_text(dump(spec))
    assert [i.path for i in issues].count("stages[1].inputs[0]") == 1
