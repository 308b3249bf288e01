"""Spec documents for tests: a small valid workflow to mutate, YAML helpers, and the smallest
stage task a backend encodes."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from npa.backends.base import RunTasks, StageTask

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


def one_stage_task(
    command: str, env: dict[str, str] | None = None, secrets: dict[str, str] | None = None
) -> tuple[StageTask, RunTasks]:
    """Stage ``probe`` of run ``r`` of workflow ``w``: one shard, no input or output."""
    task = StageTask(
        stage="probe", task_name="t", command=command, env=env or {}, secrets=secrets or {},
        image="i@sha256:" + "a" * 64, depends_on=[], shards=1, parallel=1, waves=1, retries=0,
        accelerators=None, cpus=None, memory_gib=None, disk_gib=None, inputs=[], outputs=[],
        run_as_user=1000, run_as_group=1000, fs_group=1000,
    )  # fmt: skip
    run = RunTasks(
        workflow="w", run_id="r", store="s3://b", prefix="w/r/npa-workflow",
        run_root="s3://b/w/r", tasks=[task],
    )  # fmt: skip
    return task, run
