"""Where a jobs controller pod is and whether its kubelet answers, asked of a real API server
(the kube fixture: etcd + kube-apiserver, the test playing scheduler and kubelet). The case of a
kubelet that answers, and of one stopped under a running job, is the cluster tier's
(tests/integration/test_cluster_skypilot.py, the control plane and kubelet test)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from npa.adapters.kube.controller import controller_reach
from npa.adapters.skypilot.api import CONTROLLER_PREFIX
from tests.harness.kube import KubeCluster
from tests.harness.procs import free_port

pytestmark = pytest.mark.integration


def _namespace(kube: KubeCluster) -> str:
    from kubernetes import client

    name = f"npa-reach-{uuid.uuid4().hex[:6]}"
    kube.core().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def _controller_pod(kube: KubeCluster, namespace: str, node: str | None) -> str:
    from kubernetes import client

    name = f"{CONTROLLER_PREFIX}{uuid.uuid4().hex[:8]}-head"
    spec = client.V1PodSpec(
        containers=[client.V1Container(name="ray-node", image="example.invalid/sky:1")],
        node_name=node,
    )
    kube.core().create_namespaced_pod(
        namespace, client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec)
    )
    return name


def test_no_controller_pod_is_absent(kube: KubeCluster) -> None:
    namespace = _namespace(kube)
    reach = controller_reach(kube.kubeconfig, kube.context, namespace, CONTROLLER_PREFIX)
    assert (reach.answer, reach.pod) == ("absent", None), reach
    assert namespace in reach.detail


def test_a_controller_pod_on_no_node_is_unreachable(kube: KubeCluster) -> None:
    namespace = _namespace(kube)
    pod = _controller_pod(kube, namespace, None)
    reach = controller_reach(kube.kubeconfig, kube.context, namespace, CONTROLLER_PREFIX)
    assert (reach.answer, reach.pod, reach.node) == ("unreachable", pod, None), reach
    assert "on no node yet" in reach.detail, reach


def test_a_controller_on_a_node_whose_kubelet_is_gone_names_the_node(kube: KubeCluster) -> None:
    """The node's kubelet endpoint is a closed port on loopback: the API server's proxy to it
    fails as SkyPilot's exec into the controller does, and the answer says where and why."""
    namespace = _namespace(kube)
    node = f"npa-reach-node-{uuid.uuid4().hex[:6]}"
    kube.create_node(node)
    port = free_port()  # nothing listens there
    kube.core().patch_node_status(
        node,
        {
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            }
        },
    )
    pod = _controller_pod(kube, namespace, node)
    reach = controller_reach(kube.kubeconfig, kube.context, namespace, CONTROLLER_PREFIX)
    assert (reach.answer, reach.pod, reach.node) == ("unreachable", pod, node), reach
    assert f"runs on node {node}, whose kubelet does not answer" in reach.detail, reach


def test_an_api_server_that_does_not_answer_is_unknown(kube: KubeCluster, tmp_path: Path) -> None:
    """A kubeconfig whose server is a closed port: the cluster cannot be asked, so nothing is
    claimed about the controller."""
    text = kube.kubeconfig.read_text().replace(kube.server, f"https://127.0.0.1:{free_port()}")
    config = tmp_path / "kubeconfig"
    config.write_text(text)
    reach = controller_reach(config, kube.context, "anything", CONTROLLER_PREFIX)
    assert reach.answer == "unknown", reach
    assert "cannot list the pods of anything" in reach.detail, reach
