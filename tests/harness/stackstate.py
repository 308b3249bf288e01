"""Pulumi stack state as data: a ``file://`` backend's checkpoint in the shape the pulumi CLI
writes it (version 3), holding the resources npa's nebius stack records (the agent's disk and
the node groups), so a test can cite a stack without creating one in a cloud."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STACK = "pulumi:pulumi:Stack"
DISK = "nebius:index/computeV1Disk:ComputeV1Disk"
NODE_GROUP = "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup"
PROVIDER = "pulumi:providers:nebius"


def urn(stack: str, kind: str, name: str, project: str = "npa") -> str:
    return f"urn:pulumi:{stack}::{project}::{kind}::{name}"


def agent_disk(
    stack: str, disk_id: str, size_gib: int, disk_type: str = "NETWORK_SSD"
) -> dict[str, Any]:
    """The agent's boot disk as the nebius stack records it."""
    return {
        "urn": urn(stack, DISK, "agent-boot-disk"),
        "custom": True,
        "id": disk_id,
        "type": DISK,
        "outputs": {"sizeGibibytes": size_gib, "type": disk_type},
    }


def node_group(
    stack: str, role: str, group_id: str, count: int, size_gib: int, disk_type: str = "NETWORK_SSD"
) -> dict[str, Any]:
    """A node group (``role`` cpu or gpu) as the nebius stack records it."""
    return {
        "urn": urn(stack, NODE_GROUP, f"{role}-nodes"),
        "custom": True,
        "id": group_id,
        "type": NODE_GROUP,
        "outputs": {
            "fixedNodeCount": count,
            "template": {"bootDisk": {"sizeGibibytes": size_gib, "type": disk_type}},
        },
    }


def checkpoint(
    stack: str, outputs: dict[str, Any], resources: list[dict[str, Any]], project: str = "npa"
) -> dict[str, Any]:
    """The checkpoint file's document: the stack's root resource (which holds the outputs), a
    provider, and ``resources`` under them."""
    root = urn(stack, STACK, f"{project}-{stack}", project)
    provider = urn(stack, PROVIDER, "default", project)
    placed = [{**r, "parent": root, "provider": f"{provider}::provider-1"} for r in resources if r]
    return {
        "version": 3,
        "checkpoint": {
            "stack": f"organization/{project}/{stack}",
            "latest": {
                "manifest": {"time": "2026-12-03T00:00:00Z", "magic": "", "version": "v3.260.0"},
                "resources": [
                    {"urn": root, "custom": False, "type": STACK, "outputs": outputs},
                    {"urn": provider, "custom": True, "id": "provider-1", "type": PROVIDER},
                    *placed,
                ],
            },
        },
    }


def write_checkpoint(
    backend_dir: Path,
    stack: str,
    outputs: dict[str, Any],
    resources: list[dict[str, Any]],
    project: str = "npa",
) -> Path:
    """Write the stack's checkpoint where a ``file://backend_dir`` backend keeps it."""
    path = backend_dir / ".pulumi" / "stacks" / project / f"{stack}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(checkpoint(stack, outputs, resources, project)))
    return path


def nebius_stack(
    backend_dir: Path,
    stack: str = "npa-physai-nebius",
    *,
    agent_gib: int = 100,
    cpu: tuple[int, int] = (1, 128),
    gpu: tuple[int, int] = (1, 1023),
) -> Path:
    """The state of a nebius stack npa created: the agent disk, the CPU and GPU node groups
    (count, disk GiB), and the outputs the stack exports for them."""
    outputs = {
        "agent_boot_disk_id": "computedisk-e00agent",
        "cpu_node_group_id": "mk8snodegroup-e00cpu",
        "gpu_node_group_id": "mk8snodegroup-e00gpu",
        "cluster_id": "mk8scluster-e00one",
    }
    resources = [
        agent_disk(stack, "computedisk-e00agent", agent_gib),
        node_group(stack, "cpu", "mk8snodegroup-e00cpu", *cpu),
        node_group(stack, "gpu", "mk8snodegroup-e00gpu", *gpu),
    ]
    return write_checkpoint(backend_dir, stack, outputs, resources)
