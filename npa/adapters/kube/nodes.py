"""What GPUs each node offers: its GPU label, allocatable GPUs and what is still requestable;
and the GPU type names a cluster's node labels carry."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from npa.adapters.kube.client import REQUEST_TIMEOUT, core_api

# Labels that carry a node's GPU type, most specific first.
GPU_LABELS = (
    "skypilot.co/accelerator",
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "gpu.nvidia.com/class",
)


GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
# Pods in these phases no longer hold their requests.
_DONE = frozenset({"Succeeded", "Failed"})


class NodeGpus(BaseModel):
    node: str
    labels: dict[str, str]
    resource: str | None  # nvidia.com/gpu, ...
    allocatable: int
    requested: int
    requestable: int
    ready: bool
    schedulable: bool


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _requested(pods: list[Any]) -> dict[tuple[str, str], int]:
    """GPUs the scheduled, unfinished pods request, per (node, GPU resource)."""
    requested: dict[tuple[str, str], int] = {}
    for pod in pods:
        if not pod.spec.node_name or (pod.status and pod.status.phase in _DONE):
            continue
        for container in pod.spec.containers or []:
            wants = (container.resources.requests or {}) if container.resources else {}
            for gpu in GPU_RESOURCES:
                if gpu in wants:
                    key = (str(pod.spec.node_name), gpu)
                    requested[key] = requested.get(key, 0) + _quantity(wants[gpu])
    return requested


def _node(node: Any, requested: dict[tuple[str, str], int]) -> NodeGpus:
    allocatable = node.status.allocatable or {}
    resource: str | None = next((r for r in GPU_RESOURCES if r in allocatable), None)
    count = _quantity(allocatable[resource]) if resource else 0
    used = requested.get((node.metadata.name, resource or ""), 0)
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    return NodeGpus(
        node=node.metadata.name,
        labels=dict(node.metadata.labels or {}),
        resource=resource,
        allocatable=count,
        requested=used,
        requestable=max(0, count - used),
        ready=ready,
        schedulable=not (node.spec and node.spec.unschedulable),
    )


def node_gpus(kubeconfig: Path, context: str | None) -> list[NodeGpus]:
    """Every node with its GPUs (raises whatever the client raises)."""
    api = core_api(kubeconfig, context)
    nodes = api.list_node(_request_timeout=REQUEST_TIMEOUT).items
    pods = api.list_pod_for_all_namespaces(_request_timeout=REQUEST_TIMEOUT).items
    requested = _requested(pods)
    return [_node(node, requested) for node in sorted(nodes, key=lambda n: n.metadata.name)]


def cluster_names(labels: Iterable[dict[str, str]]) -> list[str]:
    """Distinct GPU label values across nodes (one label per node, the most specific)."""
    found: set[str] = set()
    for node in labels:
        for key in GPU_LABELS:
            if node.get(key):
                found.add(node[key])
                break
    return sorted(found)


def gpu_label_values(kubeconfig: Path, context: str) -> list[str]:
    """The distinct GPU type names the context's nodes carry (raises on any API error)."""
    api = core_api(kubeconfig, context)
    nodes = api.list_node(_request_timeout=REQUEST_TIMEOUT).items
    return cluster_names(dict(n.metadata.labels or {}) for n in nodes)
