"""One list of targets and one check of --target, for provisioning and planning alike; the
kubernetes target plans a cluster that exists (no disks, no cloud quota)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.core.errors import InvalidInput
from npa.core.targets import TARGETS, checked_target
from tests.harness.cli import invoke_npa
from tests.tiers import examples

pytestmark = pytest.mark.unit

WF = ("workbench", "workflow")
PHYSAI = "examples/physical-ai.yaml"


def test_every_target_is_itself() -> None:
    assert [checked_target(t, ["provision-if-absent"]) for t in TARGETS] == list(TARGETS)


@settings(max_examples=examples(80), deadline=None)
@given(target=st.sampled_from(TARGETS), data=st.data())
def test_a_typo_of_a_target_names_it_in_the_error_and_the_fix(
    target: str, data: st.DataObject
) -> None:
    # One letter dropped, doubled or changed, or the case changed: the nearest target is named.
    i = data.draw(st.integers(0, len(target) - 1))
    typo = data.draw(st.sampled_from([
        target[:i] + target[i + 1:], target[:i] + target[i] * 2 + target[i + 1:],
        target[:i] + ("x" if target[i] != "x" else "y") + target[i + 1:], target.upper(),
    ]))  # fmt: skip
    with pytest.raises(InvalidInput) as raised:
        checked_target(typo, ["plan-spec"], ["s.yaml"])
    assert f"did you mean {target!r}" in raised.value.message
    assert raised.value.fix == f"npa plan-spec s.yaml --target {target}"


def test_a_word_near_no_target_points_to_help() -> None:
    with pytest.raises(InvalidInput) as raised:
        checked_target("aws", ["provision-if-absent"], ["--project", "p"])
    assert "not one of: local, kubernetes, nebius" in raised.value.message
    assert raised.value.fix == "npa provision-if-absent --help"


def test_plan_spec_and_provision_refuse_the_same_typo_the_same_way() -> None:
    plan = invoke_npa(*WF, "plan-spec", PHYSAI, "--run-id", "r-1", "--target", "kubernets",
                      "--json")  # fmt: skip
    prov = invoke_npa("provision-if-absent", "--project", "p", "--target", "kubernets", "--json")
    for res in (plan, prov):
        assert res.code == 2, res.stdout + res.stderr
        assert "did you mean 'kubernetes'" in res.json()["error"]["message"]
    assert plan.json()["error"]["fix"] == (
        f"npa workbench workflow plan-spec {PHYSAI} --run-id r-1 --target kubernetes"
    )
    assert prov.json()["error"]["fix"] == "npa provision-if-absent --project p --target kubernetes"


def test_plan_spec_for_an_existing_cluster_has_no_disks_and_no_quota_to_check() -> None:
    args = (*WF, "plan-spec", PHYSAI, "--run-id", "r-1", "--target", "kubernetes")
    text = invoke_npa(*args)
    assert text.code == 0, text.stdout + text.stderr
    assert "target kubernetes" in text.stdout
    assert "no disks: the cluster exists" in text.stdout
    assert "GiB network-ssd" not in text.stdout  # nebius' disks are not planned there
    assert "quota: NOT-CHECKED: an existing cluster has no cloud quota" in text.stdout
    assert f"npa workbench workflow gpus --context nebius-physai --spec {PHYSAI}" in text.stdout
    js = invoke_npa(*args, "--json").json()
    assert js["target"] == "kubernetes" and js["plan"]["disks"] == []
    assert js["quota"]["verdict"] == "not-checked" and js["quota"]["lines"] == []
    assert [s["name"] for s in js["plan"]["stages"]] == ["curate", "augment", "evaluate"]


@pytest.mark.parametrize(
    "extra",
    [["--quota-file", "examples/quota-ample.yaml"], ["--nebius-project", "project-e00x"],
     ["--quota-file", "examples/quota-ample.yaml", "--nebius-project", "project-e00x"]],
    ids=["quota-file", "nebius-project", "both"],
)  # fmt: skip
def test_cloud_quota_evidence_is_refused_for_an_existing_cluster(extra: list[str]) -> None:
    res = invoke_npa(*WF, "plan-spec", PHYSAI, "--run-id", "r-1", "--target", "kubernetes",
                     "--project", "team", *extra, "--json")  # fmt: skip
    assert res.code == 2, res.stdout + res.stderr
    error = res.json()["error"]
    assert "the kubernetes target is a cluster that exists" in error["message"]
    for flag in extra[::2]:
        assert flag in error["message"]
    assert error["fix"] == (
        f"npa workbench workflow plan-spec {PHYSAI} --run-id r-1 --target kubernetes --project team"
    )


def test_a_quota_api_project_for_a_target_without_one_is_refused(tmp_path: Path) -> None:
    # Before, the local target took --nebius-project to the quota API with no region and
    # stopped on an AssertionError; only a target that declares AsksQuotaApi asks one.
    res = invoke_npa(*WF, "plan-spec", "examples/tiny-local.yaml", "--run-id", "r-1",
                     "--target", "local", "--nebius-project", "project-e00x", "--json",
                     env={"NPA_HOME": str(tmp_path)})  # fmt: skip
    assert res.code == 2, res.stdout + res.stderr
    error = res.json()["error"]
    assert error["message"] == (
        "--nebius-project names a cloud quota API; the local target has none to ask"
    )
    assert error["fix"] == (
        "npa workbench workflow plan-spec examples/tiny-local.yaml --run-id r-1 --target local"
    )
