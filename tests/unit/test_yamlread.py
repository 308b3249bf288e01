"""read_document reads one YAML document exactly as PyYAML's safe loader does (SkyPilot's
loader): the same value, or the same exception, for any text; and it builds the plain data of a
task file itself rather than handing it to the loader."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.core import yamlread
from npa.core.templates import yaml_filter
from npa.core.yamlread import read_document

pytestmark = pytest.mark.unit

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def loader_answer(text: str) -> tuple[str, str]:
    """What the safe loader makes of ``text``: ("value", repr) or ("error", its type). The
    repr tells 1 from 1.0 and True, and reads NaN as itself."""
    try:
        return "value", repr(yaml.load(text, Loader=LOADER))
    except Exception as exc:  # the loader's own errors, whichever they are
        return "error", type(exc).__name__


def fast_answer(text: str) -> tuple[str, str]:
    try:
        return "value", repr(read_document(text))
    except Exception as exc:
        return "error", type(exc).__name__


_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from(["<<", "=", "~", "null", "yes", "0o17", "1_000", "2001-12-14", "1:30"])
)
_data = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text() | st.integers() | st.booleans(), inner, max_size=4)
    ),
    max_leaves=16,
)


def _finite(data: Any) -> bool:
    if isinstance(data, float):
        return math.isfinite(data)
    if isinstance(data, dict):
        return all(_finite(v) for v in data.values())
    return all(_finite(v) for v in data) if isinstance(data, list) else True


# What the task filter writes: it refuses a float that is not finite.
_filter_data = _data.filter(_finite)


@settings(max_examples=300)
@given(data=_data, flow=st.sampled_from([None, True, False]), style=st.sampled_from(
    [None, "'", '"', "|", ">"]), width=st.sampled_from([20, 80]))  # fmt: skip
def test_what_the_dumper_writes_reads_as_the_loader_reads_it(
    data: Any, flow: bool | None, style: str | None, width: int
) -> None:
    text = yaml.safe_dump(
        data, default_flow_style=flow, default_style=style, width=width, allow_unicode=True
    )
    assert fast_answer(text) == loader_answer(text)


@given(data=_filter_data)
def test_what_the_task_filter_writes_reads_as_the_loader_reads_it(data: Any) -> None:
    text = f"k: {yaml_filter(data)}\nz: {yaml_filter(str(data), block=True)}\n"
    assert fast_answer(text) == loader_answer(text)


# Text a person or a bug could write: YAML's structure characters, the constructs the fast
# builder leaves to the loader (anchors, aliases, tags, merge keys, several documents), and
# plain scalars of every resolved type.
_pieces = st.sampled_from(
    [
        "a: 1\n", "- x\n", "  - y\n", "b:\n  c: d\n", "&a {x: 1}", "*a", "<<: *a\n", "<<: {m: 1}\n",
        "!!str 1", "!!binary aGk=", "!custom x", "? [1]\n: v\n", "{[1]: 2}", "---\n", "...\n",
        "k: |\n  lit\n", "k: >\n  fold\n  ed\n", "k: 'q''s'\n", 'k: "\\u00e9\\n"\n', "k:\n",
        "k: ~\n", "k: .nan\n", "k: -.inf\n", "k: 0x1F\n", "k: 1e3\n", "k: 1.0e+3\n",
        "k: 2001-12-14t21:59:43.10-05:00\n", "k: =\n", "k: yes\n", "k: 0b101\n", "\t", ": ",
        "k: v\nk: w\n", "[a, b]: c\n", "'<<': x\n", "%YAML 1.1\n---\n", "# c\n", "\n",
    ]
)  # fmt: skip


@settings(max_examples=400)
@given(pieces=st.lists(_pieces, max_size=8))
def test_any_text_gets_the_loaders_value_or_its_error(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert fast_answer(text) == loader_answer(text)


def test_a_task_file_is_built_without_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The speed-up is real: the plain data of a rendered task file never reaches
    ``yaml.load``."""
    from npa.backends.skypilot.tasks import documents
    from npa.services.render import render_spec
    from tests.unit.specdata import DIGEST_A, base_spec, dump

    monkeypatch.setenv("NPA_HOME", str(tmp_path / "home"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_spec()))
    pins = tmp_path / "digests.yaml"
    pins.write_text(f"cur: {DIGEST_A}\n")
    out = tmp_path / "out"
    render_spec(spec, "run-1", out, digests_file=pins, kube_context="ctx")
    texts = [p.read_text() for p in sorted(out.glob("*.yaml"))]
    assert texts
    expected = [yaml.load(d, Loader=LOADER) for t in texts for d in documents(t)]

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("read_document handed a task file to yaml.load")

    monkeypatch.setattr(yamlread.yaml, "load", refused)
    assert [read_document(d) for t in texts for d in documents(t)] == expected


