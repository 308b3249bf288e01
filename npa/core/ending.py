"""How npa ends on SIGTERM and SIGHUP: every helper it waits on first, then itself.

The command line installs this at start-up, so it must stay light (``npa --help`` is instant):
it imports nothing of npa's. The helpers are the ones :func:`npa.core.procs.run_child` started
(each group ended whole), then any other descendant still in npa's session: a child a library
started itself (the Pulumi Automation API's ``pulumi`` and its plugins). Processes started in a
session of their own are meant to outlive npa and are left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading


def _session_descendants() -> list[int]:
    """This process's descendants still in its session: the helpers something started for npa
    without :func:`npa.core.procs.run_child` (the Pulumi Automation API's ``pulumi`` and its
    plugins, a library's own subprocess). A process started in a session of its own (a run's
    watcher, the API server's keeper) is meant to outlive npa and is not one of them."""
    me = os.getpid()
    sid = os.getsid(0)
    parent_of: dict[int, int] = {}
    session_of: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 4 and fields[0] not in ("Z", "X"):
            parent_of[int(entry)], session_of[int(entry)] = int(fields[1]), int(fields[3])
    found: list[int] = []
    frontier = [me]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parent_of.items():
            if ppid == parent and session_of.get(pid) == sid and pid not in found:
                found.append(pid)
                frontier.append(pid)
    return found


# How long a descendant has to stop on SIGINT (pulumi cancels its update and writes its state)
# before it is killed.
DESCENDANT_GRACE = 5.0


def end_descendants(grace: float = DESCENDANT_GRACE) -> None:
    """End every descendant of this process in its session (:func:`_session_descendants`):
    SIGINT first, as a terminal's Ctrl-C would (a program stops cleanly), then SIGKILL for any
    still alive after ``grace`` seconds."""
    import time

    sid = os.getsid(0)
    found = _session_descendants()
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    # A descendant whose parent ended is no longer below npa: the ones found stay tracked, by
    # pid and session (a pid reused within the grace by another session is not touched).
    while (alive := [pid for pid in found if _in_session(pid, sid)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    for pid in alive + _session_descendants():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _in_session(pid: int, sid: int) -> bool:
    """Whether ``pid`` lives (not a zombie) in session ``sid``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return len(fields) > 3 and fields[0] not in ("Z", "X") and int(fields[3]) == sid


def _end_on_signal(signum: int, frame: object) -> None:
    procs = sys.modules.get("npa.core.procs")
    if procs is not None:
        procs.end_children()
    end_descendants()
    # Leave as an exit, not by the signal's default action: finally blocks and atexit handlers
    # (temporary directories, locks) still run. 128 + N is what a shell reports for signal N.
    raise SystemExit(128 + signum)


def end_children_on_signals() -> None:
    """Make SIGTERM and SIGHUP end every helper npa waits on, then npa itself (exit 128+N).
    Installed by the command line's entry point; a process that handles these signals its own
    way (a run's executor) installs its own handlers after this."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _end_on_signal)
