"""Plain values YAML 1.1 and YAML 1.2 read differently are refused in a spec, at line:col, with
the quoted form to write. npa reads YAML 1.1 (PyYAML): ``MODE: 0755`` was the number 493 and
``DEBUG: yes`` the boolean true, where a YAML 1.2 reader (and most people) see 755 and "yes"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.spec.validate import validate_text
from tests.unit.specdata import base_spec, dump

pytestmark = pytest.mark.unit

# The forms only YAML 1.1 gives a type, or a value other than YAML 1.2's core schema gives.
_BOOLS = (
    st.sampled_from(["yes", "no", "on", "off", "y", "n"])
    .flatmap(lambda w: st.sampled_from([w, w.capitalize(), w.upper()]))
    .filter(lambda w: w.lower() not in ("y", "n"))
)  # y/n are text in PyYAML too
_OCTALS = st.integers(min_value=8, max_value=0o7777).map(lambda n: f"0{n:o}")
_UNDERSCORED = st.integers(min_value=1_000, max_value=10**9).map(lambda n: f"{n:_}")
_SEXAGESIMAL = st.tuples(st.integers(1, 99), st.integers(0, 59)).map(lambda t: f"{t[0]}:{t[1]:02d}")
_BINARY = st.integers(min_value=0, max_value=255).map(lambda n: f"0b{n:b}")
_DATES = st.dates().filter(lambda d: d.year >= 1000).map(lambda d: d.isoformat())
YAML11_ONLY = st.one_of(_BOOLS, _OCTALS, _UNDERSCORED, _SEXAGESIMAL, _BINARY, _DATES)


def _spec_with(field_line: str) -> tuple[str, int]:
    """The base spec with ``field_line`` replacing the augment stage's ``shards`` line, and
    the 1-based line it is on."""
    text = dump(base_spec()).replace("shards: 10", field_line, 1)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if field_line in t)
    return text, line


@given(YAML11_ONLY)
def test_a_yaml_11_form_in_a_text_field_asks_for_the_quoted_form(form: str) -> None:
    text = dump(base_spec()).replace("command: echo augment", f"command: {form}", 1)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if f"command: {form}" in t)
    workflow, issues = validate_text(text)
    assert workflow is None
    [issue] = issues
    assert (issue.path, issue.line, issue.column) == ("stages[1].command", line, 3), issue
    assert issue.message.startswith(f"{form} is read as "), issue
    assert "YAML 1.1" in issue.message and "YAML 1.2" in issue.message, issue
    assert issue.hint == f'write command: "{form}" (quoted, it is text)'
    # ... which is then what the spec holds.
    quoted, _ = validate_text(text.replace(f"command: {form}", f'command: "{form}"'))
    assert quoted is not None and quoted.stages[1].command == form


@given(YAML11_ONLY)
def test_a_yaml_11_form_in_a_number_field_is_refused_not_read_either_way(form: str) -> None:
    text, line = _spec_with(f"shards: {form}")
    workflow, issues = validate_text(text)
    assert workflow is None
    ours = [i for i in issues if i.message.startswith(f"{form} is read as ")]
    assert len(ours) == 1 and ours[0].path == "stages[1].waves.shards", issues
    assert (ours[0].line, ours[0].column) == (line, 5)
    assert ours[0].hint.startswith(f'write shards: "{form}" for the text'), ours[0]


@given(st.integers(min_value=4, max_value=100_000))  # parallel is 4
def test_numbers_both_yamls_read_alike_are_accepted(shards: int) -> None:
    for written in (str(shards), f"0x{shards:x}", "+" + str(shards)):
        text, _ = _spec_with(f"shards: {written}")
        workflow, issues = validate_text(text)
        assert workflow is not None and workflow.stages[1].waves.shards == shards, issues


def test_an_octal_asks_for_one_of_its_two_readings() -> None:
    text, _ = _spec_with("shards: 010")
    _, issues = validate_text(text)
    [issue] = [i for i in issues if i.path == "stages[1].waves.shards"]
    assert issue.message == (
        "010 is read as the number 8 by YAML 1.1 (npa's reader) and as the number 10 by YAML 1.2"
    )
    assert issue.hint == 'write shards: "010" for the text, or 8 or 10 for a number'
