"""``await_exit``: the local executor's wait for a shard's wrapper, on real child processes.

It must return once any child exits (not after its timeout), leave the child unreaped (the
executor keeps a wrapper's pid, its group's id, from reuse until the group is proven gone),
return after its timeout when none exits, and hold no descriptor afterwards. Every wait here
is bounded by a thread join, so a wait that never returns fails instead of hanging."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from npa.core import procs
from npa.core.procs import await_exit

pytestmark = pytest.mark.integration

# pidfds are Linux's (Python 3.9+ on kernel 5.3+: CI's machine and every Linux npa supports);
# on any other system await_exit is its timeout's sleep, which the last two tests hold.
pidfds = pytest.mark.skipif(sys.platform != "linux", reason="pidfds are Linux's")
# Far longer than any of these waits should take: a wait still running then has hung.
BOUND = 60.0


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


def blocked(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A child that runs until its stdin closes."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"], stdin=subprocess.PIPE
    )
    children.append(child)
    return child


def exited(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A child that exits at once (and is not reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    children.append(child)
    return child


def returns(pids: list[int], timeout: float) -> bool:
    """Whether ``await_exit(pids, timeout)`` returned within :data:`BOUND` seconds."""
    waiter = threading.Thread(target=await_exit, args=(pids, timeout), daemon=True)
    waiter.start()
    waiter.join(BOUND)
    return not waiter.is_alive()


def unreaped_exit(child: subprocess.Popen[bytes]) -> bool:
    """Whether ``child`` has exited and is still there to be reaped."""
    flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
    return child.returncode is None and os.waitid(os.P_PID, child.pid, flags) is not None


@pidfds
def test_the_wait_ends_when_one_child_exits_and_leaves_it_unreaped(
    children: list[subprocess.Popen[bytes]],
) -> None:
    waiting = [blocked(children), blocked(children)]
    done = exited(children)
    # A timeout no test waits out: only the exit can end this wait within BOUND.
    assert returns([c.pid for c in [*waiting, done]], timeout=3600)
    assert unreaped_exit(done)
    assert all(c.poll() is None for c in waiting)


@pidfds
def test_the_wait_ends_after_its_timeout_when_no_child_exits(
    children: list[subprocess.Popen[bytes]],
) -> None:
    child = blocked(children)
    assert returns([child.pid], timeout=0.05)
    assert child.poll() is None


@pidfds
def test_a_child_reaped_already_ends_the_wait(children: list[subprocess.Popen[bytes]]) -> None:
    child = exited(children)
    child.wait()
    assert returns([child.pid], timeout=3600)


@pidfds
def test_the_wait_holds_no_descriptor_afterwards(children: list[subprocess.Popen[bytes]]) -> None:
    waiting = [blocked(children) for _ in range(3)]
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(20):
        await_exit([c.pid for c in waiting], 0.001)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_without_pidfds_the_wait_is_its_timeout(
    children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(pid: int) -> int:
        raise OSError(38, "Function not implemented")  # ENOSYS: a kernel before 5.3

    slept: list[float] = []
    monkeypatch.setattr(os, "pidfd_open", refused, raising=False)
    monkeypatch.setattr(procs.time, "sleep", slept.append)
    await_exit([blocked(children).pid], 0.05)
    assert slept == [0.05]


def test_no_children_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(procs.time, "sleep", slept.append)
    await_exit([], 5.0)
    assert slept == []
