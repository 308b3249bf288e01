"""Benchmark: validate + plan + render of a generated 200-stage workflow.

Prints figures; it is not a test. Each command runs as its own process, exactly as a user runs
it, so the times include interpreter start-up and imports. Rendering rate is measured in
process over repeated renders.

    .venv/bin/python bench/spec_pipeline.py [--stages 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def generate(stages: int) -> tuple[dict[str, Any], dict[str, str]]:
    """A wide-and-deep DAG: every stage reads one or two earlier stages' outputs."""
    tools = {f"tool{i}": {"image": f"registry.example.com/bench/tool{i}:1.{i}"} for i in range(8)}
    digests = {ref: "sha256:" + f"{i:02x}" * 32 for i, ref in enumerate(tools)}
    spec_stages = []
    for i in range(stages):
        inputs: list[dict[str, str]] = []
        if i == 0:
            inputs.append({"name": "raw", "uri": "s3://bench-raw/data/"})
        else:
            inputs.append({"name": "up1", "from": f"s{(i - 1)}.out"})
            if i > 2:
                inputs.append({"name": "up2", "from": f"s{i // 2}.out"})
        gpu = i % 3 == 0
        spec_stages.append(
            {
                "name": f"s{i}",
                "tool": f"tool{i % 8}",
                "command": f'python -m bench.step --index {i} --in "$NPA_INPUT_UP1"',
                "env": {"BENCH_INDEX": str(i), "BENCH_NOTE": f"stage {i}: # of shards"},
                "inputs": inputs,
                "outputs": [{"name": "out", "path": f"stages/s{i}/"}],
                "resources": (
                    {"accelerators": "H100:8", "cpus": 64, "memory_gib": 512, "disk_gib": 500}
                    if gpu
                    else {"cpus": 8, "memory_gib": 32, "disk_gib": 50}
                ),
                "waves": {
                    "shards": 1 + i % 17,
                    "parallel": 1 + i % 5 if 1 + i % 5 <= 1 + i % 17 else 1,
                },
                "retries": i % 4,
            }
        )
    spec = {
        "apiVersion": "npa/v1",
        "kind": "Workflow",
        "metadata": {"name": "bench", "description": f"{stages} generated stages"},
        "storage": {"uri": "s3://bench-runs/workflows"},
        "tools": tools,
        "stages": spec_stages,
        "infrastructure": {"context": "bench-ctx", "region": "eu-north1"},
    }
    return spec, digests


CPU: dict[str, list[float]] = {}


def run(*args: str, label: str = "") -> tuple[float, int]:
    """Wall time and exit code of one npa process; its CPU time (user + sys) goes to CPU[label],
    which stays meaningful when other work shares the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "npa", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    CPU.setdefault(label, []).append(cpu)
    return elapsed, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    spec, digests = generate(args.stages)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec_path = root / "bench.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        digests_path = root / "digests.yaml"
        digests_path.write_text(yaml.safe_dump(digests))
        quota_path = REPO / "examples" / "quota-ample.yaml"
        lines = spec_path.read_text().count("\n")
        print(f"spec: {args.stages} stages, {lines} lines, {spec_path.stat().st_size} bytes")

        wf = ("workbench", "workflow")
        commands = {
            "validate-spec": (*wf, "validate-spec", str(spec_path)),
            "plan-spec": (
                *wf,
                "plan-spec",
                str(spec_path),
                "--run-id",
                "bench-1",
                "--quota-file",
                str(quota_path),
            ),
            "render": (
                *wf,
                "render",
                str(spec_path),
                "--run-id",
                "bench-1",
                "--out",
                str(root / "out"),
                "--digests",
                str(digests_path),
            ),
        }
        run("--version")  # warm the page cache and bytecode
        totals: list[float] = []
        per: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            total = 0.0
            for name, cmd in commands.items():
                elapsed, code = run(*cmd, label=name)
                if code not in (0, 1):
                    raise SystemExit(f"{name} exited {code}")
                per[name].append(elapsed)
                total += elapsed
            totals.append(total)
        baseline = [run("--version", label="start-up")[0] for _ in range(args.repeat)]
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        startup = statistics.median(baseline)
        print(f"interpreter + npa start-up (npa --version): median {startup:.3f} s")
        for name, times in per.items():
            print(
                f"{name:14s} whole process: median {statistics.median(times):.3f} s wall "
                f"(min {min(times):.3f}, max {max(times):.3f}), "
                f"median {statistics.median(CPU[name]):.3f} s CPU"
            )
        print(
            f"validate + plan + render, three processes: median {statistics.median(totals):.3f} s"
        )

        from npa.services.render import render_workflow
        from npa.spec.validate import load_workflow

        workflow = load_workflow(spec_path)
        render_workflow(workflow, "warm", kube_context=None, digests=digests)
        rounds = max(3, args.repeat)
        start = time.perf_counter()
        for r in range(rounds):
            render_workflow(workflow, f"rate-{r}", kube_context=None, digests=digests)
        elapsed = time.perf_counter() - start
        rendered = rounds * args.stages
        print(
            f"rendering rate (in process, {rendered} tasks): {rendered / elapsed:,.0f} tasks/s "
            f"({elapsed / rendered * 1e3:.3f} ms per task)"
        )
        start = time.perf_counter()
        for _ in range(rounds):
            load_workflow(spec_path)
        print(
            f"validation (in process): {(time.perf_counter() - start) / rounds * 1e3:.1f} ms "
            f"per {args.stages}-stage spec"
        )


if __name__ == "__main__":
    main()
