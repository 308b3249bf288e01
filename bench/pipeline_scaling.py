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

Each run is made in a forked child (the cost of an empty child taken off), so every size starts
from the memory a fresh CLI process has and pays the kernel's first touch of every page it
uses. In one process the small sizes reuse pages the warm-up freed and pay none: measured so,
validate and plan at 20,000 stages cost 1.24x a stage what they cost at 200, and half or more
of the difference was system time the 200-stage runs never paid (forked, 1.07x and 1.05x in
the same hour). A second table gives each step's system time and minor page faults a stage.
``--same-process`` measures the old way. ``--steps`` picks the steps (render at 20,000 stages
takes about 10 s of CPU a run).

``--spec chain`` (the default) is bench/validate_scaling.py's chain with fan-in, one wave per
stage (about 7 KB of task YAML per stage); ``--spec pipeline`` is bench/spec_pipeline.py's
wide-and-deep DAG with waves and GPUs (about 34 KB per stage: 20,000 stages render 670 MB, about
30 s of CPU per render).

    .venv/bin/python bench/pipeline_scaling.py [--sizes 200 2000 20000] [--repeat 3]
        [--spec chain|pipeline] [--steps validate plan render] [--same-process]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Cost:
    """CPU seconds (user + system, every thread), system seconds and minor page faults."""

    cpu: float
    system: float
    faults: float

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.cpu - other.cpu, self.system - other.system, self.faults - other.faults)


def in_process(fn: Callable[[], object]) -> Cost:
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.process_time()
    fn()
    cpu = time.process_time() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return Cost(cpu, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt)


def in_child(fn: Callable[[], object]) -> Cost:
    """``fn`` in a forked child: it starts from the memory this process holds, as a fresh CLI
    process starts from its imports, not from pages an earlier run freed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        raise SystemExit(f"a measured child failed ({status}); run with --same-process to see")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return Cost(user + system, system, after.ru_minflt - before.ru_minflt)


def median_cost(
    fn: Callable[[], object], repeat: int, after: Callable[[], object],
    measure: Callable[[Callable[[], object]], Cost], empty: Cost,
) -> Cost:  # fmt: skip
    """The median cost of ``repeat`` calls less ``empty`` (what measuring nothing costs);
    ``after`` runs after each call, untimed."""
    costs = []
    for _ in range(repeat):
        costs.append(measure(fn) - empty)
        after()
    med = statistics.median
    return Cost(med(c.cpu for c in costs), med(c.system for c in costs),
                med(c.faults for c in costs))  # fmt: skip


def anchor(text: str) -> Any:
    from npa.core.collector import collector_paused

    with collector_paused():
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spec", choices=["chain", "pipeline"], default="chain")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--same-process", action="store_true",
                        help="measure in this process, not in a forked child a run")  # fmt: skip
    args = parser.parse_args()
    measure = in_process if args.same_process else in_child

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

        empty = Cost(0.0, 0.0, 0.0)
        if not args.same_process:
            empty = median_cost(lambda: None, 5, lambda: None, measure, empty)
        print(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"spec: {args.spec}; median of {args.repeat} runs, "
            + ("in this process" if args.same_process else
               f"each in a forked child (an empty child's {empty.cpu * 1e3:.1f} ms taken off)")
        )  # fmt: skip
        names = ("anchor", *args.steps)
        print(
            f"{'stages':>7}"
            + "".join(f" {name + ' s':>11} {'ms/stage':>9} {'x':>5}" for name in names)
        )
        first: dict[str, float] = {}
        costs: dict[int, dict[str, Cost]] = {}
        for n in args.sizes:
            made = steps(n)
            cost = {k: median_cost(made[k], args.repeat, clean, measure, empty) for k in names}
            costs[n] = cost
            per = {name: c.cpu / n for name, c in cost.items()}
            first = first or per
            print(
                f"{n:>7}"
                + "".join(
                    f" {cost[k].cpu:>11.3f} {per[k] * 1e3:>9.4f} {per[k] / first[k]:>5.2f}"
                    for k in names
                ),
                flush=True,
            )
        print(
            f"s: CPU seconds (user + system, every thread); x: the per-stage time as a ratio of "
            f"the {args.sizes[0]}-stage one, measured in this run (1.0 = linear; target within "
            "1.2; the anchor's x is the machine's own growth at that size). Targets at 20,000 "
            "stages: each step under 2 s (plan includes validating the spec; render, validating "
            "and planning it)"
        )
        print(f"{'stages':>7}" + "".join(f" {name + ' sys ms/st':>17} {'faults/st':>9}"
                                          for name in names))  # fmt: skip
        for n, cost in costs.items():
            cells = (f" {c.system / n * 1e3:>17.4f} {c.faults / n:>9.2f}" for c in cost.values())
            print(f"{n:>7}" + "".join(cells))
        print("sys ms/st: system CPU ms a stage (most of it first touches of new memory); "
              "faults/st: minor page faults a stage")  # fmt: skip


if __name__ == "__main__":
    main()
