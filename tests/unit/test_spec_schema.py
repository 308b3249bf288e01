"""The JSON Schema and the validator are one model: they agree on every field's type and syntax.

Property: take a valid spec, change one thing anywhere in it (replace a value with a random JSON
value, delete a key, add a key) and ask both. Whatever the model accepts the schema accepts, and
whatever the model refuses for a reason of type or syntax the schema refuses too. Only rules a
schema cannot state (references, duplicates, cycles, fit) are left to the validator alone.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from npa.spec.model import RULE_ERROR, Workflow
from npa.spec.schema import workflow_json_schema
from npa.spec.validate import validate_text
from tests.tiers import examples
from tests.unit.specdata import base_spec, doc_paths, dump

pytestmark = pytest.mark.unit

SCHEMA = jsonschema.Draft202012Validator(workflow_json_schema())

# Values near the syntax rules: quoted numbers, YAML 1.1 words, paths, URIs, names.
INTERESTING = [
    "2", "2.0", "1e3", "yes", "H100:8", "H100:-1", "h100:8", "A:1000", "curate.clips",
    "curate", "s3://b/p", "s3://b/../p", "s3:///p", "file:///tmp/x", "file://x",
    "gs://b/\u00e9", "NPA_X", "npa_x", "_X", "1X", "a/b", "..", "curated/", "/abs",
    "reg.example.com/x:1", "reg.example.com/x@sha256:" + "a" * 64, "X:1", "file",
    "prefix", "NETWORK_SSD", "network_ssd", "ctx/1", "ctx:1",
]  # fmt: skip
# Python's jsonschema lets "$" match before a final newline, unlike pydantic and editors;
# such strings are left out rather than testing that quirk.
texts = st.text(max_size=24).filter(lambda s: not s.endswith("\n"))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
    st.sampled_from(INTERESTING),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)
    ),
    max_leaves=6,
)


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


@st.composite
def mutated_specs(draw: st.DrawFn) -> Any:
    spec = base_spec()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in doc_paths(spec) if p]
        path = draw(st.sampled_from(paths))
        parent = _parent(spec, path)
        action = draw(st.sampled_from(["replace", "retype", "delete", "add"]))
        current = parent[path[-1]]
        if action == "retype" and not isinstance(current, dict | list):
            # The same value written as another type: 10 -> "10", 10.0, True; "x" -> ["x"].
            parent[path[-1]] = draw(
                st.sampled_from([str(current), [current], float(len(str(current))), True])
            )
        elif action == "replace":
            parent[path[-1]] = copy.deepcopy(draw(values))
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(current, dict):
            parent[path[-1]][draw(texts)] = copy.deepcopy(draw(values))
    # What an editor sees: JSON values, string keys.
    return json.loads(json.dumps(spec))


def _model_errors(doc: Any) -> list[dict[str, Any]]:
    try:
        Workflow.model_validate(doc)
    except ValidationError as exc:
        return [dict(e) for e in exc.errors(include_url=False)]
    return []


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_schema_and_model_agree(doc: Any) -> None:
    schema_ok = SCHEMA.is_valid(doc)
    errors = _model_errors(doc)
    if not errors:
        assert schema_ok, list(SCHEMA.iter_errors(doc))[:3]
    structural = [e for e in errors if e["type"] != RULE_ERROR]
    if structural:
        assert not schema_ok, structural[:3]
    # The validator behind validate-spec gives the same verdict as the model on the same data.
    workflow, issues = validate_text(dump(doc))
    if errors:
        assert workflow is None and issues


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda s: s["stages"][1]["waves"].update(shards="10"), "stages[1].waves.shards"),
        (lambda s: s["stages"][1].update(retries="2"), "stages[1].retries"),
        (lambda s: s["stages"][0].update(command=5), "stages[0].command"),
        (lambda s: s["infrastructure"].update(gpu_nodes={"count": True}), None),
        (lambda s: s["stages"][0]["inputs"][0].update(from_="curate.clips"), None),
    ],
)
def test_quoted_numbers_and_wrong_types_are_refused_by_both(mutate: Any, path: str | None) -> None:
    spec = base_spec()
    mutate(spec)
    assert not SCHEMA.is_valid(spec)
    workflow, issues = validate_text(dump(spec))
    assert workflow is None
    if path is not None:
        assert any(i.path == path for i in issues), issues


def test_whole_numbers_written_as_floats_are_numbers_for_both() -> None:
    spec = base_spec()
    spec["stages"][1]["waves"] = {"shards": 10.0, "parallel": 4.0}
    assert SCHEMA.is_valid(spec)
    workflow, issues = validate_text(dump(spec))
    assert issues == [] and workflow is not None
    assert workflow.stages[1].waves.shards == 10
