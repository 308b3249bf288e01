"""Durable, owner-only local writes and exclusive locks.

A write goes to a temporary file in the target's directory, is fsynced, then renamed over the
target, and the directory is fsynced: a crash at any point leaves either the old file or the new
one, never a mix. Files are 0600 and directories npa creates are 0700.

A writer killed half-way leaves its temporary file, whose name carries the writer
(:func:`npa.core.procs.writer_tag`); the next write of the same file removes it at once when
that writer was of this host and no longer runs (:func:`remove_abandoned_temps`).

When the system refuses (a full disk, a read-only mount, a missing permission) the writers here
raise :class:`LocalStateUnavailable` naming the path and the fix, never a bare ``OSError``; the
old file is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from npa.core.errors import LockBusy, StateCorrupt, local_state_error
from npa.core.procs import temp_abandoned, writer_tag

FILE_MODE = 0o600
DIR_MODE = 0o700


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents with mode 0700; existing directories are kept."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
            # mkdir's mode is filtered by the umask; set it exactly.
            os.chmod(d, DIR_MODE)
        except FileExistsError:
            continue
        except OSError as exc:
            raise local_state_error(exc, "create the folder", d) from None
    if not path.is_dir():
        # Something else (a file, a dangling link) holds the name: never report it as made.
        raise NotADirectoryError(f"{path} exists and is not a directory")
    return path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def remove_abandoned_temps(folder: Path, prefix: str = "", *, now: float | None = None) -> int:
    """Delete the temporary files in ``folder`` (those whose names start with ``prefix`` and
    carry their writer's tag after it) that their writers will never finish
    (:func:`npa.core.procs.temp_abandoned`); returns how many."""
    when = time.time() if now is None else now
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        tag = entry.name[len(prefix) :].rsplit("-", 1)[0]
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and temp_abandoned(tag, when - info.st_mtime):
                os.unlink(entry.path)
                removed += 1
    return removed


def spawn_detached(module: str, directory: Path, log: Path, npa_home: Path) -> int:
    """Start ``python -m module directory`` in a session of its own (it outlives the shell and
    terminal that started it), output appended to ``log``; returns its pid."""
    # Owner-only, as every file npa writes: a supervisor's log quotes the backend's answers.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    out = os.fdopen(fd, "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=directory,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, "NPA_HOME": str(npa_home)},
        )
    finally:
        out.close()
    return proc.pid


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data`` atomically and durably, owner-only by default."""
    ensure_private_dir(path.parent)
    remove_abandoned_temps(path.parent, _temp_prefix(path))
    tmp = path.parent / f"{_temp_prefix(path)}{writer_tag()}-{time.monotonic_ns()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
    except OSError as exc:
        raise local_state_error(exc, "write", path) from None


def probe_writable(folder: Path, size: int = 4096) -> None:
    """Prove ``folder`` takes a write of ``size`` bytes now (created if missing); raises
    LocalStateUnavailable naming it when the disk is full, read-only or not ours."""
    ensure_private_dir(folder)
    probe = folder / f".npa-probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, b"\0" * size)
            os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(probe)
    except OSError as exc:
        raise local_state_error(exc, "write in", folder) from None


@contextlib.contextmanager
def refusals_named(action: str, path: Path) -> Iterator[None]:
    """Inside the block, an OS refusal (a full disk, a read-only mount, a missing permission)
    is raised as :class:`LocalStateUnavailable` naming ``path``: a write's ENOSPC carries no
    file name of its own, so the caller, who knows where it writes, names it."""
    try:
        yield
    except OSError as exc:
        raise local_state_error(exc, action, path) from None


def atomic_write_text(path: Path, text: str, *, mode: int = FILE_MODE) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: Path, value: Any, *, mode: int = FILE_MODE) -> None:
    """Write ``value`` as stable, human-readable JSON (sorted keys, trailing newline)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write_text(path, text, mode=mode)


def read_json(path: Path) -> Any:
    """Read a JSON state file npa wrote; a file that does not parse is StateCorrupt."""
    raw = path.read_bytes()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateCorrupt(
            f"{path} is not valid JSON ({exc}); it was not written by this version of npa "
            "or was damaged",
            fix=f"mv {path} {path}.broken  # keep it for inspection, then rerun the command",
        ) from exc


def append_line(path: Path, line: str) -> None:
    """Append one line durably (journals): O_APPEND write, then fsync; file created 0600."""
    ensure_private_dir(path.parent)
    if "\n" in line:
        raise ValueError("a journal line cannot contain a newline")
    data = (line + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync(fd)
            except OSError:
                # A torn line would make the journal unreadable: cut it back to the last line.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
    except OSError as exc:
        raise local_state_error(exc, "append to", path) from None


@contextlib.contextmanager
def exclusive_lock(path: Path, *, timeout: float = 0.0, purpose: str = "") -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` for the duration of the block.

    ``timeout`` 0 fails at once when another process holds the lock; otherwise npa waits up to
    ``timeout`` seconds. The lock dies with the process that holds it, so a killed npa never
    leaves a stale lock behind. The holder's pid is written into the file for diagnostics.
    """
    ensure_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        raise local_state_error(exc, "create the lock", path) from None
    try:
        if not flock_within(fd, path, timeout):
            holder = _lock_holder(fd)
            what = f" for {purpose}" if purpose else ""
            raise LockBusy(
                f"another npa process{holder} holds the lock {path}{what}",
                fix=f"flock {shlex.quote(str(path))} true  # waits until that process lets go; "
                "then rerun the same command",
            )
        write_holder(fd)
        yield path
    finally:
        # Closing the descriptor releases the flock.
        os.close(fd)


def flock_within(fd: int, path: Path, timeout: float) -> bool:
    """Take an exclusive ``flock`` on ``fd`` (the file ``path``), waiting up to ``timeout``
    seconds; False when another process still holds it then. A refusal other than "held"
    raises LocalStateUnavailable naming ``path``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise local_state_error(exc, "lock", path) from None
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def write_holder(fd: int, text: str | None = None) -> None:
    """Put the holder's pid (or ``text``) into a lock file it holds, for diagnostics only: on a
    full disk the lock still holds, without the note."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (text if text is not None else f"{os.getpid()}\n").encode(), 0)


def _lock_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""
