"""The pulumi_backend fixture: a real Automation API stack on a file:// backend."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import KubeCluster
from tests.harness.pulumi import PulumiBackend

pytestmark = pytest.mark.integration


def _program(marker: Path) -> Any:
    import pulumi
    from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

    class MarkerProvider(ResourceProvider):
        """Writes a file on create and removes it on delete: a side effect the test can see."""

        def create(self, props: dict[str, Any]) -> CreateResult:
            Path(props["path"]).write_text(props["content"])
            return CreateResult(id_=props["path"], outs=props)

        def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
            changed = olds.get("content") != news.get("content")
            return DiffResult(changes=changed, replaces=["content"] if changed else [])

        def delete(self, _id: str, props: dict[str, Any]) -> None:
            Path(props["path"]).unlink(missing_ok=True)

    class Marker(Resource):
        def __init__(self, name: str, path: str, content: str) -> None:
            super().__init__(MarkerProvider(), name, {"path": path, "content": content})

    def program() -> None:
        m = Marker("marker", str(marker), "hello from a dynamic provider")
        pulumi.export("path", m.id)

    return program


def test_stack_preview_up_noop_destroy(pulumi_backend: PulumiBackend, tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    stack = pulumi_backend.stack("harness", _program(marker))
    first = stack.preview()
    assert first.change_summary.get("create") == 2  # the stack and the marker
    assert not marker.exists()  # preview mutates nothing

    up = stack.up()
    assert up.summary.result == "succeeded"
    assert marker.read_text() == "hello from a dynamic provider"
    assert up.outputs["path"].value == str(marker)

    again = stack.preview()
    assert set(again.change_summary) == {"same"}

    # The state lives in the file:// backend, where the plain CLI sees the stack too.
    listing = subprocess.run(
        [str(pulumi_backend.pulumi_bin), "stack", "ls", "--all", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **pulumi_backend.env},
        check=True,
    )
    assert [s["name"] for s in json.loads(listing.stdout)] == ["organization/npa-harness/harness"]

    assert stack.destroy().summary.result == "succeeded"
    assert not marker.exists()
    stack.workspace.remove_stack("harness")


def test_kubernetes_provider_plugin_creates_objects_in_the_kube_fixture(
    pulumi_backend: PulumiBackend, kube: KubeCluster, tmp_path: Path
) -> None:
    """bootstrap-tools installed the provider plugin the pinned pulumi-kubernetes SDK asks for."""
    from kubernetes.client.exceptions import ApiException

    name = "npa-harness-plugin"

    def program() -> None:
        import pulumi
        import pulumi_kubernetes as k8s

        provider = k8s.Provider(
            "fixture", kubeconfig=kube.kubeconfig.read_text(), context=kube.context
        )
        # The fixture runs no garbage collector, so a foreground delete (pulumi-kubernetes'
        # default) would wait forever on its finalizer: ask for background propagation.
        cm = k8s.core.v1.ConfigMap(
            "cm",
            metadata={
                "name": name,
                "namespace": "default",
                "annotations": {"pulumi.com/deletionPropagationPolicy": "background"},
            },
            data={"made-by": "pulumi-resource-kubernetes"},
            opts=pulumi.ResourceOptions(provider=provider),
        )
        pulumi.export("uid", cm.metadata.apply(lambda m: m["uid"]))

    stack = pulumi_backend.stack("plugin", program)
    up = stack.up()
    assert up.summary.result == "succeeded"
    live = kube.core().read_namespaced_config_map(name, "default")
    assert live.metadata.uid == up.outputs["uid"].value
    assert live.data == {"made-by": "pulumi-resource-kubernetes"}
    assert stack.destroy().summary.result == "succeeded"
    with pytest.raises(ApiException) as gone:
        kube.core().read_namespaced_config_map(name, "default")
    assert gone.value.status == 404
    stack.workspace.remove_stack("plugin")
