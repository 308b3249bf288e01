"""How npa ends on SIGTERM and SIGHUP: every helper it waits on first, then itself.

The command line installs this at start-up, so it must stay light (``npa --help`` is instant):
it imports nothing of npa's. The helpers are the ones :func:`npa.core.procs.run_child` started;
when that module was never loaded, none exists and there is nothing to end.
"""

from __future__ import annotations

import signal
import sys
import threading


def _end_on_signal(signum: int, frame: object) -> None:
    procs = sys.modules.get("npa.core.procs")
    if procs is not None:
        procs.end_children()
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
