"""Atomic files and locks against other processes: a writer killed half-way keeps the old
file, and a lock is exclusive across processes and dies with its holder."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from npa.core.errors import LockBusy
from npa.core.fsio import (
    atomic_write_bytes,
    exclusive_lock,
)
from tests.unit.test_fsio import mode_of

pytestmark = pytest.mark.integration


CRASH_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from npa.core import fsio

    target = Path(sys.argv[1])
    where = sys.argv[2]
    real_write, real_replace = os.write, os.replace

    def write_half_then_die(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        os.kill(os.getpid(), signal.SIGKILL)

    def die_before_rename(src, dst):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "write":
        os.write = write_half_then_die
    else:
        os.replace = die_before_rename
    fsio.atomic_write_bytes(target, b"N" * 1_000_000)
    """
)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from npa.core.fsio import exclusive_lock
    with exclusive_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(60)
    """
)


@pytest.mark.parametrize("where", ["write", "rename"])
def test_crash_in_the_middle_of_a_write_keeps_the_old_file(tmp_path: Path, where: str) -> None:
    target = tmp_path / "state.json"
    atomic_write_bytes(target, b"OLD" * 1000)
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, str(target), where], check=False, capture_output=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert target.read_bytes() == b"OLD" * 1000
    # The killed writer left its temp file; the next write removes it.
    assert len(list(tmp_path.iterdir())) == 2
    atomic_write_bytes(target, b"NEW")
    assert target.read_bytes() == b"NEW"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_lock_is_exclusive_across_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / "launch.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(LockBusy) as err, exclusive_lock(lock, timeout=0.3, purpose="launch"):
            pass
        assert time.monotonic() - started >= 0.3
        assert f"pid {holder.pid}" in err.value.message
        assert "launch" in err.value.message
    finally:
        holder.kill()
        holder.wait()
    # SIGKILL released the flock: no stale lock survives its process.
    with exclusive_lock(lock):
        assert mode_of(lock) == 0o600
