"""Disks that say no, for the tests of npa's answers to them: a small tmpfs that can be filled to
the last byte, and read-only bind mounts of folders. Both need root (mount); every mount is
undone when its block ends, also when the test fails.

Without the right to mount, a test is skipped on a developer's machine and fails under CI=true
(as a missing tool does), where a skip would hide the broken set-up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.tools import in_ci


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        message = f"mount {' '.join(args)} failed: {proc.stderr.strip()} (these tests need root)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _umount(path: Path) -> None:
    # Lazy: a process that still has a file open there must not keep the mount (or the test).
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "24m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (created if missing) for the block."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
    try:
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` (a folder, created if missing) read-only for the block: writes there fail with
    EROFS, for root too."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", "remount,ro,bind", str(path))
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def bind(source: Path, target: Path) -> Iterator[Path]:
    """``source`` (a folder) also seen at ``target`` (created if missing) for the block."""
    target.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(source), str(target))
    try:
        yield target
    finally:
        _umount(target)


def fill(folder: Path) -> Path:
    """Fill the filesystem holding ``folder`` to its last byte; returns the filler file (delete
    it to give the space back)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler
