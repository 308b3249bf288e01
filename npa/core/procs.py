"""Processes npa started, told apart by identity rather than by pid alone.

A pid is reused once its process is gone, so "pid 4242 runs" proves nothing about the process
npa recorded as 4242. An identity is the pid plus the process's start time (clock ticks since
boot, from ``/proc/<pid>/stat``); a process with the same pid but another start time is another
process. Where ``/proc`` does not exist the start time is None and only the pid can be checked.

Stage processes run in process groups of their own; a group is npa's while any process is in
it (the kernel never hands out a group's id as a new pid while the group has members) and its
leader, when it still lives, is the process npa recorded. The kernel keeps a pid number taken
while any process uses it as its pid, its group's id or its session's id (a zombie included), so
a parent that has not yet reaped a group's leader can signal the group by that id safely.

Every helper process npa waits on (pip, a container engine, a credential helper, pulumi) is
started by :func:`run_child`: in a process group of its own, and ended with all its descendants
when npa ends early (a timeout, Ctrl-C, SIGTERM or SIGHUP; :mod:`npa.core.ending`). The
processes that are meant to outlive the command that started them (a run's watcher, the SkyPilot
API server's keeper) are started apart, in sessions of their own, and documented as such.

A temporary file npa writes carries its writer in its name (:func:`writer_tag`: this host, the
pid, the start time), so whoever finds the file can tell a writer that died on this host (its
file is removed at once) from a live one or another host's (:func:`temp_abandoned`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# Another host's writer is taken for dead once its temporary file is untouched this long (a live
# writer keeps writing to its file).
TEMP_MAX_AGE = 600.0


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from its third field (the state) on; None when unreadable."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or parentheses.
    return text.rsplit(")", 1)[-1].split()


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None when it cannot be read."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def pid_running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (killed, not yet reaped) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        return True
    return fields[0] not in ("Z", "X")


@dataclass(frozen=True)
class ProcessIdentity:
    """One process: its pid and its start time (None where the system does not say). A
    dataclass: the file store imports this module, and nothing here needs pydantic."""

    pid: int
    start: int | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        return cls(pid=pid, start=start_time(pid))

    @classmethod
    def current(cls) -> ProcessIdentity:
        return cls.of(os.getpid())

    def alive(self) -> bool:
        """True while this very process runs (not another one that got its pid)."""
        if not pid_running(self.pid):
            return False
        return self.start is None or start_time(self.pid) in (None, self.start)

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to this process if it is still this process; True when sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def __str__(self) -> str:
        return f"pid {self.pid}" + (f" (started at tick {self.start})" if self.start else "")


@dataclass(frozen=True)
class GroupMember:
    pid: int
    command: str


def group_members(leader: ProcessIdentity) -> list[GroupMember]:
    """The live processes of the process group ``leader`` started (its pgid is its pid).

    Empty when the group is gone, or when the pid now leads a group of another process (the
    leader lives under the same pid with another start time). Without ``/proc`` only the
    leader itself can be seen."""
    if not PROC.is_dir():
        return [GroupMember(leader.pid, "?")] if leader.alive() else []
    if pid_running(leader.pid) and not leader.alive():
        return []  # the id was reused: that group is not the one npa started
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or len(fields) < 3 or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == leader.pid:
            members.append(GroupMember(int(entry.name), command_of(int(entry.name))))
    return members


def command_of(pid: int) -> str:
    """``pid``'s command line, words joined by spaces ("?" when it cannot be read)."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def signal_group(leader: ProcessIdentity, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to every process of ``leader``'s group; True when the group had any."""
    if not group_members(leader):
        return False
    try:
        os.killpg(leader.pid, sig)
    except ProcessLookupError:
        return False
    return True


def end_group(leader: ProcessIdentity, wait: float, poll: float = 0.05) -> list[GroupMember]:
    """SIGKILL every process of ``leader``'s group, again while any lives, until none does or
    ``wait`` seconds have passed; the processes still alive then ([]: the group is gone).

    A process that was forking as the first SIGKILL landed is caught by the next one; one in an
    uninterruptible sleep (a hung network mount) dies only when its call returns."""
    deadline = time.monotonic() + wait
    pause = 0.005
    while True:
        members = group_members(leader)
        if not members or time.monotonic() >= deadline:
            return members
        with contextlib.suppress(ProcessLookupError):  # gone since the look: the next proves it
            os.killpg(leader.pid, signal.SIGKILL)
        time.sleep(pause)
        pause = min(pause * 2, poll)  # most groups are gone at the first look after the kill


def await_exit(pids: Sequence[int], timeout: float) -> None:
    """Return once one of ``pids`` (children not yet reaped) has exited, or ``timeout`` seconds
    have passed, whichever is first. Linux tells it at once through the processes' pidfds
    (``pidfd_open``, 5.3); elsewhere, or when a pidfd cannot be had, this sleeps ``timeout``. A
    signal handler runs meanwhile and the wait then goes on (PEP 475), so a caller that a
    handler sets a flag for sees it within ``timeout``."""
    if not pids:
        return
    opened: list[int] = []
    try:
        try:
            for pid in pids:
                opened.append(os.pidfd_open(pid))
        except ProcessLookupError:  # already reaped, so already exited
            return
        except (AttributeError, OSError):  # no pidfds here (macOS, an old kernel, no fds left)
            time.sleep(timeout)
            return
        waiting = select.poll()
        for fd in opened:
            waiting.register(fd, select.POLLIN)
        waiting.poll(max(0, round(timeout * 1000)))
    finally:
        for fd in opened:
            os.close(fd)


@functools.cache
def host_id() -> str:
    """This host as its pids are numbered, in 12 hex digits: its boot (a reboot numbers pids
    afresh) and its pid namespace (each container numbers its own); the host name where the
    system does not say."""
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        space = os.readlink(PROC / "self/ns/pid")
    except OSError:
        boot, space = socket.gethostname(), ""
    return hashlib.sha256(f"{boot}|{space}".encode()).hexdigest()[:12]


_TAGS: dict[int, str] = {}


def writer_tag() -> str:
    """What a temporary file's name carries of the process writing it: ``HOST-PID-START``
    (START ``n`` where the system does not say)."""
    pid = os.getpid()
    if pid not in _TAGS:  # a forked child is another writer
        me = ProcessIdentity.current()
        _TAGS[pid] = f"{host_id()}-{me.pid}-{me.start if me.start is not None else 'n'}"
    return _TAGS[pid]


def parse_writer_tag(tag: str) -> tuple[str, ProcessIdentity] | None:
    """The host and the process a :func:`writer_tag` names; None for any other text."""
    parts = tag.split("-")
    if len(parts) != 3 or len(parts[0]) != 12 or not parts[1].isdigit():
        return None
    host, pid, start = parts
    if start != "n" and not start.isdigit():
        return None
    return host, ProcessIdentity(pid=int(pid), start=None if start == "n" else int(start))


def temp_abandoned(tag: str, age: float) -> bool:
    """Whether a temporary file whose name carries ``tag`` (and that is ``age`` seconds past
    its last write) will never be finished: at once when its writer was of this host and no
    longer runs (a reused pid does not keep it: the start time differs); for another host's
    writer, or a name that does not say, once untouched for :data:`TEMP_MAX_AGE` seconds. A
    live writer of this host keeps its file however old."""
    writer = parse_writer_tag(tag)
    if writer is not None and writer[0] == host_id():
        return not writer[1].alive()
    return age > TEMP_MAX_AGE


# --- helper processes that end with npa ---------------------------------------------------------

# A helper group still alive this long after SIGKILL is reported by end_group's caller only.
CHILD_END_WAIT = 5.0
_children: dict[int, ProcessIdentity] = {}
_children_lock = threading.Lock()


def run_child(
    argv: Sequence[str],
    *,
    timeout: float,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` with the child in a process
    group of its own that ends with npa: on ``timeout`` (``subprocess.TimeoutExpired`` is then
    raised, as ``subprocess.run`` does), on any exception in npa while it waits (Ctrl-C's
    KeyboardInterrupt included), and on SIGTERM/SIGHUP once :mod:`npa.core.ending` is in
    force. Its own group keeps a terminal's Ctrl-C from reaching it directly: npa ends
    it, with everything it started."""
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        process_group=0,
    )
    leader = ProcessIdentity.of(proc.pid)
    with _children_lock:
        _children[proc.pid] = leader
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        end_group(leader, CHILD_END_WAIT)
        proc.communicate()  # reap it and close the pipes
        raise
    finally:
        with _children_lock:
            _children.pop(proc.pid, None)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def end_children() -> None:
    """SIGKILL the process group of every helper :func:`run_child` is waiting on."""
    with _children_lock:
        leaders = list(_children.values())
    for leader in leaders:
        end_group(leader, CHILD_END_WAIT)
