"""Benchmark: validate, plan and render CPU against the number of stages (each must grow
linearly).

For each size, in one process, each step runs as its command runs it, in process: ``validate``
(``load_workflow``), ``plan`` (``plan_spec`` and its JSON) and ``render`` (``render_spec`` for
SkyPilot, every task file written into a fresh ``--out``). Printed per size and step: the median
CPU seconds of --repeat runs, per stage, and that per-stage time as a ratio of the first size's,
measured in the same run (1.0 everywhere means linear; issue 34's target is within 1.2x).
Beside them, the same for an anchor known to be linear: PyYAML's C loader reading the same spec
text with the collector paused. When the machine itself is slower per object at the large size
(caches, other load), the anchor's ratio shows it. A small spec goes through every step first,
so the first size does not pay for imports. It prints figures; it is not a test
(tests/unit/test_scaling.py holds the property, counted).

``--spec chain`` (the default) is bench/validate_scaling.py's chain with fan-in, one wave per
stage (about 7 KB of task YAML per stage); ``--spec pipeline`` is bench/spec_pipeline.py's
wide-and-deep DAG with waves and GPUs (about 34 KB per stage: 20,000 stages render 670 MB, a
minute of CPU per render).

    .venv/bin/python bench/pipeline_scaling.py [--sizes 200 2000 20000] [--repeat 3]
        [--spec chain|pipeline]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

STEPS = ("validate", "plan", "render")


def spec_text(kind: str, stages: int) -> tuple[str, dict[str, str]]:
    """The spec's text and the digests that pin its tools."""
    if kind == "pipeline":
        from spec_pipeline import generate as pipeline

        spec, digests = pipeline(stages)
        return yaml.safe_dump(spec, sort_keys=False), digests
    from validate_scaling import generate as chain

    return chain(stages), {"cur": "sha256:" + "ab" * 32}


def median_cpu(fn: Callable[[], object], repeat: int, after: Callable[[], object]) -> float:
    """The median process CPU time (user + system, every thread) of ``repeat`` calls; ``after``
    runs after each call, untimed."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
        after()
    return statistics.median(times)


def anchor(text: str) -> Any:
    from npa.core.collector import collector_paused

    with collector_paused():
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spec", choices=["chain", "pipeline"], default="chain")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["NPA_HOME"] = str(root / "home")
        out = root / "out"
        from npa.services.plan import plan_spec
        from npa.services.render import render_spec
        from npa.spec.validate import load_workflow

        def steps(n: int) -> dict[str, Callable[[], object]]:
            text, digests = spec_text(args.spec, n)
            spec = root / f"s{n}.yaml"
            spec.write_text(text)
            pins = root / f"digests-{n}.yaml"
            pins.write_text(yaml.safe_dump(digests))
            return {
                "anchor": lambda: anchor(text),
                "validate": lambda: load_workflow(spec),
                "plan": lambda: plan_spec(spec, "r1", target="kubernetes").model_dump_json(),
                "render": lambda: render_spec(
                    spec,
                    "r1",
                    out,
                    digests_file=pins,
                    kube_context="bench-ctx",
                    store_uri="s3://bench-runs/workflows",
                ),
            }

        def clean() -> None:
            shutil.rmtree(out, ignore_errors=True)

        for step in steps(20).values():  # imports, caches
            step()
            clean()

        print(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"spec: {args.spec}; median of {args.repeat} runs"
        )
        names = ("anchor", *STEPS)
        print(
            f"{'stages':>7}"
            + "".join(f" {name + ' s':>11} {'ms/stage':>9} {'x':>5}" for name in names)
        )
        first: dict[str, float] = {}
        for n in args.sizes:
            total = {name: median_cpu(step, args.repeat, clean) for name, step in steps(n).items()}
            per = {name: seconds / n for name, seconds in total.items()}
            first = first or per
            print(
                f"{n:>7}"
                + "".join(
                    f" {total[k]:>11.3f} {per[k] * 1e3:>9.4f} {per[k] / first[k]:>5.2f}"
                    for k in names
                ),
                flush=True,
            )
        print(
            f"s: CPU seconds (user + system, every thread); x: the per-stage time as a ratio of "
            f"the {args.sizes[0]}-stage one, measured in this run (1.0 = linear; target within "
            "1.2; the anchor's x is the machine's own growth at that size). Targets at 20,000 "
            "stages: each step under 2 s"
        )


if __name__ == "__main__":
    main()
