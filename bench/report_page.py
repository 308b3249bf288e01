"""``workflow report`` of a large synthetic run: page size, and the time to read the run, to
render the page and for headless Chromium to load it.

The run is written straight into a local store: 200 stages (20 plan levels of 10), each one wave
of 16 shards with a recorded exit per shard and one output, one stage FAILED (one shard exit 1,
its output missing) with a 10 MB log, and the stages downstream of it never run. Each shard that
ran has its attempt's phase record (``--no-phases``: none, as a run from before npa wrote
them). The report is read through the same service the CLI calls (status, artifacts, logs: the
log is read whole and only its tail goes into the page). Prints figures; asserts nothing.

    python bench/report_page.py [--stages 200] [--shards 16] [--log-mb 10] [--repeat 3]
                                [--no-phases]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUN = "20260101-120000-abcdef"
WORKFLOW = "bench-report"
WIDE = 10  # stages per plan level


def spec_text(stages: int, shards: int) -> str:
    lines = [
        "apiVersion: npa/v1",
        "kind: Workflow",
        f"metadata: {{name: {WORKFLOW}}}",
        "tools: {shell: {image: docker.io/library/busybox:1.36}}",
        "stages:",
    ]
    for i in range(stages):
        lines += [
            f"  - name: s{i:03d}",
            "    tool: shell",
            "    command: echo hi",
            f"    outputs: [{{name: out, path: out{i}/}}]",
            "    resources: {cpus: 1, disk_gib: 1}",
            f"    waves: {{shards: {shards}, parallel: {shards}}}",
        ]
        if i >= WIDE:
            lines.append(f"    inputs: [{{name: up, from: s{i - WIDE:03d}.out}}]")
    return "\n".join(lines) + "\n"


def write_phases(
    store: object, prefix: str, stage: str, shards: int, t0: str, failed: bool
) -> None:
    """One phase record per shard of the stage's one wave (npa.backends.phases)."""
    from datetime import datetime, timedelta

    from npa.backends.phases import ShardPhases, write_phases

    began = datetime.fromisoformat(t0)
    for shard in range(shards):
        bad = failed and shard == 3
        at = [began + timedelta(milliseconds=ms) for ms in (0, 50, 60, 700, 790)]
        record = ShardPhases(
            stage=stage, wave=0, shard=shard, attempt=1, backend="local", started_at=at[0],
            inputs_at=at[1], command_started_at=at[2], command_ended_at=at[3],
            exit_code=1 if bad else 0, uploaded_at=None if failed else at[4], ended_at=at[4],
        )  # fmt: skip
        assert write_phases(store, prefix, record) is None  # type: ignore[arg-type]


