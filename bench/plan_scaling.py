"""Benchmark: plan-spec CPU against the number of stages (it must grow linearly).

The spec is bench/validate_scaling.py's chain with fan-in. Printed per size: the CPU time of
``plan_spec`` in process (validation included; best of --repeat), its time per stage, that
per-stage time as a ratio of the smallest size's (the anchor: 1.0 everywhere means linear),
and the same for validation alone, measured in the same run (plan's own share is the
difference). It prints figures; it is not a test.

    .venv/bin/python bench/plan_scaling.py [--sizes 200 2000 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from validate_scaling import cpu, generate

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NPA_HOME"] = str(Path(tmp) / "home")
        from npa.services.plan import plan_spec
        from npa.spec.validate import load_workflow

        print(f"{'stages':>7} {'plan s':>8} {'ms/stage':>9} {'ratio':>6} "
              f"{'validate s':>10} {'ms/stage':>9} {'ratio':>6}")  # fmt: skip
        first: tuple[float, float] | None = None
        for n in args.sizes:
            spec = Path(tmp) / f"s{n}.yaml"
            spec.write_text(generate(n))

            def plan(spec: Path = spec) -> None:
                plan_spec(spec, "r1", target="kubernetes").model_dump_json()

            planned = cpu(plan, args.repeat) / n
            validated = cpu(lambda spec=spec: load_workflow(spec), args.repeat) / n
            first = first or (planned, validated)
            ratios = planned / first[0], validated / first[1]
            print(f"{n:>7} {planned * n:>8.3f} {planned * 1e3:>9.3f} {ratios[0]:>6.2f} "
                  f"{validated * n:>10.3f} {validated * 1e3:>9.3f} {ratios[1]:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
