"""Progress of source staging on stderr: files and bytes against known totals, with an ETA.

On by default only when stderr is a terminal and the command prints text; ``--progress``
turns it on anywhere (stderr only, so ``--json`` output on stdout stays clean) and
``--no-progress`` turns it off. On a terminal it is a rich bar that redraws in place; when
stderr is not a terminal it is a plain line per phase and then at most one a second.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from npa.runs.staging import Progress

ProgressFlag = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="Show staging progress on stderr (default: only when stderr is a terminal and "
        "--json is not given).",
        show_default=False,
    ),
]

NAMES = {"hash": "hashing", "upload": "uploading"}


def wanted(flag: bool | None, as_json: bool) -> bool:
    """Whether to show progress: the flag when given, else text output to a terminal."""
    if flag is not None:
        return flag
    return not as_json and sys.stderr.isatty()


@contextmanager
def staging_progress(flag: bool | None, as_json: bool) -> Iterator[Progress | None]:
    """A progress reporter for staging (None when progress is off), closed on exit."""
    if not wanted(flag, as_json):
        yield None
    elif sys.stderr.isatty():
        with _bar() as bar:
            yield bar
    else:
        yield _Lines()


@contextmanager
def _bar() -> Iterator[Progress]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    class Bar:
        def __init__(self, rich: Progress) -> None:
            self.rich = rich
            self.tasks: dict[str, TaskID] = {}
            self.files: dict[str, int] = {}
            self.lock = threading.Lock()  # advance() is called from the worker threads

        def begin(self, phase: str, files: int, nbytes: int) -> None:
            if files:
                self.files[phase] = 0
                self.tasks[phase] = self.rich.add_task(
                    NAMES.get(phase, phase), total=nbytes, files=0, total_files=files
                )

        def advance(self, phase: str, files: int, nbytes: int) -> None:
            with self.lock:
                self.files[phase] += files
                self.rich.update(self.tasks[phase], advance=nbytes, files=self.files[phase])

    with Progress(
        TextColumn("{task.description:<9}"),
        BarColumn(),
        TextColumn("{task.fields[files]}/{task.fields[total_files]} files"),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as rich:
        yield Bar(rich)


class _Lines:
    """Plain lines for a log: each phase's totals, then progress at most once a second."""

    INTERVAL = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[str, dict[str, Any]] = {}

    def begin(self, phase: str, files: int, nbytes: int) -> None:
        if not files:
            return
        now = time.monotonic()
        with self._lock:
            self._phases[phase] = {
                "files": 0, "bytes": 0, "total_files": files, "total_bytes": nbytes,
                "started": now, "printed": now,
            }  # fmt: skip
        _say(f"{NAMES.get(phase, phase)}: {files} files, {_mb(nbytes)}")

    def advance(self, phase: str, files: int, nbytes: int) -> None:
        now = time.monotonic()
        with self._lock:
            p = self._phases[phase]
            p["files"] += files
            p["bytes"] += nbytes
            finished = p["files"] >= p["total_files"]
            if not finished and now - p["printed"] < self.INTERVAL:
                return
            p["printed"] = now
            line = _line(NAMES.get(phase, phase), p, now)
        _say(line)


def _line(name: str, p: dict[str, Any], now: float) -> str:
    elapsed = max(now - p["started"], 1e-6)
    rate = p["bytes"] / elapsed
    left = p["total_bytes"] - p["bytes"]
    eta = f"{left / rate:.0f}s" if rate > 0 else "?"
    return (
        f"{name}: {p['files']}/{p['total_files']} files, "
        f"{_mb(p['bytes'], unit=False)}/{_mb(p['total_bytes'])}, {_mb(rate)}/s, ETA {eta}"
    )


def _mb(n: float, *, unit: bool = True) -> str:
    return f"{n / 1e6:.1f}" + (" MB" if unit else "")


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
