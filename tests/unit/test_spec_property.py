"""Property: whatever the input, validation answers with a workflow or a clean list of issues.

Random YAML text and random mutations of a valid spec must never raise; and any spec that
validates must also plan and render without anything but a clean npa error.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.core.errors import NpaError
from npa.plan.infra import cluster_requirements, disk_needs
from npa.plan.model import build_plan
from npa.plan.quota import assess
from npa.services.render import render_workflow
from npa.spec.loader import load_text
from npa.spec.validate import validate_text
from tests.tiers import examples
from tests.unit.specdata import DIGEST_A, base_spec, doc_paths

pytestmark = pytest.mark.unit

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        ["H100:8", "../x", "a/b", "curate.clips", "s3://b/k", "npa/v1", "Workflow", "cur", "gpu"]
    ),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)

yaml_fragments = st.sampled_from(
    [
        "a: 1\n",
        "- x\n",
        "  b: [1, 2\n",
        "&a x\n",
        "*a\n",
        "<<: *a\n",
        "? [1]\n: 2\n",
        "key: 'unterminated\n",
        "\t- tab\n",
        "!!python/object:os.system x\n",
        "---\n",
        "...\n",
        "stages:\n  - name: x\n",
        "apiVersion: npa/v1\nkind: Workflow\n",
        "%YAML 1.1\n",
        "{a: {b: {c: [",
        "\x00",
        "\ufeff",
        "k: !!binary aGk=\n",
        "k: 2001-12-14\n",
    ]
)


@SETTINGS
@given(st.lists(yaml_fragments, max_size=12), st.text(max_size=40))
def test_random_yaml_never_raises(fragments: list[str], noise: str) -> None:
    for text in ("".join(fragments), "".join(fragments) + noise, noise):
        workflow, issues = validate_text(text)
        assert (workflow is None) == bool(issues)
        for issue in issues:
            assert issue.message and issue.hint


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = base_spec()
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        paths = [p for p in doc_paths(spec) if p]
        path = draw(st.sampled_from(paths))
        parent = spec
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = copy.deepcopy(draw(values))
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = copy.deepcopy(draw(values))
        else:
            parent.append(copy.deepcopy(draw(values)))
    return spec


@SETTINGS
@given(mutated_specs())
def test_random_specs_are_valid_or_cleanly_rejected(spec: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(spec, allow_unicode=True)
    except yaml.YAMLError:
        return
    workflow, issues = validate_text(text)
    assert (workflow is None) == bool(issues)
    if workflow is None:
        assert all(i.hint for i in issues)
        return
    plan = build_plan(workflow, "prop-1")
    assert sorted(plan.order) == sorted(s.name for s in workflow.stages)
    needs = disk_needs(workflow.infrastructure)
    assess(cluster_requirements(needs), [], needs=needs)
    try:
        tasks = render_workflow(
            workflow,
            "prop-1",
            kube_context="ctx",
            digests={"cur": DIGEST_A} if "cur" in workflow.tools else {},
            store_uri="s3://bucket/p",
        )
    except NpaError:
        return
    for task in tasks:
        # One YAML document per wave of the stage, each a task mapping.
        docs = list(yaml.safe_load_all(task.text))
        assert docs and all(isinstance(doc, dict) for doc in docs)


plain_scalars = st.one_of(
    st.sampled_from(
        [
            "0x1F", "0o17", "017", "1_000", "1:20", "190:20:30.15", "+12", "-0", "1e3", "1.5e-3",
            ".inf", "-.Inf", ".NaN", "yes", "No", "ON", "off", "y", "n", "~", "null", "Null", "",
            "true", "False", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "0b101", "=", "<<x",
            "a", "-", "1.2.3", "12:30", "0.", ".5", "+.5", "08", "0x", "H100:8",
        ]
    ),
    st.text(alphabet="0123456789+-._:eExXoObyYnN~ ", min_size=1, max_size=8),
)  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(plain_scalars, min_size=1, max_size=6))
def test_values_get_the_same_types_as_the_safe_loader(scalars: list[str]) -> None:
    """The spec loader's faster resolver gives every plain scalar the tag PyYAML's safe loader
    gives it: ``1_000`` is a number, ``yes`` a boolean, ``2001-12-14`` a date, in both."""
    text = "".join(f"k{i}: {s}\n" for i, s in enumerate(scalars))
    text += "list: [" + ", ".join(s for s in scalars if s.strip() and "," not in s) + "]\n"
    try:
        expected = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    doc, problems = load_text(text)
    assert doc is not None, problems

    def same(a: Any, b: Any) -> bool:  # NaN is not equal to itself
        if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
            return True
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return type(a) is type(b) and a == b

    assert same(doc.data, expected), (doc.data, expected)
