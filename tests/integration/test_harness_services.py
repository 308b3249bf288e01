"""Each harness fixture proven by real work through it."""

from __future__ import annotations

import pytest
import requests

from tests.harness.kube import KubeCluster
from tests.harness.registry import OCI_INDEX, OCI_MANIFEST, Registry, sha256_digest
from tests.harness.s3 import S3Server

pytestmark = pytest.mark.integration

# The Accept list a container runtime sends when it pulls by tag.
PULL_ACCEPT = ", ".join(
    [
        OCI_INDEX,
        OCI_MANIFEST,
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def test_s3_put_list_get(s3: S3Server) -> None:
    client = s3.client()
    client.create_bucket(Bucket="npa-runs")
    for i in range(3):
        client.put_object(Bucket="npa-runs", Key=f"wf/run-1/npa-workflow/part-{i}", Body=b"x" * i)
    listed = client.list_objects_v2(Bucket="npa-runs", Prefix="wf/run-1/")
    assert [o["Key"] for o in listed["Contents"]] == [
        f"wf/run-1/npa-workflow/part-{i}" for i in range(3)
    ]
    assert client.get_object(Bucket="npa-runs", Key="wf/run-1/npa-workflow/part-2")[
        "Body"
    ].read() == (b"xx")
    # Real HTTP: the endpoint is a loopback URL, not an in-process patch.
    assert s3.endpoint_url.startswith("http://127.0.0.1:")


def test_s3_is_emptied_between_tests(s3: S3Server) -> None:
    assert s3.client().list_buckets()["Buckets"] == []


def test_registry_manifest_head_returns_pushed_digest(registry: Registry) -> None:
    pushed = registry.push_image("harness/single", "v1", labels={"org.npa.contract": "1"})
    resp = requests.head(
        f"{registry.url}/v2/harness/single/manifests/v1",
        auth=registry.auth,
        headers={"Accept": PULL_ACCEPT},
        timeout=10,
    )
    assert resp.status_code == 200
    assert resp.headers["Docker-Content-Digest"] == pushed.digest
    # GET by digest returns bytes that hash to that digest.
    body = requests.get(
        f"{registry.url}/v2/harness/single/manifests/{pushed.digest}",
        auth=registry.auth,
        headers={"Accept": PULL_ACCEPT},
        timeout=10,
    ).content
    assert sha256_digest(body) == pushed.digest


def test_registry_index_is_served_as_an_index(registry: Registry) -> None:
    pushed = registry.push_image("harness/multi", "v2", index=True)
    resp = requests.head(
        f"{registry.url}/v2/harness/multi/manifests/v2",
        auth=registry.auth,
        headers={"Accept": PULL_ACCEPT},
        timeout=10,
    )
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == OCI_INDEX
    assert resp.headers["Docker-Content-Digest"] == pushed.digest
    assert pushed.digest != pushed.manifest_digest


def test_registry_rejects_wrong_credentials(registry: Registry) -> None:
    registry.push_image("harness/private", "v1")
    url = f"{registry.url}/v2/harness/private/manifests/v1"
    wrong = requests.head(url, auth=("npa-pusher", "wrong"), timeout=10)
    assert wrong.status_code == 401
    assert wrong.headers["WWW-Authenticate"].startswith("Basic ")
    assert requests.head(url, timeout=10).status_code == 401


def test_kube_readyz_nodes_and_pod_status(kube: KubeCluster) -> None:
    from kubernetes import client

    assert kube.readyz() == 200
    kube.create_node(
        "gpu-node-1",
        labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        gpus=8,
    )
    core = kube.core()
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert nodes["gpu-node-1"].status.allocatable["nvidia.com/gpu"] == "8"
    assert nodes["gpu-node-1"].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"

    core.create_namespaced_pod(
        "default",
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="stage-curate"),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(name="main", image="127.0.0.1:1/x@sha256:" + "0" * 64)
                ]
            ),
        ),
    )
    kube.set_pod_status(
        "default",
        "stage-curate",
        waiting_reason="ImagePullBackOff",
        waiting_message="Back-off pulling image",
    )
    pod = core.read_namespaced_pod_status("stage-curate", "default")
    assert pod.status.phase == "Pending"
    assert pod.status.container_statuses[0].state.waiting.reason == "ImagePullBackOff"

    kube.set_pod_status(
        "default",
        "stage-curate",
        unschedulable_message="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
    )
    pod = core.read_namespaced_pod_status("stage-curate", "default")
    scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in scheduled.message
    core.delete_namespaced_pod("stage-curate", "default", grace_period_seconds=0)