# --- the spec reader: values from events only when the node graph's reading has nothing to say


def spec_reading(doc: Any, problems: list[Any]) -> tuple[Any, ...]:
    """All a caller of load_text can learn: the values, the problems, the readings YAML 1.1
    and 1.2 disagree on, and where every value was written (and as what text)."""
    if doc is None:
        return None, problems
    paths: list[tuple[Any, ...]] = []
    todo: list[tuple[Any, tuple[Any, ...]]] = [(doc.data, ())]
    while todo:
        value, path = todo.pop()
        paths.append(path)
        if isinstance(value, dict):
            todo += [
                (v, (*path, k if isinstance(k, str | int) else str(k))) for k, v in value.items()
            ]
        elif isinstance(value, list):
            todo += [(v, (*path, i)) for i, v in enumerate(value)]
    where = [(p, doc.position(p), doc.written(p)) for p in paths]
    return repr(doc.data), problems, doc.ambiguous, where


_spec_pieces = st.sampled_from(
    [
        "stages:\n", "- name: a\n", "  tool: t\n", "  command: x\n", "  n: 0755\n", "  y: yes\n",
        "  v: 1.0\n", "  e: 1e3\n", "  o: 0o17\n", "  h: 0x1F\n", "  t: 2001-12-14\n", "  b: on\n",
        "  q: '1'\n", "  k: v\n", "  k: w\n", "  <<: {m: 1}\n", "  a: &x [1]\n", "  c: *x\n",
        "  !!str s: v\n", "  ? [1]\n  : v\n", "  1: int key\n", "  true: bool key\n",
        "  ~: null key\n",
        "- [a, b]\n", "- {k: v, k2: [1, {z: 2}]}\n", "  s: |\n    block\n", "  nil:\n",
        "  bad: 2001-13-45\n", "---\n", "\t", "  x: [\n", "  .inf: f\n", "  -: dash\n", "\n",
    ]
)  # fmt: skip


@settings(max_examples=500)
@given(pieces=st.lists(_spec_pieces, max_size=10))
def test_the_spec_reader_answers_as_the_node_graph_does(pieces: list[str]) -> None:
    from npa.spec.loader import _read_nodes, load_text

    text = "".join(pieces)
    assert spec_reading(*load_text(text)) == spec_reading(*_read_nodes(text))


def test_a_plain_spec_is_read_from_its_events_and_composed_only_when_asked_where() -> None:
    from npa.spec import loader

    text = "stages:\n- name: a\n  n: 1\n- name: b\n"
    doc, problems = loader.load_text(text)
    assert problems == [] and doc is not None and doc.root is None  # no node graph yet
    assert doc.data == {"stages": [{"name": "a", "n": 1}, {"name": "b"}]}
    assert doc.position(("stages", 1, "name")) == loader.Position(4, 3)
    assert doc.root is not None
    # A document with something to report is read as nodes, which say where.
    doc, problems = loader.load_text("a: 1\na: 2\n")
    assert doc is None and problems[0].line == 2


def test_the_spec_reader_stops_at_the_value_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from npa.spec import loader

    monkeypatch.setattr(loader, "MAX_NODES", 5)
    doc, problems = loader.load_text("a: [1, 2]\n")  # 5 values: a mapping, a key, a list, 2
    assert problems == [] and doc is not None
    doc, problems = loader.load_text("a: [1, 2, 3]\n")
    assert doc is None and "more than the 5" in problems[0].message


@pytest.mark.parametrize("depth", [3, 63, 64, 65, 400, 700, 900, 3000])
def test_deep_nesting_gets_the_node_graphs_answer(depth: int) -> None:
    from npa.spec.loader import _read_nodes, load_text

    block = "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + f"{'  ' * depth}v\n"
    for text in ("a: " + "[" * depth + "1" + "]" * depth + "\n", block):
        assert spec_reading(*load_text(text)) == spec_reading(*_read_nodes(text))
        assert fast_answer(text) == loader_answer(text)
