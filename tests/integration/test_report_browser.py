"""``workflow report`` end to end: real local runs, the real CLI, and the page opened in a real
headless Chromium, whose DOM, request log and screenshot are checked. A store that does not
answer gets no page."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from npa.backends.phases import SUCCEEDED, ShardPhases
from tests.harness.browser import chromium_binary
from tests.harness.browser import look_at_report as look
from tests.harness.cli import run_npa
from tests.harness.procs import wait_until

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
HOSTILE = "<script>document.title='pwned'</script><img src='https://example.invalid/x.png'>"


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_binary()


@pytest.fixture
def env(npa_home: Path) -> dict[str, str]:
    return {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}


def tiny() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    return doc


def submitted(env: dict[str, str], folder: Path, doc: dict[str, Any]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    sub = run_npa(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
                  "--runtime", "process", env=env)  # fmt: skip
    assert sub.code == 0, sub.stdout + sub.stderr
    return run_id


def finished(env: dict[str, str], folder: Path, doc: dict[str, Any]) -> str:
    run_id = submitted(env, folder, doc)
    watch = run_npa(*WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
                    env=env)  # fmt: skip
    assert watch.code in (0, 1), watch.stdout + watch.stderr
    return run_id


def report(env: dict[str, str], run_id: str, out: Path, *extra: str) -> Any:
    res = run_npa(*WF, "report", run_id, "--project", "demo", "--out", str(out), "--json",
                  *extra, env=env)  # fmt: skip
    return res


def test_a_succeeded_run_reads_as_such_in_the_browser(
    chromium: str, env: dict[str, str], tmp_path: Path
) -> None:
    run_id = finished(env, tmp_path / "wf", tiny())
    page = tmp_path / "succeeded.html"
    res = report(env, run_id, page)
    assert res.code == 0, res.stdout + res.stderr
    body = res.json()
    assert body["state"] == "SUCCEEDED" and body["final"] and body["incomplete"] == []
    assert body["path"] == str(page) and body["bytes"] == page.stat().st_size
    dom = look(chromium, page, tmp_path, "succeeded")
    assert dom["state"] == "SUCCEEDED" and dom["title"] == f"npa run {run_id}: SUCCEEDED"
    assert dom["stages"] == [[s, "SUCCEEDED", ""] for s in ("generate", "square", "total")]
    assert [n[0] for n in dom["nodes"]] == ["generate", "square", "total"]
    assert all("SUCCEEDED" in text for _, text in dom["nodes"])
    assert dom["dagHeight"] > 100  # three levels drawn, not an empty box
    assert dom["missing"] == [] and dom["log"] == ""
    assert {status for _, _, status in dom["outputs"]} == {"ok"}
    # square ran one wave of 2 shards; every stage a bar.
    assert dom["bars"] == 3
    assert dom["refresh"] == 0 and dom["banner"] == ""
    standing = dict(dom["sources"])
    assert standing["manifest"] == "record" and standing["store-outputs"] == "live"
    assert any(c.endswith(f"artifacts {run_id} --project demo --json") for c in dom["commands"])


def test_a_failed_stage_with_a_missing_output_shows_why_and_what_next(
    chromium: str, env: dict[str, str], tmp_path: Path
) -> None:
    doc = tiny()
    doc["stages"][1]["command"] = f'echo "{HOSTILE}" >&2; echo no squares today >&2; exit 4'
    run_id = finished(env, tmp_path / "wf", doc)
    page = tmp_path / "failed.html"
    res = report(env, run_id, page)
    assert res.code == 0, res.stdout + res.stderr  # as status: the state was established
    assert res.json()["state"] == "FAILED"
    dom = look(chromium, page, tmp_path, "failed")
    assert dom["title"] == f"npa run {run_id}: FAILED"  # the hostile line did not run
    assert dom["state"] == "FAILED"
    assert dom["stages"] == [
        ["generate", "SUCCEEDED", ""],
        ["square", "FAILED", "payload"],
        ["total", "CANCELLED", ""],
    ]
    square = dict(dom["nodes"])["square"]
    assert "FAILED" in square and "payload" in square
    logs = f"npa workbench workflow logs {run_id} --project demo --stage square"
    assert logs in dom["commands"]
    assert HOSTILE in dom["log"] and "no squares today" in dom["log"]
    assert ["square", "squares", "missing"] in dom["outputs"]
    assert any("square" in m and "squares is missing" in m for m in dom["missing"])
    # The same page with --cached: the backend was never asked, and the page says so.
    cached = tmp_path / "cached.html"
    res = report(env, run_id, cached, "--cached")
    assert res.code == 0 and res.json()["trustworthy"] is False, res.stdout
    dom = look(chromium, cached, tmp_path, "cached")
    assert dom["state"] == "CACHED" and "NOT LIVE-VERIFIED" in dom["banner"]
    assert {s for _, s in dom["sources"] if _ in ("manifest", "backend-job")} == {"cached"}
    # Only the store listing of the outputs was read now; nothing else reads as live.
    assert [n for n, s in dom["sources"] if s == "live"] == ["store-outputs"]


def test_each_shard_attempt_is_recorded_and_drawn_phase_by_phase(
    env: dict[str, str], npa_home: Path, tmp_path: Path
) -> None:
    """A real 2-shard stage whose shard 1 fails its first attempt: the wave runs again, and the
    store holds one phase record per shard attempt beside the shards' start counts, which the
    page draws split into phases with each outcome in words (read as written, then in the
    browser)."""
    doc = tiny()
    square = doc["stages"][1]
    square["retries"] = 1
    square["command"] = (
        '[ "$NPA_SHARD" = 1 ] && [ "$NPA_ATTEMPT" = 1 ] && { echo not this time >&2; exit 3; }; '
        + square["command"]
    )
    run_id = finished(env, tmp_path / "wf", doc)
    stages = npa_home / "store" / "tiny-local" / run_id / "npa-workflow" / "stages"
    attempts = stages / "square" / "attempts"
    records = {p.name: ShardPhases.model_validate_json(p.read_text()) for p in attempts.iterdir()
               if p.name.endswith(".json")}  # fmt: skip
    assert sorted(records) == [f"wave-0-shard-{s}.attempt-{a}.json" for s in (0, 1) for a in (1, 2)]
    assert [(attempts / f"wave-0-shard-{s}").read_text().strip() for s in (0, 1)] == ["2", "2"]
    failed = records["wave-0-shard-1.attempt-1.json"]
    assert (failed.stage, failed.wave, failed.shard, failed.attempt) == ("square", 0, 1, 1)
    assert failed.exit_code == 3 and failed.outcome == "failed (exit 3)"
    assert failed.uploaded_at is None and failed.backend == "local"
    spared = records["wave-0-shard-0.attempt-1.json"]  # exit 0, but its wave failed
    assert spared.exit_code == 0 and spared.uploaded_at is None
    assert spared.outcome == "exit 0, outputs not uploaded" and "wave failed" in spared.note
    for name in ("wave-0-shard-0.attempt-2.json", "wave-0-shard-1.attempt-2.json"):
        r = records[name]
        assert r.outcome == SUCCEEDED and r.exit_code == 0, r
        moments = [r.started_at, r.inputs_at, r.command_started_at, r.command_ended_at,
                   r.uploaded_at, r.ended_at]  # fmt: skip
        assert all(m is not None for m in moments) and moments == sorted(moments), r  # type: ignore[type-var]
        assert [name for name, _, _ in r.phases()] == ["setup", "start", "run", "upload"]
    assert failed.ended_at <= records["wave-0-shard-1.attempt-2.json"].started_at
    for stage in ("generate", "total"):
        [one] = [ShardPhases.model_validate_json(p.read_text())
                 for p in (stages / stage / "attempts").glob("*.json")]  # fmt: skip
        assert one.outcome == SUCCEEDED and (one.shard, one.attempt) == (0, 1)

    page = tmp_path / "phases.html"
    res = report(env, run_id, page)
    assert res.code == 0 and res.json()["state"] == "SUCCEEDED", res.stdout + res.stderr
    text = page.read_text()
    drawn = re.findall(r'<rect class="attempt" data-shard="(\d)" data-attempt="(\d)" '
                       r'data-outcome="([^"]+)"', text)  # fmt: skip
    assert sorted(drawn) == sorted(
        [("0", "1", SUCCEEDED)] * 2  # generate and total
        + [("0", "1", "exit 0, outputs not uploaded"), ("0", "2", SUCCEEDED),
           ("1", "1", "failed (exit 3)"), ("1", "2", SUCCEEDED)]
    )  # fmt: skip
    assert text.count('data-phase="upload"') == 4 and text.count('data-phase="run"') == 6
    # Each wave's launch (the executor asked to start it, to the shard's start) is drawn before
    # the attempt that followed it: the first of generate and total, the second of square's
    # shards (square's wave was asked again for its retry).
    launched = re.findall(r"attempt (\d): [^;<]+; launch [\d.]+ s, setup", text)
    assert text.count('data-phase="launch"') == 4 and sorted(launched) == ["1", "1", "2", "2"]
    chromium = chromium_binary()
    dom = look(chromium, page, tmp_path, "phases")
    assert dom["bars"] == 3  # the waves' bars, as before
    square_rows = [a for a in dom["attempts"] if a[0] == "square"]
    assert square_rows == [
        ["square", "0", "1", "exit 0, outputs not uploaded", "setup start run"],
        ["square", "0", "2", SUCCEEDED, "setup start run upload"],
        ["square", "1", "1", "failed (exit 3)", "setup start run"],
        ["square", "1", "2", SUCCEEDED, "setup start run upload"],
    ]
    # generate and total succeeded at their first attempts: in the timeline, not the table.
    assert len(dom["attempts"]) == 4 and dom["phaseNotes"] == []
    # Each attempt a bar of its phases, outlined, its outcome in the shard row's label.
    assert dom["phases"] == 4 * 4 + 2 * 3 + 4
    assert sorted(dom["outcomes"]) == sorted([SUCCEEDED] * 2 + [a[3] for a in dom["attempts"]])
    assert "s1: a1 exit 3, a2 ok" in dom["shardLabels"]
    assert "s0: a1 no upload, a2 ok" in dom["shardLabels"]
    # The payload retry is marked on the timeline, as before.
    assert "payload" in dom["markers"]

    # A run from before npa recorded phases (the records gone) still gets its bars, and says so.
    for record in stages.glob("*/attempts/*.json"):
        record.unlink()
    old = tmp_path / "old.html"
    assert report(env, run_id, old).code == 0
    dom = look(chromium, old, tmp_path, "no-phases")
    assert dom["bars"] == 3 and dom["attempts"] == [] and dom["phases"] == 0
    assert dom["phaseNotes"] == ["generate", "square", "total"]
    assert "phases were not recorded" in old.read_text()


def test_watch_rewrites_the_page_until_the_run_is_final(
    env: dict[str, str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    doc = tiny()
    doc["stages"][0]["command"] = (
        f"while [ ! -f {gate} ]; do sleep 0.1; done; " + doc["stages"][0]["command"]
    )
    run_id = submitted(env, tmp_path / "wf", doc)
    page = tmp_path / "watched.html"
    argv = [sys.executable, "-m", "npa", *WF, "report", run_id, "--project", "demo",
            "--out", str(page), "--watch", "--interval", "0.5"]  # fmt: skip
    with subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        try:
            wait_until(lambda: page.exists() and 'http-equiv="refresh"' in page.read_text(),
                       "the watch wrote a page that reloads itself", timeout=300)  # fmt: skip
            assert 'name="npa-report-final" content="no"' in page.read_text()
            gate.write_text("go")
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out + err
    text = page.read_text()
    assert 'http-equiv="refresh"' not in text and 'name="npa-report-final" content="yes"' in text
    assert f"npa run {run_id}: SUCCEEDED" in text


@pytest.fixture
def silent_store() -> Iterator[int]:
    """A TCP server on loopback that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def test_a_store_that_does_not_answer_gets_no_page(
    env: dict[str, str], silent_store: int, tmp_path: Path
) -> None:
    env = {**env, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    configure = run_npa("configure", "--project", "demo", "--store", "s3://silent/npa",
                        "--endpoint-url", f"http://127.0.0.1:{silent_store}", env=env)  # fmt: skip
    assert configure.code == 0, configure.stderr
    page = tmp_path / "never.html"
    res = report(env, "20260101-120000-abcdef", page, "--read-timeout", "2")
    assert res.code == 4, res.stdout + res.stderr
    error = res.json()["error"]
    assert error["kind"] == "unavailable" and "No page was written" in error["message"]
    assert not page.exists()
    text = run_npa(*WF, "report", "20260101-120000-abcdef", "--project", "demo", "--out",
                   str(page), "--read-timeout", "2", env=env)  # fmt: skip
    assert text.code == 4 and "error:" in text.stderr and not page.exists()
