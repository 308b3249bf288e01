"""Stage commands that leave processes behind, and the check that no earlier attempt's are alive
when a later attempt of the same shard starts.

A stage command runs :func:`command` first: ``python -m tests.harness.leftovers DIR NAME``. It
checks every process that earlier starts of shard NAME recorded in DIR (by identity, pid and
start time, so a reused pid is not taken for a live leftover) and appends a line to
``DIR/violations`` for each one still alive, then starts background children of its own that
outlive it: a ``sleep`` that ignores SIGTERM and, with ``--setsid``, one that also leaves the
stage's process group and session; their identities go to ``DIR/NAME.<k>`` (one file per start
of the shard). A test then asserts :func:`violations` is empty and, once the run is over,
:func:`recorded_alive` too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.harness.procs import process_start, still_running

ROOT = Path(__file__).resolve().parents[2]
# The children each start leaves: a plain one, and one whose SIGTERM is ignored (an ignored
# signal stays ignored across exec).
CHILDREN = ["exec sleep 600", "trap '' TERM; exec sleep 600"]


def command(folder: Path, name: str, *, setsid: bool = False) -> str:
    """The shell words that run the check-and-leave step for shard ``name`` (shell-expanded:
    ``$NPA_STAGE`` and the like may be in it)."""
    flag = " --setsid" if setsid else ""
    return f"PYTHONPATH={ROOT} {sys.executable} -m tests.harness.leftovers {folder} {name}{flag}"


def starts(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f"{name}.*"), key=lambda p: int(p.suffix[1:]))


def identities_in(path: Path) -> list[list[int]]:
    return [[int(w) for w in line.split()] for line in path.read_text().splitlines() if line]


def recorded_alive(folder: Path) -> list[list[int]]:
    """[pid, start] of every recorded process (of any shard, any start) still alive."""
    return [
        ident
        for path in folder.glob("*.*")
        if path.suffix[1:].isdigit()
        for ident in identities_in(path)
        if still_running(ident)
    ]


def violations(folder: Path) -> list[str]:
    path = folder / "violations"
    return path.read_text().splitlines() if path.exists() else []


def kill_recorded(folder: Path) -> None:
    """SIGKILL what is still alive of the recorded processes (a failing test's cleanup)."""
    for pid, _ in recorded_alive(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    folder, name = Path(argv[0]), argv[1]
    earlier = starts(folder, name)
    this = len(earlier) + 1
    found = [
        f"{name} start {this}: pid {pid} (start tick {tick}) of start {path.suffix[1:]} is alive"
        for path in earlier
        for pid, tick in identities_in(path)
        if still_running([pid, tick])
    ]
    if found:
        with open(folder / "violations", "a", encoding="utf-8") as out:
            out.write("".join(f"{line}\n" for line in found))
    shells = [*CHILDREN, *(["trap '' TERM; exec sleep 600"] if "--setsid" in argv[2:] else [])]
    lines = []
    for n, shell in enumerate(shells):
        child = subprocess.Popen(
            ["/bin/sh", "-c", shell],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=n == len(CHILDREN),  # the third: setsid() in the child
        )
        lines.append(f"{child.pid} {process_start(child.pid)}\n")
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    tmp.write_text("".join(lines))
    tmp.rename(folder / f"{name}.{this}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
