"""Spec files and images for the preflight-images tests."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.harness.registry import PushedImage, Registry

ATTESTED = {
    "io.npa.contract.version": "2",
    "io.npa.contract.user": "1000:1000",
    "io.npa.contract.capabilities": (
        "posix-shell,writable-tmp,bash,passwd-user,writable-home,sudo,aws-cli"
    ),
}


def unique_repo(prefix: str) -> str:
    return f"npa-preflight/{prefix}-{uuid.uuid4().hex[:8]}"


def push_attested(registry: Registry, prefix: str, *, index: bool = False) -> PushedImage:
    return registry.push_image(unique_repo(prefix), "v1", labels=ATTESTED, user="1000", index=index)


def write_spec(path: Path, tools: dict[str, dict[str, Any]]) -> Path:
    """A valid workflow with one stage per tool."""
    doc = {
        "apiVersion": "npa/v1",
        "kind": "Workflow",
        "metadata": {"name": "preflight-test"},
        "tools": tools,
        "stages": [
            {"name": f"stage-{i}", "tool": tool, "command": "true"}
            for i, tool in enumerate(sorted(tools))
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
