"""The one rule that names a run's Secret (its declared secrets, on the SkyPilot backend)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.kube.secrets import SECRET_NAME, run_secret_name
from npa.spec.model import DNS_LABEL
from tests.tiers import examples

pytestmark = pytest.mark.unit

# A Kubernetes object name (DNS-1123 subdomain), as the API server checks it.
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
run_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}", fullmatch=True)
workflows = st.from_regex(DNS_LABEL, fullmatch=True)


@settings(max_examples=examples(200), deadline=None)
@given(workflows, run_ids, workflows, run_ids)
def test_the_run_secret_name_is_a_kubernetes_name_of_that_run_alone(
    workflow: str, run_id: str, other_workflow: str, other_run: str
) -> None:
    name = run_secret_name(workflow, run_id)
    assert OBJECT_NAME.fullmatch(name) and len(name) <= 253
    assert name == run_secret_name(workflow, run_id)  # deterministic: submit, cancel, the end
    assert name != SECRET_NAME and name.startswith("npa-secrets-")
    if (workflow, run_id) != (other_workflow, other_run):
        assert name != run_secret_name(other_workflow, other_run)


def test_a_generated_run_id_names_its_secret_readably() -> None:
    assert run_secret_name("tiny", "20260101-120000-a1b2c3") == (
        "npa-secrets-tiny-20260101-120000-a1b2c3"
    )
