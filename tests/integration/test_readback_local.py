"""Reading runs back on the local backend, end to end: the real CLI, the embedded store, the
detached supervisor. status / list / artifacts / logs / cancel / load-artifact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa
from tests.harness.procs import run_processes, wait_until

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")


@pytest.fixture
def env(npa_home: Path) -> dict[str, str]:
    return {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    folder = tmp_path / "workflow"
    folder.mkdir()
    target = folder / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", target)
    return target


def npa(env: dict[str, str], *args: str) -> Any:
    return run_npa(*args, env=env)


def prepare(spec: Path, env: dict[str, str]) -> str:
    r = npa(env, *WF, "prepare-run", str(spec), "--project", "demo")
    assert r.code == 0, r.stderr
    return str(r.stdout.strip())


def submit(spec: Path, run_id: str, env: dict[str, str], *extra: str) -> Any:
    r = npa(
        env, *WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
        "--runtime", "process", "--json", *extra,
    )  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    return r.json()


def status(env: dict[str, str], run: str, *extra: str) -> Any:
    return npa(env, *WF, "status", run, "--project", "demo", "--json", *extra)


def test_success_reads_back_everywhere(spec: Path, env: dict[str, str], npa_home: Path) -> None:
    spec.write_text(
        spec.read_text().replace(
            '"$NPA_OUTPUT_SQUARES/squares.txt"', '"$NPA_OUTPUT_SQUARES/squares.txt"; echo squared'
        )
    )
    run_id = prepare(spec, env)
    # Reserved, nothing submitted: NOT_SUBMITTED, exit 0, and the next command resumes it.
    r = status(env, run_id)
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["state"] == "NOT_SUBMITTED"
    assert "--resume-run" in r.json()["next"][0]

    out = submit(spec, run_id, env)
    w = npa(env, *WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
            "--json")  # fmt: skip
    assert w.code == 0, w.stdout + w.stderr
    # NDJSON: one event per line as it happened, the final result last.
    *events, body = [json.loads(line) for line in w.stdout.splitlines()]
    assert body["state"] == "SUCCEEDED" and body["trustworthy"] and body["watched"]
    assert events and all(e["run_id"] == run_id for e in events)
    assert events[-1]["event"] in ("state", "stage", "job") or events[-1]["event"] == "heartbeat"
    assert [e["after"] for e in events if e["event"] == "state"][-1] == "SUCCEEDED"
    square = [e for e in events if e["event"] == "stage" and e["stage"] == "square"]
    assert square and square[-1]["after"] == "SUCCEEDED"
    assert body["job_id"] == out["job_id"]
    answers = {s["source"]: s["answer"] for s in body["sources"]}
    assert answers["receipt"] == "found" and answers["manifest"] == "found"
    assert body["stages"]["square"]["waves"] == "1/1 waves succeeded"

    # The same through the run's file:// prefix, with no project records at all.
    prefix = f"{(npa_home / 'store').as_uri()}/tiny-local/{run_id}/npa-workflow"
    r = npa({**env, "NPA_HOME": str(npa_home.parent / "elsewhere")}, *WF, "status", prefix,
            "--json")  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["state"] == "SUCCEEDED"

    # --cached: marked, never trustworthy, backend not contacted.
    r = status(env, run_id, "--cached")
    assert r.json()["state"] == "CACHED" and r.json()["trustworthy"] is False
    assert r.json()["last_known_state"] == "SUCCEEDED"
    text = npa(env, *WF, "status", run_id, "--project", "demo", "--cached")
    assert "NOT live-verified" in text.stdout

    r = npa(env, *WF, "artifacts", run_id, "--project", "demo", "--json")
    assert r.code == 0, r.stdout + r.stderr
    arts = r.json()
    assert [s["stage"] for s in arts["stages"]] == ["generate", "square", "total"]
    assert all(s["ok"] for s in arts["stages"]) and arts["first_stage_without_outputs"] is None
    total = arts["stages"][2]["outputs"][0]
    assert total["status"] == "ok" and total["bytes"] == len("338350\n")

    r = npa(env, *WF, "logs", run_id, "--project", "demo", "--stage", "square", "--json")
    assert r.code == 0, r.stdout + r.stderr
    logs = r.json()
    assert logs["answered_by"] == "backend-live"
    assert logs["lines"] and all(line.startswith("[square/") for line in logs["lines"])
    assert any(line.endswith("squared") for line in logs["lines"])
    r = npa(env, *WF, "logs", run_id, "--project", "demo", "--stage", "total", "--cached",
            "--json")  # fmt: skip
    cached = r.json()
    assert cached["answered_by"] == "store"
    assert cached["sources"][0]["outcome"] == "not_contacted"
    assert cached["empty_means"].startswith("empty")  # awk wrote nothing to stdout

    r = npa(env, *WF, "list", "--project", "demo", "--json")
    assert r.code == 0, r.stdout + r.stderr
    assert [row["run_id"] for row in r.json()["runs"]] == [run_id]
    assert r.json()["runs"][0]["recorded_state"] == "SUCCEEDED"

    # cancel of a finished run: a repeat-safe no-op.
    r = npa(env, *WF, "cancel", run_id, "--project", "demo", "--json")
    assert r.code == 0 and r.json()["outcome"] == "already_final"

    dest = npa_home.parent / "loaded"
    r = npa(env, *WF, "load-artifact", run_id, "--project", "demo", "--destination", str(dest),
            "--json")  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["relaunched"] is False
    assert (dest / "total" / "total.txt").read_text().strip() == "338350"
    assert sorted(p.name for p in (npa_home / "local-jobs").iterdir()) == ["1"]


def test_zero_byte_output_is_a_failure_and_names_the_first_empty_stage(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    run_id = prepare(spec, env)
    submit(spec, run_id, env)
    w = npa(env, *WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2")
    assert w.code == 0, w.stdout + w.stderr
    # Damage the stored output after the fact: the stage still says SUCCEEDED.
    squares = npa_home / "store/tiny-local" / run_id / "npa-workflow/stages/square/outputs/squares"
    for f in squares.iterdir():
        f.write_bytes(b"")
    r = npa(env, *WF, "artifacts", run_id, "--project", "demo", "--json")
    assert r.code == 1, r.stdout
    body = r.json()
    assert body["first_stage_without_outputs"] == "square"
    assert any("square is SUCCEEDED but output squares is empty" in f for f in body["failures"])
    r = npa(env, *WF, "load-artifact", run_id, "--project", "demo", "--destination",
            str(npa_home.parent / "x"), "--json")  # fmt: skip
    assert r.code == 2 and "missing or empty" in r.json()["error"]["message"]


def test_failed_run_watch_exits_nonzero_and_load_artifact_refuses(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    spec.write_text(
        spec.read_text().replace("awk '{ s += $1 } END", "echo boom >&2; exit 3; awk '{")
    )
    run_id = prepare(spec, env)
    submit(spec, run_id, env)
    w = npa(env, *WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
            "--json")  # fmt: skip
    assert w.code == 1, w.stdout + w.stderr
    body = json.loads(w.stdout.splitlines()[-1])
    assert body["state"] == "FAILED"
    assert body["supervisor"]["classification"] == "payload"
    assert any("logs" in n and "--stage total" in n for n in body["next"])
    r = npa(env, *WF, "logs", run_id, "--project", "demo", "--stage", "total", "--cached")
    assert "boom" in r.stdout
    r = npa(env, *WF, "load-artifact", run_id, "--project", "demo", "--destination",
            str(npa_home.parent / "x"), "--json")  # fmt: skip
    assert r.code == 2 and "only loads a run whose every stage succeeded" in r.stdout
    assert not (npa_home.parent / "x").exists()


def test_cancel_by_id_is_repeat_safe(spec: Path, env: dict[str, str], npa_home: Path) -> None:
    spec.write_text(spec.read_text().replace("seq 1 100", "sleep 30; seq 1 100"))
    run_id = prepare(spec, env)
    # A reserved run that never launched: cancel is a successful no-op.
    r = npa(env, *WF, "cancel", run_id, "--project", "demo", "--json")
    assert r.code == 0 and r.json()["outcome"] == "never_launched", r.stdout
    out = submit(spec, run_id, env)
    wait_until(lambda: status(env, run_id).json()["state"] == "RUNNING", "the run is RUNNING")
    from npa.core.paths import NpaPaths
    from npa.services.provision import active_runs

    # teardown's guard asks status: a running run is active...
    assert active_runs(NpaPaths(npa_home), "demo") == [run_id]
    r = npa(env, *WF, "cancel", run_id, "--project", "demo", "--json")
    assert r.code == 0 and r.json()["outcome"] == "cancelled", r.stdout
    assert r.json()["job_id"] == out["job_id"]
    w = npa(env, *WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
            "--timeout", "20", "--json")  # fmt: skip
    assert json.loads(w.stdout.splitlines()[-1])["state"] == "CANCELLED" and w.code == 1
    again = npa(env, *WF, "cancel", run_id, "--project", "demo", "--json")
    assert again.code == 0 and again.json()["outcome"] == "already_final"
    # ...and one proven final is not.
    assert active_runs(NpaPaths(npa_home), "demo") == []


def test_not_found_only_when_every_source_answered(env: dict[str, str], npa_home: Path) -> None:
    r = status(env, "20260101-000000-abcdef")
    assert r.code == 3, r.stdout + r.stderr
    body = r.json()
    assert body["state"] == "NOT_FOUND"
    # (The run index is not complete before a first list: it is skipped, and the store scanned.)
    answers = {s["source"]: s["answer"] for s in body["sources"]}
    assert answers.pop("run-index") == "skipped" and answers["store-scan"] == "absent"
    assert set(answers.values()) <= {"absent", "not_applicable"}
    # A folder in the store that is not shaped like a run is never listed as one.
    junk = npa_home / "store" / "tiny-local" / "not-a-run" / "npa-workflow"
    junk.mkdir(parents=True)
    (junk / "manifest.json").write_text("{}")
    (npa_home / "store" / "tiny-local" / "20260101-000000-abcdef" / "other").mkdir(parents=True)
    r = npa(env, *WF, "list", "--project", "demo", "--json")
    # Nothing of "demo" exists anywhere: a name nobody configured or ran is a typo, not 0 runs.
    assert r.code == 3 and r.json()["error"]["kind"] == "not_found", r.stdout
    assert npa(env, "configure", "--project", "demo", "--store", "local").code == 0
    r = npa(env, *WF, "list", "--project", "demo", "--json")
    assert r.code == 0 and r.json()["runs"] == [], r.stdout


def test_receipt_without_manifest_is_manifest_pending(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    run_id = prepare(spec, env)
    receipt = {
        "version": 1, "project": "demo", "project_identity": "unconfigured:demo",
        "workflow": "tiny-local", "run_id": run_id, "submitted_at": "2026-01-01T00:00:00+00:00",
        "store": (npa_home / "store").as_uri(),
        "workflow_prefix": f"{(npa_home / 'store').as_uri()}/tiny-local/{run_id}/npa-workflow",
        "credentials_source": "none", "job": {"backend": "local", "job_name": "n"},
    }  # fmt: skip
    path = npa_home / "workflow-submissions" / "demo" / f"{run_id}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(receipt))
    r = status(env, run_id)
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["state"] == "MANIFEST_PENDING"


def test_resume_after_a_killed_wave_adopts_complete_waves_only(
    spec: Path, env: dict[str, str], npa_home: Path, tmp_path: Path
) -> None:
    counts = tmp_path / "counts"
    counts.mkdir()
    text = spec.read_text()
    # generate counts its runs; square has two waves of one shard, and wave 1 hangs while the
    # file "slow" exists (only during the first submit: the spec never changes). A file, since
    # a stage sees none of the submitter's environment.
    slow = tmp_path / "slow"
    slow.touch()
    text = text.replace(
        'mkdir -p "$NPA_OUTPUT_NUMBERS" &&',
        f'echo x >> {counts}/generate && mkdir -p "$NPA_OUTPUT_NUMBERS" &&',
    )
    text = text.replace(
        '      mkdir -p "$NPA_OUTPUT_SQUARES" &&',
        f"      echo $NPA_WAVE >> {counts}/square &&\n"
        f'      {{ [ ! -e {slow} ] || [ "$NPA_WAVE" != 1 ] || sleep 60; }} &&\n'
        '      mkdir -p "$NPA_OUTPUT_SQUARES" &&',
    )
    text = text.replace(
        '> "$NPA_OUTPUT_SQUARES/squares.txt"',
        '> "$NPA_OUTPUT_SQUARES/squares-$NPA_SHARD.txt"',
    ).replace("cat_squares", "")
    text = text.replace(
        "awk '{ s += $1 } END { print s }' \"$NPA_INPUT_SQUARES/squares.txt\"",
        "cat \"$NPA_INPUT_SQUARES\"/squares-*.txt | awk '{ s += $1 } END { print s }'",
    )
    text = text.replace("      shards: 2\n      parallel: 2", "      shards: 2\n      parallel: 1")
    spec.write_text(text)
    run_id = prepare(spec, env)
    first = submit(spec, run_id, env)
    wait_until(
        lambda: (counts / "square").exists() and "1" in (counts / "square").read_text().split(),
        "wave 1 started",
    )
    import os
    import signal

    from npa.backends.local.jobs import LocalJobTable
    from npa.core.paths import NpaPaths

    table = LocalJobTable(NpaPaths(npa_home))
    job = table.read(first["job_id"])
    assert job.executor is not None
    os.kill(job.executor.pid, signal.SIGKILL)  # as a node loss or an OOM kill would
    # Its lock goes with it, and its stage processes die with it: no orphan.
    wait_until(lambda: table.executor_holding(first["job_id"]) is None, "the lock was freed")
    wait_until(lambda: not run_processes(run_id), "no process of the run is left")
    r = status(env, run_id)
    body = r.json()
    assert body["state"] == "FAILED_CONTROLLER", body
    assert body["stages"]["square"]["waves"].startswith("1/")

    slow.unlink()
    r = npa(env, *WF, "submit", str(spec), "--project", "demo", "--resume-run", run_id,
            "--runtime", "process", "--json")  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    resumed = r.json()
    assert resumed["outcome"] == "launched" and resumed["job_id"] != first["job_id"]
    assert resumed["resume"]["adopted_stages"] == ["generate"]
    assert resumed["resume"]["adopted_waves"] == {"square": [0]}
    assert resumed["job_name"].endswith("-r1")
    w = npa(env, *WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
            "--json")  # fmt: skip
    assert w.code == 0 and json.loads(w.stdout.splitlines()[-1])["state"] == "SUCCEEDED", w.stdout
    # generate ran once; square's wave 0 once; only the killed wave 1 ran again.
    assert (counts / "generate").read_text().split() == ["x"]
    assert (counts / "square").read_text().split() == ["0", "1", "1"]
    out = npa_home / "store/tiny-local" / run_id / "npa-workflow/stages/total/outputs/total.txt"
    # Each shard squares all 100 numbers into its own file: the adopted wave 0's file and the
    # rerun wave 1's file are both summed.
    assert out.read_text().strip() == str(2 * 338350)

    # Resuming again adopts the finished job; nothing is launched.
    r = npa(env, *WF, "submit", str(spec), "--project", "demo", "--resume-run", run_id,
            "--runtime", "process", "--json")  # fmt: skip
    assert r.code == 0 and r.json()["outcome"] == "adopted", r.stdout
    assert r.json()["job_id"] == resumed["job_id"] and r.json()["resume"] is None


def test_logs_follow_streams_until_the_job_ends(spec: Path, env: dict[str, str]) -> None:
    spec.write_text(
        spec.read_text().replace(
            'mkdir -p "$NPA_OUTPUT_NUMBERS" &&',
            'for i in 1 2 3; do echo tick $i; sleep 0.3; done; mkdir -p "$NPA_OUTPUT_NUMBERS" &&',
        )
    )
    run_id = prepare(spec, env)
    submit(spec, run_id, env)
    r = npa(env, *WF, "logs", run_id, "--project", "demo", "--stage", "generate", "--follow")
    assert r.code == 0, r.stdout + r.stderr
    assert [line.rsplit(" ", 2)[-2:] for line in r.stdout.splitlines() if "tick" in line] == [
        ["tick", "1"], ["tick", "2"], ["tick", "3"]
    ]  # fmt: skip
    assert status(env, run_id).json()["state"] == "SUCCEEDED"  # follow returned at the end


def test_a_job_id_from_another_home_is_never_taken_for_the_run(
    spec: Path, env: dict[str, str], npa_home: Path, tmp_path: Path
) -> None:
    spec.write_text(spec.read_text().replace("seq 1 100", "sleep 30; seq 1 100"))
    run_id = prepare(spec, env)
    submit(spec, run_id, env)
    # Another NPA_HOME whose local job 1 is a different run, reading this run by its prefix.
    other = tmp_path / "other-home" / ".npa"
    job = other / "local-jobs" / "1"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({
        "job_id": 1, "job_name": "npa-other-run", "state": "SUCCEEDED", "submitted_at": 0.0,
    }))  # fmt: skip
    prefix = f"{(npa_home / 'store').as_uri()}/tiny-local/{run_id}"
    elsewhere = {**env, "NPA_HOME": str(other)}
    r = npa(elsewhere, *WF, "status", prefix, "--json")
    assert r.code == 4 and r.json()["state"] == "VERIFICATION_UNAVAILABLE", r.stdout
    r = npa(elsewhere, *WF, "cancel", prefix, "--json")
    assert r.code == 4, r.stdout
    assert status(env, run_id).json()["state"] in ("STARTING", "RUNNING")
    assert npa(env, *WF, "cancel", run_id, "--project", "demo").code == 0


def test_watch_json_streams_each_transition_as_it_happens(
    spec: Path, env: dict[str, str], tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    gate = tmp_path / "let-generate-finish"
    spec.write_text(
        spec.read_text().replace(
            'command: mkdir -p "$NPA_OUTPUT_NUMBERS"',
            f'command: while [ ! -e {gate} ]; do sleep 0.05; done; mkdir -p "$NPA_OUTPUT_NUMBERS"',
        )
    )
    run_id = prepare(spec, env)
    submit(spec, run_id, env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "npa", *WF, "status", run_id, "--project", "demo", "--watch",
         "--interval", "0.2", "--heartbeat", "1", "--json"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    try:
        # The first event arrives while the run is held at its first stage: it is streamed.
        for line in proc.stdout:
            seen.append(json.loads(line))
            if any(e.get("event") == "heartbeat" for e in seen):
                break
        assert proc.poll() is None, "the watch ended before the run was let go"
        gate.touch()
        seen += [json.loads(line) for line in proc.stdout]
    finally:
        gate.touch()
        proc.wait(timeout=120)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    *events, final = seen
    assert final["state"] == "SUCCEEDED" and final["watched"]
    generate = [(e["before"], e["after"]) for e in events if e.get("stage") == "generate"]
    assert generate[-1][1] == "SUCCEEDED" and len(generate) >= 2, generate
    assert any(e["event"] == "heartbeat" and e["after"] == "RUNNING" for e in events), events