def write_run(
    home: Path, stages: int, shards: int, log_mb: int, phases: bool = True
) -> tuple[str, str]:
    """The run in the local store; returns (its prefix URI, the failed stage)."""
    from npa.adapters.storage import open_store
    from npa.core.layout import output_key, stage_logs_key
    from npa.plan.model import build_plan
    from npa.runs.manifest import RunManifest, StageRecord, WaveRecord, write_manifest, write_plan
    from npa.spec.validate import validate_text

    workflow, issues = validate_text(spec_text(stages, shards))
    assert workflow is not None, issues[:3]
    plan = build_plan(workflow, RUN)
    store = open_store((home / "store").as_uri())
    prefix = f"{WORKFLOW}/{RUN}/npa-workflow"
    write_plan(store, prefix, plan)
    failed = f"s{stages * 3 // 4:03d}"
    downstream = {failed}
    records: dict[str, StageRecord] = {}
    for n, stage in enumerate(plan.order):
        deps = next(p.depends_on for p in plan.stages if p.name == stage)
        if downstream & set(deps):
            downstream.add(stage)
            continue  # never ran
        t0, t1 = f"2026-01-01T12:{n // 60:02d}:{n % 60:02d}+00:00", None
        t1 = f"2026-01-01T12:{n // 60:02d}:{n % 60:02d}.800+00:00"
        codes = {str(s): (1 if stage == failed and s == 3 else 0) for s in range(shards)}
        state = "FAILED" if stage == failed else "SUCCEEDED"
        records[stage] = StageRecord(
            state=state, started_at=t0, ended_at=t1, classification=(
                "payload" if stage == failed else None),
            detail=f"stage {stage} wave 0 shard 3: exit 1" if stage == failed else None,
            waves=[WaveRecord(wave=0, shards=list(range(shards)), state=state, attempts=1,
                              started_at=t0, ended_at=t1, exit_codes=codes)],
        )  # fmt: skip
        if phases:
            write_phases(store, prefix, stage, shards, t0, stage == failed)
        if stage != failed:
            planned = next(p for p in plan.stages if p.name == stage)
            store.put(output_key(prefix, stage, f"{planned.outputs[0].path}part-0"), b"x" * 100)
    line = b"step 0000123: loss 0.123456 lr 0.0003 tokens/s 123456 <not markup>\n"
    store.put(
        f"{stage_logs_key(prefix, failed)}/wave-0-shard-3.log",
        line * (log_mb * 1024 * 1024 // len(line)),
    )
    now = "2026-01-01T13:00:00+00:00"
    manifest = RunManifest(
        project="default", workflow=WORKFLOW, run_id=RUN, backend="local", infra="local",
        state="FAILED", submitted_at="2026-01-01T11:59:59+00:00", updated_at=now,
        store=store.uri, prefix=prefix, spec_sha256="x", source_digest=None, plan_digest="x",
        tasks={s: "x" for s in plan.order}, order=list(plan.order), images={},
        job_name=f"npa-{WORKFLOW}-{RUN}", job_id=1, stages=records,
    )  # fmt: skip
    write_manifest(store, manifest)
    return f"{store.uri}/{prefix}", failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=200)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--log-mb", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-phases", action="store_true", help="write no phase records")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / ".npa"
        os.environ["NPA_HOME"] = str(home)
        os.environ["HOME"] = tmp
        uri, failed = write_run(home, args.stages, args.shards, args.log_mb, not args.no_phases)
        from npa.core.paths import NpaPaths
        from npa.render.report import render_report
        from npa.services import report as service
        from npa.services import status as status_service

        page = Path(tmp) / "report.html"
        paths = NpaPaths.from_env()
        whole, renders = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = service.report(uri, None, out=page, paths=paths)
            whole.append(time.perf_counter() - start)
            st = status_service.status(uri, None, paths=paths)
            read = service.ReadArgs(cached=False, workflow_uri=None, paths=paths)
            model = service.build(st, uri, None, read)
            start = time.perf_counter()
            render_report(model)
            renders.append(time.perf_counter() - start)
        stage = next(s for s in model.stages if s.name == failed)
        kept = len(stage.log_tail)
        print(f"run: {args.stages} stages x {args.shards} shards, a {args.log_mb} MB log "
              f"({stage.log_lines} lines; the page keeps the last {kept})")  # fmt: skip
        print(f"state {result.state}; incomplete: {result.incomplete or 'none'}; "
              f"phase records: {sum(len(s.recorded) for s in model.stages)}")  # fmt: skip
        print(f"page: {result.bytes} bytes ({result.bytes / 1024:.0f} KiB)")
        print(f"report (read + render + write), median of {args.repeat}: "
              f"{statistics.median(whole):.2f} s")  # fmt: skip
        print(f"render alone (model -> HTML), median: {statistics.median(renders) * 1000:.0f} ms")
        _browser(page, Path(tmp))


def _browser(page: Path, tmp: Path) -> None:
    from tests.harness.browser import chromium_binary, open_page

    binary = chromium_binary()
    if binary is None:
        print("chromium: not installed; load time not measured")
        return
    script = "JSON.stringify(performance.getEntriesByType('navigation')[0].toJSON())"
    loaded = open_page(binary, page, script, tmp / "chromium")
    nav = loaded.value
    print(
        f"chromium: load event {nav['loadEventEnd']:.0f} ms after navigation start "
        f"(DOM interactive {nav['domInteractive']:.0f} ms); requests: {len(loaded.requests)}"
    )


if __name__ == "__main__":
    main()
