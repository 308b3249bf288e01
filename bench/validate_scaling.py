"""Benchmark: validate-spec time against the number of stages (it must grow linearly).

For each size the spec is a chain with fan-in (every stage reads the previous one's output and
depends on the stage half-way back). Printed per size: the CPU time of validation in process
(best of --repeat), the time per stage, that per-stage time as a ratio of the smallest size's
(the anchor: 1.0 everywhere means linear), and as a ratio of PyYAML composing the same text
(the parser floor npa cannot go below). Then the whole `npa ... validate-spec` process for the
largest size, wall and CPU. It prints figures; it is not a test.

    .venv/bin/python bench/validate_scaling.py [--sizes 2000 8000 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def generate(stages: int) -> str:
    spec: dict[str, Any] = {
        "apiVersion": "npa/v1",
        "kind": "Workflow",
        "metadata": {"name": "scaling"},
        "storage": {"uri": "s3://bench-runs/workflows"},
        "tools": {"cur": {"image": "registry.example.com/bench/cur:1.0"}},
        "stages": [],
    }
    for i in range(stages):
        stage: dict[str, Any] = {
            "name": f"s{i}",
            "tool": "cur",
            "command": f"run-step {i}",
            "outputs": [{"name": "out", "path": "out/"}],
            "resources": {"cpus": 2, "memory_gib": 4},
        }
        if i:
            stage["inputs"] = [{"name": "up", "from": f"s{i - 1}.out"}]
        if i > 1:
            stage["depends_on"] = [f"s{i // 2}"]
        spec["stages"].append(stage)
    return yaml.safe_dump(spec, sort_keys=False)


def compose_paused(text: str) -> Any:
    """PyYAML's compose alone, with the cyclic collector paused as validation pauses it."""
    from npa.core.collector import collector_paused
    from npa.spec.loader import _Loader

    with collector_paused():
        return yaml.compose(text, Loader=_Loader)


def cpu(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000, 20000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from npa.spec.validate import validate_text

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    anchor: float | None = None
    texts = {n: generate(n) for n in args.sizes}
    for n, text in texts.items():
        workflow, issues = validate_text(text)
        assert workflow is not None, issues[:3]
        seconds = cpu(lambda t=text: validate_text(t), args.repeat)
        floor = cpu(lambda t=text: compose_paused(t), args.repeat)
        per_stage = seconds / n
        anchor = anchor or per_stage
        print(
            f"{n:6d} stages ({len(text):9,d} bytes): {seconds:.3f} s CPU, "
            f"{per_stage * 1e6:.1f} us/stage = {per_stage / anchor:.2f}x the {args.sizes[0]}-stage "
            f"rate; {seconds / floor:.2f}x PyYAML's compose alone ({floor:.3f} s)"
        )

    largest = max(args.sizes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(texts[largest])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "npa", "workbench", "workflow", "validate-spec", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(
        f"npa workbench workflow validate-spec, {largest} stages, whole process: "
        f"{wall:.3f} s wall, {used:.3f} s CPU, exit {proc.returncode}"
    )


if __name__ == "__main__":
    main()
