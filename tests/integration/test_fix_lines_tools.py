"""The missing-tools fix line is an absolute command that runs from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa.core.errors import LockBusy
from npa.core.fsio import exclusive_lock

pytestmark = pytest.mark.integration


def test_the_tools_fix_is_an_absolute_command_that_runs_from_anywhere(tmp_path: Path) -> None:
    import shlex
    import subprocess

    from npa.core.commands import bootstrap_tools_command

    [script] = shlex.split(bootstrap_tools_command())
    assert Path(script).is_absolute() and Path(script).is_file()
    # From another directory, as a user pastes it: it answers (--plan changes nothing).
    plan = subprocess.run(
        [script, "--plan", "--only", "pulumi"], cwd=tmp_path, capture_output=True, text=True
    )
    assert plan.returncode == 0, plan.stderr
    assert "pulumi" in plan.stdout + plan.stderr


def test_a_busy_lock_suggests_a_command_that_waits_for_it(tmp_path: Path) -> None:
    """The fix was prose ("wait for it to finish"); it is a command that waits for the holder,
    and returns at once when the lock is free."""
    import shlex
    import subprocess

    lock = tmp_path / "x.lock"
    with exclusive_lock(lock), pytest.raises(LockBusy) as busy, exclusive_lock(lock):
        pass
    command = (busy.value.fix or "").split("  #", 1)[0]
    assert shlex.split(command) == ["flock", str(lock), "true"], busy.value.fix
    assert subprocess.run(shlex.split(command), timeout=30, check=False).returncode == 0


def test_a_live_pulumi_lock_suggests_waiting_for_its_process_then_the_resume() -> None:
    import shlex
    import socket
    import subprocess

    from npa.adapters.infra.runner import StackLock
    from npa.services.provision import _after_locks

    resume = "npa provision-if-absent --project p --target local --yes"
    ended = subprocess.Popen(["true"])
    ended.wait()
    here = StackLock(path="l", pid=ended.pid, hostname=socket.gethostname(), stale=False)
    fix = _after_locks([here], resume)
    waits, rest = fix.split("  #", 1)[0].split(" && ", 1)
    assert rest == resume, fix
    assert subprocess.run(shlex.split(waits), timeout=30, check=False).returncode == 0
    elsewhere = StackLock(path="l", pid=1, hostname="another-host", stale=False)
    assert _after_locks([elsewhere], resume).split("  #", 1)[0] == resume
