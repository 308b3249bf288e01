"""One rule for kube context names (npa.core.paths.context_problem), held by every place that
takes one: the spec's infrastructure.context, render's --context, the task renderer, and the
context folder every other command (provision, gpus, skypilot, configure, submit's --infra)
goes through. The rule is checked against SkyPilot's own parser of ``infra: k8s/<context>``:
a name npa accepts reaches SkyPilot unchanged, and a name SkyPilot would change or refuse is
refused before anything is written."""

from __future__ import annotations

import contextlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.core.errors import InvalidInput
from npa.core.paths import check_context_name, context_folder, context_from_folder, context_problem
from npa.render.tasks import check_names
from npa.spec.validate import validate_text
from tests.tiers import examples
from tests.unit.specdata import base_spec, dump

# Names kubectl users have: EKS ARNs, user@cluster forms, GKE and kind names, spaces inside.
REAL = [
    "gpu-prod",
    "arn:aws:eks:us-east-1:123456789012:cluster/gpu-prod",
    "arn:aws-cn:eks:cn-north-1:123456789012:cluster/a.b",
    "user@team/ctx",
    "gke_my-project_us-central1-a_training",
    "kind-kind",
    "minikube",
    "system:admin/api-ocp-example-com:6443/kube:admin",
    "my cluster",
    "ctx+dev_1.2",
    "Ünïcode-ctx",
]
REFUSED = ["", "/lead", "trail/", "a//b", " pad", "pad ", "a /b", "a/ b", "a\nb", "tab\there"]


def skypilot_reads(name: str) -> str | None:
    """The context SkyPilot reads from ``infra: k8s/<name>`` (None when it refuses it)."""
    from sky.utils.infra_utils import InfraInfo

    # SkyPilot raises its refusal inside ux_utils.print_exception_no_traceback, which sets
    # sys.tracebacklimit to 0 and never puts it back when the block raises: every later
    # traceback.extract_stack in this process comes back empty (Pulumi's mocks then fail).
    before = getattr(sys, "tracebacklimit", None)
    try:
        return InfraInfo.from_str(f"k8s/{name}").region
    except ValueError:
        return None
    finally:
        if before is None:
            with contextlib.suppress(AttributeError):
                del sys.tracebacklimit
        else:
            sys.tracebacklimit = before


def _spec_accepts(name: str) -> bool:
    spec = base_spec()
    spec["infrastructure"]["context"] = name
    _, issues = validate_text(dump(spec))
    return not [i for i in issues if i.path == "infrastructure.context"]


def _render_accepts(name: str) -> bool:
    try:
        check_names(name, None)
    except InvalidInput:
        return False
    return True


def _folder_accepts(name: str) -> bool:
    try:
        check_context_name(name)
    except InvalidInput:
        return False
    assert context_from_folder(context_folder(name)) in (name, None)
    return True


@pytest.mark.parametrize("name", REAL)
def test_real_context_names_are_accepted_everywhere_and_reach_skypilot_unchanged(
    name: str,
) -> None:
    assert context_problem(name) is None
    assert _spec_accepts(name) and _render_accepts(name) and _folder_accepts(name)
    assert skypilot_reads(name) == name


@pytest.mark.parametrize("name", REFUSED)
def test_names_skypilot_cannot_address_are_refused_everywhere_with_why(name: str) -> None:
    assert context_problem(name)
    assert not _spec_accepts(name)
    assert not _render_accepts(name)
    assert not _folder_accepts(name)


NAMES = st.one_of(
    st.text(alphabet=st.sampled_from("ab:/@. -_\t\n\x7f\u00a0\u2003é"), max_size=12),
    st.sampled_from(REAL + REFUSED),
)


@settings(max_examples=examples(300))
@given(NAMES)
def test_every_taker_decides_as_the_one_rule_and_the_rule_matches_skypilot(name: str) -> None:
    accepted = context_problem(name) is None
    assert _spec_accepts(name) is accepted
    assert _render_accepts(name) is accepted
    assert _folder_accepts(name) is accepted
    if accepted:
        assert skypilot_reads(name) == name
    elif not any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        # Refused for SkyPilot's sake only: SkyPilot indeed drops or changes it.
        assert skypilot_reads(name) != name
