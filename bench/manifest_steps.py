"""Benchmark: what one step of a run costs its record, against the number of stages.

A run's executor records five steps a stage (its start, its wave's start and end, its end, and a
read of its progress before them). For each size a run manifest of that many stages is written
to a fresh file:// store, every stage with the record a finished stage leaves (one wave, an
output, times), and one step is timed two ways, alternately, in the same process:

- ``step``: as the executor now makes it: ``update_manifest(..., stages=[stage])``, which reads
  and writes the run's own fields and that stage's page (pages once the run has more than
  ``PAGE_STAGES`` stages);
- ``whole`` (the anchor): the same step made on the whole record, read and written in full, as
  every step was made before pages.

Printed per size: the bytes of the record and of what a step writes, the median seconds of
--repeat steps each way, and their ratio; then the seconds a run of that size spends on its
records (five steps a stage) each way. It prints figures; it is not a test
(tests/unit/test_manifest_pages.py holds the behaviour, counted by request).

    .venv/bin/python bench/manifest_steps.py [--sizes 200 2000 20000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from npa.adapters.storage import open_store
from npa.core.layout import run_prefix
from npa.runs.manifest import (
    PAGE_STAGES,
    RunManifest,
    StageRecord,
    WaveRecord,
    update_manifest,
    write_manifest,
)

RUN = "20260101-000000-abcdef"
NOW = "2026-01-01T00:00:00.000+00:00"
STEPS_A_STAGE = 5


def _finished() -> StageRecord:
    wave = WaveRecord(
        wave=0, shards=[0], state="SUCCEEDED", attempts=1, launched_at=NOW, started_at=NOW,
        ended_at=NOW, exit_codes={"0": 0},
    )  # fmt: skip
    return StageRecord(
        state="SUCCEEDED", started_at=NOW, ended_at=NOW, waves=[wave], outputs={"out": 12345}
    )


def _manifest(stages: int, prefix: str, store_uri: str) -> RunManifest:
    names = [f"stage-{i:05d}" for i in range(stages)]
    return RunManifest(
        project="demo", workflow="wf", run_id=RUN, backend="local", infra="local",
        state="RUNNING", submitted_at=NOW, updated_at=NOW, store=store_uri, prefix=prefix,
        spec_sha256="0" * 64, source_digest="sha256:" + "1" * 64, plan_digest="2" * 64,
        tasks={n: "sha256:" + "3" * 64 for n in names}, order=names, images={},
        job_name="npa-wf", job_id=1, stages={n: _finished() for n in names},
    )  # fmt: skip


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.json"))


def _mark(stage: str, at: str) -> Callable[[RunManifest], None]:
    """A step of one stage: its record's end time set."""

    def mark(m: RunManifest) -> None:
        m.stages[stage].ended_at = at

    return mark


def _time(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(stages: int, repeat: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="npa-bench-manifest-"))
    try:
        store = open_store(root.as_uri())
        prefix = run_prefix("wf", RUN)
        write_manifest(store, _manifest(stages, prefix, store.uri))
        lock = root / "manifest.lock"
        record = _size(root)
        times: dict[str, list[float]] = {"step": [], "whole": []}
        for i in range(repeat):
            stage = f"stage-{(i * 7919) % stages:05d}"
            mark = _mark(stage, f"2026-01-01T00:00:{i % 60:02d}.000+00:00")
            times["step"].append(
                _time(lambda: update_manifest(store, prefix, lock, mark, stages=[stage]))  # noqa: B023
            )
            times["whole"].append(_time(lambda: update_manifest(store, prefix, lock, mark)))  # noqa: B023
        before = {p: p.stat().st_mtime_ns for p in root.rglob("*.json")}
        update_manifest(
            store, prefix, lock, _mark(stage, "2026-01-02T00:00:00.000+00:00"), stages=[stage]
        )
        written = sum(p.stat().st_size for p, t in before.items() if p.stat().st_mtime_ns != t)
        return {
            "record": record,
            "written": written,
            "step": statistics.median(times["step"]),
            "whole": statistics.median(times["whole"]),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"pages of about {PAGE_STAGES} stages; one step = one update_manifest; median of "
          f"{args.repeat} steps each way, alternated")  # fmt: skip
    print(f"{'stages':>7} {'record':>10} {'a step writes':>14} {'step s':>8} {'whole s':>8} "
          f"{'ratio':>6} {'run: steps s':>13} {'run: whole s':>13}")  # fmt: skip
    for stages in args.sizes:
        got = measure(stages, args.repeat)
        run = STEPS_A_STAGE * stages
        print(f"{stages:>7} {got['record']:>10,.0f} {got['written']:>14,.0f} {got['step']:>8.4f} "
              f"{got['whole']:>8.4f} {got['step'] / got['whole']:>5.2f}x "
              f"{run * got['step']:>13.1f} {run * got['whole']:>13.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
