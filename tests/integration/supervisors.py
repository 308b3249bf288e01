"""Find and stop the SkyPilot supervisors a test's submits started (by the pid each one writes
into its run's lock while it holds it)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from npa.core.paths import NpaPaths
from npa.launch.watch import alive


def live_pid(npa_home: Path, project: str, run_id: str) -> int | None:
    return alive(NpaPaths(root=npa_home), project, run_id)


def wait_gone(npa_home: Path, project: str, run_id: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if live_pid(npa_home, project, run_id) is None:
            return True
        time.sleep(0.05)
    return False


def wait_alive(npa_home: Path, project: str, run_id: str, timeout: float = 120.0) -> bool:
    """True once the run's supervisor holds its lock; False if none did within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if live_pid(npa_home, project, run_id) is not None:
            return True
        time.sleep(0.05)
    return False


def stop_all(npa_home: Path) -> None:
    """SIGKILL every supervisor still holding a run's lock under ``npa_home``."""
    locks = npa_home / "locks"
    for path in sorted(locks.glob("supervisor.*.lock")) if locks.is_dir() else []:
        _, project, run_id = path.name.removesuffix(".lock").split(".", 2)
        pid = live_pid(npa_home, project, run_id)
        if pid is not None and pid > 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            wait_gone(npa_home, project, run_id, timeout=5)
