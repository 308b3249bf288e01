"""Task files rendered through shapes (the template rendered once per outcome of its control flow,
then each file's values put in its holes) are byte for byte the files rendered the full way; a
template that looks into a value gets no shape, and its files are rendered the full way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.backends.skypilot import tasks
from npa.backends.skypilot.tasks import Shapes
from npa.core.templates import Shape, ShapeRefused, Slot, yaml_environment
from npa.services.render import render_workflow
from npa.spec.model import Workflow
from tests.unit.specdata import DIGEST_A, base_spec

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPA_HOME", str(tmp_path / "npa-home"))


def rendered(workflow: Workflow) -> dict[str, str]:
    made = render_workflow(workflow, "run-1", kube_context="ctx", digests={"cur": DIGEST_A})
    return {t.stage: t.text for t in made}


def full_way(workflow: Workflow, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The files rendered without shapes: the template and the read-back for every file."""
    with monkeypatch.context() as patch:
        patch.setattr(Shapes, "render", Shapes._full)
        return rendered(workflow)


def full_renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets one item per file rendered the full way."""
    count: list[int] = []
    full = Shapes._full

    def counted(self: Shapes, values: dict[str, Any]) -> str:
        count.append(1)
        return full(self, values)

    monkeypatch.setattr(Shapes, "_full", counted)
    return count


# Text for commands, env values, env names and URIs: YAML's structure characters, what a literal
# block cannot hold (a tab, a trailing space, a non-ASCII character), trailing newlines (a
# block's chomping), the hole mark and what a slot is written as.
_text = st.lists(
    st.sampled_from(
        [
            "\n",
            "\n\n",
            "  ",
            "a: b",
            "# c",
            "|",
            "---",
            "\t",
            " \n",
            "é",
            "\x00",
            "0f",
            "\x001b\x00",
        ]
    )
    | st.text(max_size=6),
    max_size=5,
).map("".join)


def _stage(i: int, command: str, value: str, key: str, shards: int, gpus: bool) -> dict[str, Any]:
    stage: dict[str, Any] = {
        "name": f"s{i}",
        "tool": "cur",
        "command": command or "true",
        "inputs": [
            {"name": "raw", "uri": "s3://raw/" + "".join(c for c in key if "!" <= c <= "~")}
        ],
        "outputs": [{"name": "out", "path": "out/"}],
        "env": {"HOSTILE": value, **({f"K{key.encode().hex()[:20]}": "x"} if key else {})},
        "waves": {"shards": shards, "parallel": 1},
    }
    if gpus:
        stage["resources"] = {"accelerators": "H100:1", "cpus": 4}
    return stage


_stages = st.lists(
    st.tuples(_text, _text, _text, st.integers(1, 3), st.booleans(), st.booleans()),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stages=_stages)
def test_the_files_are_the_files_rendered_the_full_way(
    monkeypatch: pytest.MonkeyPatch, stages: list[tuple[str, str, str, int, bool, bool]]
) -> None:
    spec: dict[str, Any] = base_spec()
    spec["stages"] = []
    for i, (command, value, key, shards, gpus, secrets) in enumerate(stages):
        stage = _stage(i, command, value, key, shards, gpus)
        if secrets:  # the pod's variables differ from the other stages'
            stage["secrets"] = {"TOKEN": "env:NPA_TOKEN"}
        spec["stages"].append(stage)
    workflow = Workflow.model_validate(spec)  # the spec takes any such text
    assert rendered(workflow) == full_way(workflow, monkeypatch)


def test_one_full_render_a_shape_however_many_files(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = base_spec()
    spec["stages"] = [_stage(i, f"run {i}", f"v{i}", f"k{i}", 1, False) for i in range(40)]
    spec["stages"] += [_stage(40 + i, f"run {i}", f"v{i}", f"k{i}", 2, True) for i in range(20)]
    workflow = Workflow.model_validate(spec)
    expected = full_way(workflow, monkeypatch)
    count = full_renders(monkeypatch)
    assert rendered(workflow) == expected
    assert len(count) == 2  # one key for one wave without GPUs, one for two waves with them


def test_a_run_script_a_literal_block_cannot_hold_is_proven_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same control flow, but a tab in a command makes its run script a quoted string rather
    than a literal block: that form is its own proof, and renders as the full way renders it."""
    spec = base_spec()
    commands = ["a", "b", "c\td", "e\tf"]
    spec["stages"] = [_stage(i, c, "v", "k", 1, False) for i, c in enumerate(commands)]
    workflow = Workflow.model_validate(spec)
    expected = full_way(workflow, monkeypatch)
    count = full_renders(monkeypatch)
    assert rendered(workflow) == expected
    assert len(count) == 2


