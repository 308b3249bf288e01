"""scripts/load-rehearsal: the command runs while burners keep the cores busy, its exit code is
the script's, and no burner outlives the script, however it ends (exit, SIGTERM, SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.harness.procs import pid_alive, wait_until

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load-rehearsal"


def test_the_command_runs_under_burners_and_its_exit_code_is_kept(tmp_path: Path) -> None:
    seen = tmp_path / "pids"
    # The command records the burners it was given, waits until each has burnt CPU, exits 3.
    probe = (
        f'echo "$NPA_REHEARSAL_BURNER_PIDS" > {seen}; '
        "for p in $NPA_REHEARSAL_BURNER_PIDS; do "
        'until [ "$(cut -d" " -f14 /proc/$p/stat)" -gt 5 ]; do :; done; done; exit 3'
    )
    res = subprocess.run(
        [str(SCRIPT), "--burners", "2", "--", "sh", "-c", probe],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 3, res.stderr
    pids = [int(p) for p in seen.read_text().split()]
    assert len(pids) == 2
    assert not any(pid_alive(pid) for pid in pids)
    assert "the command exited 3 under load" in res.stderr


def test_bad_arguments_are_refused_with_the_usage() -> None:
    for args in ([], ["--burners"], ["--burners", "x", "--", "true"], ["--what", "--", "true"]):
        res = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, check=False)
        assert res.returncode == 2 and "usage: scripts/load-rehearsal" in res.stderr, args


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_burner_outlives_the_script(tmp_path: Path, sig: signal.Signals) -> None:
    seen = tmp_path / "pids"
    proc = subprocess.Popen(
        [str(SCRIPT), "--burners", "2", "--", "sh", "-c",
         f'echo "$NPA_REHEARSAL_BURNER_PIDS" > {seen}; exec sleep 600'],
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: seen.exists() and len(seen.read_text().split()) == 2, "burners up")
        pids = [int(p) for p in seen.read_text().split()]
        assert all(pid_alive(pid) for pid in pids)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        wait_until(lambda: not any(pid_alive(pid) for pid in pids), "the burners gone")
    finally:
        # The command (sleep) of a SIGKILLed script is left to its caller: here, the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
