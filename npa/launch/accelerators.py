"""Accelerator names as the cluster spells them.

Kubernetes schedulers see GPUs by node-label values, and those values differ from the names in
a spec (``H100`` against ``nvidia-h100-80gb-hbm3`` or ``H100-80GB``) and can change while the
GPU operator is still labelling nodes. Submit reads the labels of the selected context's nodes
and renames each spec accelerator to the one label value it matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel

# Labels that carry a node's GPU type, most specific first.
GPU_LABELS = (
    "skypilot.co/accelerator",
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "gpu.nvidia.com/class",
)


class AcceleratorRemap(BaseModel):
    requested: str
    resolved: str | None
    candidates: list[str]
    detail: str


def _norm(name: str) -> str:
    text = name.lower()
    for noise in ("nvidia-", "nvidia_", "tesla-", "nvidia"):
        text = text.removeprefix(noise)
    return re.sub(r"[^a-z0-9]", "", text)


def cluster_names(labels: Iterable[dict[str, str]]) -> list[str]:
    """Distinct GPU label values across nodes (one label per node, the most specific)."""
    found: set[str] = set()
    for node in labels:
        for key in GPU_LABELS:
            if node.get(key):
                found.add(node[key])
                break
    return sorted(found)


def resolve(requested: str, names: list[str]) -> AcceleratorRemap:
    """The cluster name for ``requested``: an exact (case-insensitive) match, else the one name
    whose normalised form starts with the requested one. Ambiguity keeps the spec's name."""
    exact = [n for n in names if n.lower() == requested.lower()]
    if exact:
        return AcceleratorRemap(
            requested=requested, resolved=exact[0], candidates=exact, detail="exact"
        )
    want = _norm(requested)
    matches = [n for n in names if want and _norm(n).startswith(want)]
    if len(matches) == 1:
        return AcceleratorRemap(
            requested=requested, resolved=matches[0], candidates=matches, detail="node label"
        )
    why = "no node label matches" if not matches else "several node labels match"
    return AcceleratorRemap(requested=requested, resolved=None, candidates=matches, detail=why)


def node_labels(kubeconfig: Path, context: str) -> list[dict[str, str]]:
    """Labels of every node of the context (raises on any API error)."""
    from kubernetes import client, config

    api = client.CoreV1Api(
        config.new_client_from_config(config_file=str(kubeconfig), context=context)
    )
    return [dict(n.metadata.labels or {}) for n in api.list_node(_request_timeout=10).items]
