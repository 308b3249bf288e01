"""No fixture leaves a process or a port behind, even when the test using it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.procs import pid_alive, port_is_open

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_failed_test_still_stops_every_service(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "basetemp"),
            str(ROOT / "tests" / "integration" / "probe_leftovers.py"),
        ],
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
    alive = [pid for pid in seen["pids"] if pid_alive(pid)]
    assert alive == [], f"processes left running: {alive}"
    open_ports = [port for port in seen["ports"] if port_is_open(port)]
    assert open_ports == [], f"ports still listening: {open_ports}"
