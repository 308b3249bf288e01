"""validate-spec rules: each one rejects what it should, with a path, a position and a hint."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from npa.spec.validate import SpecIssue, validate_text
from tests.unit.specdata import base_spec, dump

pytestmark = pytest.mark.unit


def issues_of(mutate: Callable[[dict[str, Any]], None]) -> list[SpecIssue]:
    spec = base_spec()
    mutate(spec)
    workflow, issues = validate_text(dump(spec))
    assert workflow is None, "the mutated spec should be invalid"
    assert issues
    for issue in issues:
        assert issue.hint, issue
    return issues


def one(issues: list[SpecIssue], path: str) -> SpecIssue:
    found = [i for i in issues if i.path == path]
    assert found, f"no issue at {path}: {[i.describe() for i in issues]}"
    return found[0]


def test_base_spec_and_examples_are_valid() -> None:
    workflow, issues = validate_text(dump(base_spec()))
    assert issues == [] and workflow is not None
    for name in ("physical-ai", "tiny-local"):
        with open(f"examples/{name}.yaml", encoding="utf-8") as fh:
            workflow, issues = validate_text(fh.read())
        assert issues == [], issues
        assert workflow is not None and workflow.metadata.name == name


def test_unknown_keys_are_rejected_everywhere() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["extra"] = 1
        s["metadata"]["nmae"] = "x"
        s["stages"][1]["resources"]["gpus"] = 8
        s["infrastructure"]["agent"] = {"disk": 100}

    issues = issues_of(mutate)
    assert "unknown field" in one(issues, "extra").message
    one(issues, "metadata.nmae")
    one(issues, "stages[1].resources.gpus")
    one(issues, "infrastructure.agent.disk")


def test_every_error_is_reported_at_once_with_positions() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][0]["tool"] = "nope"
        s["stages"][1]["inputs"][0]["from"] = "curate.missing"
        s["stages"][2]["depends_on"] = ["ghost"]
        s["stages"][1]["resources"]["accelerators"] = "H100x8"

    issues = issues_of(mutate)
    assert len(issues) == 4
    tool = one(issues, "stages[0].tool")
    assert tool.message == "unknown tool 'nope'" and "cur, gpu" in tool.hint
    assert "declares no output 'missing'" in one(issues, "stages[1].inputs[0].from").message
    assert "unknown stage 'ghost'" in one(issues, "stages[2].depends_on[0]").message
    assert "NAME:N" in one(issues, "stages[1].resources.accelerators").message
    # yaml.safe_dump writes stages[0].tool on a known line: check the position is right.
    text = dump(base_spec()).splitlines()
    assert text[tool.line - 1].strip().startswith("tool:") if tool.line else False
    assert [i.line for i in issues] == sorted(i.line or 0 for i in issues)


def test_unknown_input_stage_and_self_reference() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][1]["inputs"].append({"name": "x", "from": "nowhere.out"})
        s["stages"][1]["inputs"].append({"name": "y", "from": "augment.aug"})
        s["stages"][1]["inputs"].append({"name": "z", "from": "no-dot"})

    issues = issues_of(mutate)
    assert "unknown stage 'nowhere'" in one(issues, "stages[1].inputs[1].from").message
    assert "its own output" in one(issues, "stages[1].inputs[2].from").message
    assert "<stage>.<output>" in one(issues, "stages[1].inputs[3].from").message


def test_input_needs_exactly_one_source() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][0]["inputs"] = [
            {"name": "a"},
            {"name": "b", "uri": "s3://x/y", "from": "augment.aug"},
            {"name": "c", "uri": "http://example.com/x"},
            {"name": "d", "uri": "file://relative/x"},
        ]

    issues = issues_of(mutate)
    assert "exactly one" in one(issues, "stages[0].inputs[0]").message
    assert "exactly one" in one(issues, "stages[0].inputs[1]").message
    assert "not an object-store URI" in one(issues, "stages[0].inputs[2].uri").message
    assert "absolute path" in one(issues, "stages[0].inputs[3].uri").message


def test_dependency_cycles_are_found() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][0]["depends_on"] = ["evaluate"]

    issues = issues_of(mutate)
    cycles = sorted(i.message for i in issues if "cycle" in i.message)
    # evaluate reaches curate directly and through augment: two distinct cycles.
    assert cycles == [
        "dependency cycle: curate -> evaluate -> augment -> curate",
        "dependency cycle: curate -> evaluate -> curate",
    ]


def test_self_dependency_and_duplicate_dependency() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][2]["depends_on"] = ["evaluate", "curate", "curate"]

    issues = issues_of(mutate)
    assert "itself" in one(issues, "stages[2].depends_on[0]").message
    assert "twice" in one(issues, "stages[2].depends_on[2]").message


def test_duplicate_names() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][2]["name"] = "curate"
        s["stages"][2]["outputs"] = [
            {"name": "r", "path": "a/"},
            {"name": "r", "path": "b/"},
            {"name": "q", "path": "a"},
        ]
        s["stages"][0]["inputs"].append({"name": "raw", "uri": "s3://raw/other/"})

    issues = issues_of(mutate)
    assert "duplicate stage name 'curate'" in one(issues, "stages[2].name").message
    assert "duplicate output name" in one(issues, "stages[2].outputs[1].name").message
    assert "also the path of outputs[0]" in one(issues, "stages[2].outputs[2].path").message
    assert "duplicate input name" in one(issues, "stages[0].inputs[1].name").message


def test_duplicate_yaml_keys_are_errors_with_position() -> None:
    text = dump(base_spec()).replace("kind: Workflow\n", "kind: Workflow\nkind: Workflow\n")
    workflow, issues = validate_text(text)
    assert workflow is None
    assert issues[0].message == "duplicate key 'kind'"
    assert issues[0].line == 3


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "UPPER", "-lead", "x" * 64])
def test_names_that_could_escape_a_prefix_are_refused(name: str) -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][0]["name"] = name
        s["metadata"]["name"] = name
        s["stages"][0]["outputs"][0]["name"] = name

    issues = issues_of(mutate)
    for path in ("stages[0].name", "metadata.name", "stages[0].outputs[0].name"):
        issue = one(issues, path)
        if "/" in name or ".." in name:
            assert "escape" in issue.hint


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/abs/path", "absolute"),
        ("a/../../b", "'..'"),
        ("a//b", "empty"),
        ("./a", "'.'"),
        ("s3://elsewhere/x", "URI"),
        ("a\\b", "backslash"),
    ],
)
def test_output_and_checkpoint_paths_stay_under_the_run_prefix(path: str, why: str) -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][0]["outputs"][0]["path"] = path
        s["stages"][1]["checkpoint"] = {"path": path, "loader": "resume"}

    issues = issues_of(mutate)
    assert why in one(issues, "stages[0].outputs[0].path").message
    assert why in one(issues, "stages[1].checkpoint.path").message


@pytest.mark.parametrize("accel", ["H100", "H100:0", ":8", "H100:8:1", "H100: 8", "H100:1000"])
def test_accelerator_syntax(accel: str) -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][1]["resources"]["accelerators"] = accel

    issues = issues_of(mutate)
    assert "NAME:N" in one(issues, "stages[1].resources.accelerators").message


def test_accelerators_must_fit_a_gpu_node() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][1]["resources"]["accelerators"] = "H100:16"
        s["stages"][2]["resources"] = {"accelerators": "A100:8"}

    issues = issues_of(mutate)
    assert "does not fit" in one(issues, "stages[1].resources.accelerators").message
    assert "does not fit" in one(issues, "stages[2].resources.accelerators").message

    def no_gpu_nodes(s: dict[str, Any]) -> None:
        s["infrastructure"]["gpu_nodes"] = {"count": 0}

    issues = issues_of(no_gpu_nodes)
    assert "count is 0" in one(issues, "stages[1].resources.accelerators").message


def test_waves_reserved_env_and_ranges() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][1]["waves"] = {"shards": 2, "parallel": 3}
        s["stages"][2]["env"] = {"NPA_RUN_ID": "x"}
        s["stages"][0]["env"] = {"1BAD": "y", "OK": 3}
        s["stages"][0]["retries"] = -1
        s["infrastructure"]["cpu_nodes"] = {"disk_gib": 0}

    issues = issues_of(mutate)
    assert "larger than shards" in one(issues, "stages[1].waves.parallel").message
    assert "reserved NPA_ prefix" in one(issues, "stages[2].env.NPA_RUN_ID").message
    bad_key = [i for i in issues if i.path == 'stages[0].env["1BAD"]']
    assert len(bad_key) == 1 and bad_key[0].message == "invalid key '1BAD'"
    one(issues, "stages[0].env.OK")
    one(issues, "stages[0].retries")
    one(issues, "infrastructure.cpu_nodes.disk_gib")


def test_tools_and_images() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["tools"]["cur"]["image"] = "Not A Ref"
        s["tools"]["gpu"]["image"] = "registry.example.com/gpu@sha256:short"
        s["tools"]["Bad/Ref"] = {"image": "x:1"}
        s["tools"]["cur"]["contract"] = {"run_as_user": 0}

    issues = issues_of(mutate)
    one(issues, "tools.cur.image")
    assert "not a valid image reference" in one(issues, "tools.gpu.image").message
    assert "invalid key" in one(issues, 'tools["Bad/Ref"]').message
    one(issues, "tools.cur.contract.run_as_user")


def test_document_shape_errors() -> None:
    for text, needle in [
        ("", "empty"),
        ("- a\n- b\n", "must be a mapping"),
        ("a: [1\n", "YAML syntax error"),
        ("a: 1\n---\nb: 2\n", "more than one YAML document"),
        ("base: &b {x: 1}\nother:\n  <<: *b\n", "merge keys"),
        ("apiVersion: npa/v2\nkind: Job\n", "npa/v1"),
    ]:
        workflow, issues = validate_text(text)
        assert workflow is None
        assert any(needle in i.message for i in issues), (text, issues)
    _, issues = validate_text("a: [1\n")
    assert issues[0].line == 2 and issues[0].column == 1
    _, issues = validate_text("apiVersion: npa/v1\nkind: Workflow\n")
    assert {i.path for i in issues} >= {"metadata", "tools", "stages"}
    assert all("add the required field" in i.hint for i in issues)


def test_alias_bombs_are_refused_quickly() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    workflow, issues = validate_text("\n".join(lines) + "\n")
    assert workflow is None
    assert "expands to more than 4,000,000 values" in issues[0].message
    # What was counted: the mapping, its 9 keys, 9 lists and the 10 "x"; 8 lists are aliased.
    assert "29 are written in the file, the rest are copies of 8 anchored values" in (
        issues[0].message
    )
    assert "(at line 1, 2, 3, 4, 5 and 3 more)" in issues[0].message
    assert (issues[0].line, issues[0].column) == (1, 5) and "*name" in issues[0].hint


def test_a_spec_past_the_value_cap_without_aliases_is_told_what_was_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cap names the values it counted and its limit, and says nothing of aliases or
    anchors a document does not have (it once asked "(aliases?)" of every large spec)."""
    import npa.spec.loader as loader

    text = dump(base_spec())
    monkeypatch.setattr(loader, "MAX_NODES", 100)
    workflow, issues = validate_text(text)
    assert workflow is None and len(issues) == 1
    written = loader._written(yaml.compose(text))[0]
    assert issues[0].message == (
        f"the spec holds {written:,} values (keys, scalars, lists and mappings), more than the "
        "100 a spec may hold"
    )
    assert "alias" not in issues[0].message + issues[0].hint
    assert "anchor" not in issues[0].message + issues[0].hint


