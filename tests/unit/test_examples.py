"""The examples: tiny-cluster is tiny-local sized for the test cluster's small nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _stages(name: str) -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((EXAMPLES / name).read_text())
    return {s["name"]: s for s in spec["stages"]}


def test_tiny_cluster_runs_tiny_locals_stages_and_differs_only_in_resources() -> None:
    local, cluster = _stages("tiny-local.yaml"), _stages("tiny-cluster.yaml")
    assert list(local) == list(cluster)
    for name in local:
        ours = {k: v for k, v in cluster[name].items() if k != "resources"}
        theirs = {k: v for k, v in local[name].items() if k != "resources"}
        assert ours == theirs, name
    # What it is sized for: the widest wave fits one 2-core node beside the jobs controller, and
    # its GPU stage fits the first node's 8 H100s.
    widest = max(
        float(s["resources"]["cpus"]) * int(s.get("waves", {}).get("parallel", 1))
        for s in cluster.values()
    )
    assert widest <= 1.0
    assert cluster["square"]["resources"]["accelerators"] == "H100:1"