def shapes_of(source: str) -> tuple[Shapes, Any]:
    template = yaml_environment(str(tasks.templates_dir())).from_string(source)
    return Shapes(template), template


def values(name: str, command: str = "true\n", cpus: Any = 2) -> dict[str, Any]:
    return {
        "cpus": cpus,
        "setup": command,
        "waves": [{"name": name, "nodes": 1, "envs": {"A": name, "EMPTY": ""}}],
    }


_PLAIN = """\
{% for wave in waves %}
name: {{ wave.name | yaml }}
{% if cpus is not none %}
cpus: {{ cpus | yaml }}
{% endif %}
envs:
{% for key, value in wave.envs.items() %}
  {{ key | yaml }}: {{ value | yaml }}
{% endfor %}
setup: {{ setup | yaml(block=True) }}
{% endfor %}
"""


@pytest.mark.parametrize(
    "looks",
    [
        "{% if wave.name == 'b' %}b: {{ 1 | yaml }}\n{% endif %}",  # compares
        "{% if 'b' in wave.name %}b: {{ 1 | yaml }}\n{% endif %}",  # looks inside
        "n: {{ wave.name | length | yaml }}\n",  # measures
        "u: {{ wave.name.upper() | yaml }}\n",  # calls a method
        "f: {{ wave.name[0] | yaml }}\n",  # indexes
        "s: {{ (wave.name ~ '!') | yaml }}\n",  # joins
        "{% for c in setup %}{% endfor %}",  # iterates
    ],
)
def test_a_template_that_looks_into_a_value_gets_no_shape(
    monkeypatch: pytest.MonkeyPatch, looks: str
) -> None:
    source = _PLAIN.replace("{% endfor %}\n", "{% endfor %}\n" + looks, 1)
    monkeypatch.setattr(tasks, "_check_structure", lambda text, values: None)
    shapes, template = shapes_of(source)
    names = ["a", "b", "c", "b"]
    got = [shapes.render(values(n)) for n in names]
    assert got == [template.render(**values(n)) for n in names]
    assert shapes.full == len(names)  # every file the full way


def test_a_plain_template_gets_one_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_check_structure", lambda text, values: None)
    shapes, template = shapes_of(_PLAIN)
    cases = [values(n) for n in "abcdef"] + [values("g", cpus=None), values("h", cpus=0)]
    assert [shapes.render(v) for v in cases] == [template.render(**v) for v in cases]
    assert shapes.full == 3  # cpus given, none, and zero (a value that is empty is in the key)


def test_each_way_a_block_ends_is_proven_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A literal block's chomping and what follows it depend on its trailing newlines; a text
    with a tab is a quoted string."""
    monkeypatch.setattr(tasks, "_check_structure", lambda text, values: None)
    shapes, template = shapes_of(_PLAIN)
    setups = ["a\n", "b\n", "c", "d", "e\n\n", "f\n\n\n", "g\n\n\n", "h\ti", "j\tk\n"]
    cases = [values(s, command=s) for s in setups]
    assert [shapes.render(v) for v in cases] == [template.render(**v) for v in cases]
    assert shapes.full == 5  # one, none, two and three newlines; a quoted string


def test_a_shape_whose_first_file_differs_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_check_structure", lambda text, values: None)
    monkeypatch.setattr(Shape, "fill", lambda self, values, forms: "not the file")
    shapes, template = shapes_of(_PLAIN)
    cases = [values(n) for n in "abc"]
    assert [shapes.render(v) for v in cases] == [template.render(**v) for v in cases]
    assert shapes.full == 3


def test_an_env_name_too_long_for_an_implicit_key_is_its_own_key() -> None:
    long = "N" * 1100
    walks = [tasks._Walk(values("a")), tasks._Walk(values("b"))]
    other = values("c")
    other["waves"][0]["envs"] = {long: "x", "EMPTY": ""}
    walks.append(tasks._Walk(other))
    assert walks[0].key == walks[1].key != walks[2].key


@pytest.mark.parametrize(
    ("text", "slots"),
    [
        ("a\x000f\x00b\x00", 1),  # a mark without its pair
        ("a\x003f\x00b", 2),  # a slot that was not given
        ("a\x000x\x00b", 1),  # not a mark the filter writes
    ],
)
def test_a_text_with_marks_the_filter_did_not_write_has_no_shape(text: str, slots: int) -> None:
    with pytest.raises(ShapeRefused):
        Shape.recorded(text, slots)


def test_a_slot_is_a_key_of_a_mapping_and_nothing_else() -> None:
    a, b = Slot("0"), Slot("1")
    assert {a: 1, b: 2}[a] == 1
    assert a and a is not None
    for look in (lambda: a == "0", lambda: len(a), lambda: a.upper(), lambda: str(a)):
        with pytest.raises(ShapeRefused):
            look()
