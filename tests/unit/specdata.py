"""Spec documents for tests: a small valid workflow to mutate, and YAML helpers."""

from __future__ import annotations

import copy
from typing import Any

import yaml

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def base_spec() -> dict[str, Any]:
    """A valid three-stage workflow (curate -> augment -> evaluate) as plain data."""
    return copy.deepcopy(
        {
            "apiVersion": "npa/v1",
            "kind": "Workflow",
            "metadata": {"name": "demo"},
            "storage": {"uri": "s3://bucket/workflows"},
            "tools": {
                "cur": {"image": "registry.example.com/cur:1.0"},
                "gpu": {"image": f"registry.example.com/gpu@{DIGEST_B}"},
            },
            "stages": [
                {
                    "name": "curate",
                    "tool": "cur",
                    "command": "echo curate",
                    "inputs": [{"name": "raw", "uri": "s3://raw/data/"}],
                    "outputs": [{"name": "clips", "path": "curated/clips/"}],
                },
                {
                    "name": "augment",
                    "tool": "gpu",
                    "command": "echo augment",
                    "inputs": [{"name": "clips", "from": "curate.clips"}],
                    "outputs": [{"name": "aug", "path": "augmented/"}],
                    "resources": {"accelerators": "H100:8"},
                    "waves": {"shards": 10, "parallel": 4},
                    "retries": 2,
                },
                {
                    "name": "evaluate",
                    "tool": "gpu",
                    "command": "echo evaluate",
                    "inputs": [{"name": "aug", "from": "augment.aug"}],
                    "outputs": [{"name": "report", "path": "report.json", "kind": "file"}],
                    "depends_on": ["curate"],
                },
            ],
            "infrastructure": {"context": "test-ctx", "region": "eu-north1"},
        }
    )


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def doc_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a document of dicts and lists (``()`` is the document itself)."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += doc_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += doc_paths(value, (*prefix, i))
    return found
