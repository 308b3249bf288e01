"""Pure parts of provisioning: engine events to changes, names, layout and the resume command."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from npa.adapters.infra.changes import change_from_event, merge
from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths
from npa.services.provision import layout, namespace_for, stack_token

pytestmark = pytest.mark.unit


def _event(
    op: str,
    urn: str,
    old: Any = None,
    new: Any = None,
    diffs: Any = None,
    *,
    outputs: Any = None,
    detailed: dict[str, Any] | None = None,
) -> Any:
    """A real Automation API ``EngineEvent`` parsed from the JSON the engine writes."""
    from pulumi.automation.events import EngineEvent

    kind = urn.split("::")[-2]

    def state(inputs: Any, outs: Any) -> dict[str, Any]:
        return {"type": kind, "urn": urn, "inputs": inputs, "outputs": outs or {}}

    metadata: dict[str, Any] = {"op": op, "urn": urn, "type": kind, "provider": "", "diffs": diffs}
    if old is not None:
        metadata["old"] = state(old, outputs)
    if new is not None:
        metadata["new"] = state(new, None)
    if detailed is not None:
        metadata["detailedDiff"] = detailed
    return EngineEvent.from_json(
        {"sequence": 1, "timestamp": 0, "resourcePreEvent": {"metadata": metadata}}
    )


URN = "urn:pulumi:p.local::npa::pulumi-python:dynamic/npa:Directory::store"


def test_update_shows_old_and_new_and_hides_provider_blob() -> None:
    change = change_from_event(
        _event(
            "update",
            URN,
            old={"path": "/a", "__provider": "blob"},
            new={"path": "/b", "__provider": "blob2"},
            diffs=["path", "__provider"],
        )
    )
    assert change is not None
    assert change.op == "update"
    assert [(p.path, p.kind, p.old, p.new) for p in change.properties] == [
        ("path", "update", "/a", "/b")
    ]


def test_stack_and_provider_steps_are_not_reported() -> None:
    stack = "urn:pulumi:p.local::npa::pulumi:pulumi:Stack::npa-p.local"
    assert change_from_event(_event("create", stack, new={})) is None
    assert change_from_event(SimpleNamespace(resource_pre_event=None)) is None


def test_a_step_beats_the_read_back_before_it() -> None:
    refresh = change_from_event(_event("refresh", URN, old={"path": "/a"}, new={"path": "/a"}))
    create = change_from_event(_event("create", URN, new={"path": "/a"}))
    same = change_from_event(_event("same", URN, old={"path": "/a"}, new={"path": "/a"}))
    assert refresh and create and same
    assert [c.op for c in merge([refresh, create])] == ["create"]
    assert [c.op for c in merge([refresh, same])] == ["same"]


NS = "urn:pulumi:p.kubernetes.c::npa::kubernetes:core/v1:Namespace::namespace"


def test_a_nested_change_is_shown_leaf_by_leaf_in_pulumi_style() -> None:
    old = {"metadata": {"name": "npa-p", "labels": {"team": "a", "gone": "x"}}, "__provider": "b"}
    new = {"metadata": {"name": "npa-p", "labels": {"team": "b", "app.kubernetes.io/x": "y"}}}
    change = change_from_event(_event("update", NS, old=old, new=new, diffs=["metadata"]))
    assert change is not None
    assert [p.text() for p in change.properties] == [
        '+ metadata.labels["app.kubernetes.io/x"]: "y"',
        '- metadata.labels.gone: "x"',
        '~ metadata.labels.team: "a" => "b"',
    ]
    assert not any("{" in p.text() or "'" in p.text() for p in change.properties)


def test_a_detailed_diff_takes_old_values_from_outputs_and_marks_replacements() -> None:
    change = change_from_event(
        _event(
            "replace",
            NS,
            old={"metadata": {"name": "a"}},
            outputs={"metadata": {"name": "a", "uid": "1"}, "spec": {"finalizers": ["k"]}},
            new={"metadata": {"name": "b"}, "spec": {"finalizers": ["k", "z"]}},
            detailed={
                "metadata.name": {"diffKind": "update-replace", "inputDiff": False},
                "spec.finalizers[1]": {"diffKind": "add", "inputDiff": False},
            },
        )
    )
    assert change is not None and change.op == "replace"
    assert [p.text() for p in change.properties] == [
        '~ metadata.name: "a" => "b"  (forces replacement)',
        '+ spec.finalizers[1]: "z"',
    ]


def test_secrets_are_masked_and_long_values_are_never_cut() -> None:
    secret = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}
    long = "x" * 500
    change = change_from_event(
        _event("update", URN, old={"token": secret, "doc": "a"}, new={"token": secret, "doc": long})
    )
    assert change is not None
    [doc] = change.properties
    assert doc.new == long and doc.text().endswith(f'"{long}"')
    created = change_from_event(_event("create", URN, new={"token": secret}))
    assert created is not None and created.properties[0].text() == '+ token: "[secret]"'


def test_an_update_with_equal_inputs_shows_what_was_read_back() -> None:
    # A dynamic provider compares the fingerprint it read back (an output) with the input.
    inputs = {"destination": "/k", "fingerprint": "sha256:new"}
    change = change_from_event(
        _event(
            "update", URN, old=inputs, new=inputs, outputs={**inputs, "fingerprint": "sha256:old"}
        )
    )
    assert change is not None
    assert [p.text() for p in change.properties] == ['~ fingerprint: "sha256:old" => "sha256:new"']


def test_names() -> None:
    assert stack_token("kind-npa") == "kind-npa"
    odd = stack_token("admin@prod:1")
    assert odd.startswith("admin-prod-1-") and odd != stack_token("admin@prod+1")
    assert namespace_for("Team_A") == "npa-team-a"
    assert len(namespace_for("x" * 100)) <= 63


def test_layout_of_each_target(tmp_path: Path) -> None:
    paths = NpaPaths(tmp_path / ".npa")
    local = layout(paths, "p", "local", context=None, kubeconfig=None)
    assert [s.name for s in local.stacks] == ["p.local"]
    assert local.stacks[0].config["npa:storeDir"] == str(paths.local_store)
    nebius = layout(paths, "p", "nebius", context=None, kubeconfig=None)
    assert [s.name for s in nebius.stacks] == ["p.nebius", "p.kubernetes.nebius-p"]
    assert nebius.stacks[0].config["npa:gpuDiskGib"] == "1023"
    with pytest.raises(InvalidInput) as bad:
        layout(paths, "p", "aws", context=None, kubeconfig=None)
    assert bad.value.fix is not None


def test_kubernetes_layout_checks_the_context(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: a, context: {cluster: c, user: u}}]\n"
    )
    paths = NpaPaths(tmp_path / ".npa")
    # The layout takes the context its caller chose (choose_context): it guesses none itself.
    with pytest.raises(InvalidInput, match="needs a kube context"):
        layout(paths, "p", "kubernetes", context=None, kubeconfig=kubeconfig)
    lay = layout(paths, "p", "kubernetes", context="a", kubeconfig=kubeconfig)
    assert lay.context == "a"
    assert lay.stacks[0].config["npa:kubeconfigPath"] == str(paths.cluster_kubeconfig("a"))
    with pytest.raises(InvalidInput, match="no context 'b'"):
        layout(paths, "p", "kubernetes", context="b", kubeconfig=kubeconfig)


def test_minimal_kubeconfig_keeps_one_context(tmp_path: Path) -> None:
    import yaml

    from stacks.localfs import minimal_kubeconfig

    source = tmp_path / "config"
    source.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c1, cluster: {server: s1, certificate-authority: ca.crt}},"
        " {name: c2, cluster: {server: s2}}]\n"
        "users: [{name: u1, user: {token: t1}}, {name: u2, user: {token: t2}}]\n"
        "contexts: [{name: a, context: {cluster: c1, user: u1}},"
        " {name: b, context: {cluster: c2, user: u2}}]\n"
    )
    placed = yaml.safe_load(minimal_kubeconfig(str(source), "a"))
    assert [c["name"] for c in placed["clusters"]] == ["c1"]
    assert [u["name"] for u in placed["users"]] == ["u1"]
    assert placed["current-context"] == "a"
    # Relative file references still point at the same files from the new location.
    assert placed["clusters"][0]["cluster"]["certificate-authority"] == str(tmp_path / "ca.crt")


def _resource(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "urn": f"urn:pulumi:s::npa::{kind}::{name}"}


def test_a_failure_report_takes_what_the_state_recorded_and_no_event_said() -> None:
    """The engine can record a step that finished beside a failing one without its event
    reaching the handler: the report reads the state too, and names each step once."""
    from npa.adapters.infra.progress import EngineWatch, state_steps

    stack = _resource("pulumi:pulumi:Stack", "npa-s")
    provider = _resource("pulumi:providers:kubernetes", "default")
    kept = _resource("npa:Directory", "kept")
    gone = _resource("npa:Directory", "gone")
    made = _resource("npa:Directory", "made")
    before = [stack, provider, kept, gone]
    after = [stack, provider, kept, made, _resource("pulumi:providers:aws", "new")]
    assert state_steps(before, after) == [
        "created npa:Directory made",
        "deleted npa:Directory gone",
    ]
    assert state_steps(after, after) == []

    watch = EngineWatch("s")
    watch.completed.append("deleted npa:Directory gone")  # the one event that did arrive
    watch.settle(before, after)
    assert watch.completed == ["deleted npa:Directory gone", "created npa:Directory made"]
