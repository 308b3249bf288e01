"""A workflow of 20,000 ordinary stages, through the real CLI: validate-spec and plan-spec
accept it. Each stage is written as examples/physical-ai.yaml writes its stages (inputs,
outputs, resources, waves, retries, a checkpoint, two variables: 54 values), 1.08 million values
and 12.4 MB in all. It was refused twice over: by the 8 MiB size cap, and past that by the
value cap, which asked "(aliases?)" of a file without any."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.harness.cli import run_npa

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
STAGES = 20_000


def ordinary_stage(i: int) -> dict[str, object]:
    stage: dict[str, object] = {
        "name": f"augment-{i}",
        "tool": "augment",
        "command": f'python -m augment.shard --clips "$NPA_INPUT_CLIPS" --shard "$NPA_WAVE" '
        f'--out "$NPA_OUTPUT_AUGMENTED" --part {i}',
        "env": {"AUGMENT_SEED": str(i), "LOG_LEVEL": "info"},
        "outputs": [{"name": "augmented", "path": "augmented/"}],
        "resources": {"accelerators": "H100:8", "cpus": 64, "memory_gib": 512, "disk_gib": 800},
        "waves": {"shards": 16, "parallel": 4},
        "retries": 3,
        "checkpoint": {
            "path": f"checkpoints/augment-{i}/",
            "loader": 'python -m augment.resume --from "$NPA_CHECKPOINT_URI"',
        },
    }
    if i:
        stage["inputs"] = [{"name": "clips", "from": f"augment-{i - 1}.augmented"}]
    if i > 1:
        stage["depends_on"] = [f"augment-{i // 2}"]
    return stage


def test_a_spec_of_20000_ordinary_stages_validates_and_plans(
    npa_home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "big.yaml"
    document = {
        "apiVersion": "npa/v1",
        "kind": "Workflow",
        "metadata": {"name": "big"},
        "storage": {"uri": "s3://bench-runs/workflows"},
        "tools": {"augment": {"image": "registry.example.com/physai/augment:1.0"}},
        "stages": [ordinary_stage(i) for i in range(STAGES)],
    }
    spec.write_text(yaml.safe_dump(document, sort_keys=False))
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    checked = run_npa(*WF, "validate-spec", str(spec), env=env)
    assert checked.code == 0, checked.stdout + checked.stderr
    assert "valid workflow 'big' (20,000 stages)" in checked.stdout
    plan = run_npa(*WF, "plan-spec", str(spec), "--run-id", "r1", "--skip-quota", "--json",
                   env=env)  # fmt: skip
    assert plan.code == 0, plan.stdout[-2000:] + plan.stderr
    assert len(plan.json()["plan"]["order"]) == STAGES
