"""No fixture leaves a process or a port behind, even when the test using it fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.procs import ticks_now
from tests.integration.leftovers import ROOT, assert_nothing_left, child_argv

pytestmark = pytest.mark.integration


def test_failed_test_still_stops_every_service(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    since = ticks_now()
    child = subprocess.run(
        child_argv(tmp_path),
        cwd=ROOT,
        env={**os.environ, "NPA_LEFTOVER_RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # The child's only test fails on purpose (exit 1); a skip or an error would be exit 0/2+.
    assert child.returncode == 1, child.stdout + child.stderr
    assert "1 failed" in child.stdout, child.stdout
    seen = json.loads(record.read_text())
    assert len(seen["pids"]) == 3 and len(seen["ports"]) >= 5
    assert_nothing_left(seen, since)


def test_teardown_stops_the_supervisors_a_test_started(tmp_path: Path) -> None:
    """npa's local supervisor outlives its shell by design; the npa_home fixture stops it."""
    record = tmp_path / "record.json"
    since = ticks_now()
    child = subprocess.run(
        child_argv(tmp_path, "test_start_a_long_local_run_then_fail"),
        cwd=ROOT,
        env={**os.environ, "NPA_LEFTOVER_RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 1 and "1 failed" in child.stdout, child.stdout + child.stderr
    seen = json.loads(record.read_text())
    assert len(seen["pids"]) >= 2  # the supervisor and the stage's process
    assert_nothing_left(seen, since)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_test_run_still_stops_every_service(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM tears fixtures down; SIGKILL (no teardown at all) is caught by parent-death."""
    record = tmp_path / "record.json"
    since = ticks_now()
    child = subprocess.Popen(
        child_argv(tmp_path),
        cwd=ROOT,
        env={**os.environ, "NPA_LEFTOVER_RECORD": str(record), "NPA_LEFTOVER_MODE": "hang"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while not record.exists() and time.monotonic() < deadline:
            assert child.poll() is None, "the child pytest ended before using its services"
            time.sleep(0.2)
        seen = json.loads(record.read_text())
        assert len(seen["pids"]) == 3 and len(seen["ports"]) >= 5
        child.send_signal(sig)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert_nothing_left(seen, since)