def test_stage_parse_failure_does_not_cause_spurious_reference_errors() -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["stages"][0]["retries"] = "many"  # curate fails to parse on its own

    issues = issues_of(mutate)
    assert [i.path for i in issues] == ["stages[0].retries"]


def test_every_independent_error_in_one_stage_is_reported() -> None:
    """Nine problems planted in one stage and its neighbours: an unknown field, a bad number
    and a bad accelerator in the same object must not hide one another, nor the references."""

    def mutate(s: dict[str, Any]) -> None:
        stage = s["stages"][1]
        stage["colour"] = "blue"  # 1 unknown field
        stage["resources"] = {"cpus": -4, "accelerators": "H100:-1"}  # 2, 3
        stage["tool"] = "nope"  # 4 unknown tool
        stage["inputs"][0]["from"] = "curate.missing"  # 5 undeclared output
        stage["waves"] = {"shards": 2, "parallel": 3}  # 6 parallel > shards
        stage["env"] = {"NPA_STAGE": "x"}  # 7 reserved name
        stage["depends_on"] = ["ghost"]  # 8 unknown stage
        stage["outputs"].append({"name": "aug", "path": "../up"})  # 9 and 10: dup name, bad path

    issues = issues_of(mutate)
    at = "stages[1]"
    for path in (
        f"{at}.colour",
        f"{at}.resources.cpus",
        f"{at}.resources.accelerators",
        f"{at}.tool",
        f"{at}.inputs[0].from",
        f"{at}.waves.parallel",
        f"{at}.env.NPA_STAGE",
        f"{at}.depends_on[0]",
        f"{at}.outputs[1].name",
        f"{at}.outputs[1].path",
    ):
        one(issues, path)
    assert "NAME:N" in one(issues, f"{at}.resources.accelerators").message


def _chain(stages: int) -> str:
    spec = base_spec()
    spec["stages"] = [
        {
            "name": f"s{i}",
            "tool": "cur",
            "command": "true",
            "outputs": [{"name": "out", "path": "out/"}],
            **({"inputs": [{"name": "up", "from": f"s{i - 1}.out"}]} if i else {}),
            **({"depends_on": [f"s{i // 2}"]} if i > 1 else {}),
        }
        for i in range(stages)
    ]
    return dump(spec)


def _cpu_seconds(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        workflow, issues = validate_text(text)
        best = min(best, time.process_time() - start)
        assert workflow is not None, issues[:3]
    return best


def test_validation_time_grows_linearly_with_the_stages() -> None:
    """Four times the stages may take about four times as long, never the square of it: the
    ratio is compared, not a time, so the machine's speed does not matter."""
    small, large = _chain(1500), _chain(6000)
    ratio = _cpu_seconds(large) / _cpu_seconds(small)
    assert ratio < 6.0, f"4x the stages took {ratio:.1f}x the time"
