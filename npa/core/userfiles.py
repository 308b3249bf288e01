"""Reading a file the user named: a regular file, read with a size cap, or a clear refusal.

A path on the command line can name anything: ``/dev/zero``, a FIFO nobody writes to, a
directory, or a 1 GB file where a 2 KB one belongs. Each of those must end in an input error
(exit 2) that says what the path is, never in a hang, a ``MemoryError`` or a traceback. So
the file is opened without blocking (a FIFO does not wait for a writer), its type and size come
from the open descriptor (no race with a rename), and at most ``limit + 1`` bytes are ever read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from npa.core.errors import InvalidInput, NotFound

# Big enough for any spec, quota file, evidence file or docker config a person writes.
DEFAULT_LIMIT = 8 * 1024 * 1024
_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_user_bytes(
    path: Path,
    what: str,
    *,
    limit: int = DEFAULT_LIMIT,
    missing_is_not_found: bool = False,
) -> bytes:
    """The bytes of the regular file ``path`` (``what`` names it in errors, e.g. "quota file").

    Raises InvalidInput (exit 2) for anything else: a missing file (NotFound, exit 3, when
    ``missing_is_not_found``), a directory, device, FIFO or socket, a file over ``limit`` bytes,
    or one that cannot be read.
    """
    fix = f"ls -l {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        error = NotFound if missing_is_not_found else InvalidInput
        raise error(f"{what} {path} does not exist", fix=f"ls -l {path.parent}") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc.strerror}", fix=fix) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(
                f"{what} {path} is {_kind(info.st_mode)}; npa reads only regular files",
                fix=f"{fix}  # what is there; npa takes the path of a regular file",
            )
        if info.st_size > limit:
            raise InvalidInput(
                f"{what} {path} is {info.st_size} bytes; npa reads at most {limit} bytes",
                fix=fix,
            )
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while we read it
                raise InvalidInput(
                    f"{what} {path} is larger than {limit} bytes; npa reads at most that",
                    fix=fix,
                )
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc.strerror}", fix=fix) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_user_text(
    path: Path,
    what: str,
    *,
    limit: int = DEFAULT_LIMIT,
    missing_is_not_found: bool = False,
) -> str:
    """:func:`read_user_bytes`, decoded as UTF-8 (anything else is an input error)."""
    raw = read_user_bytes(path, what, limit=limit, missing_is_not_found=missing_is_not_found)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{what} {path} is not UTF-8 text (byte {exc.start})", fix=f"iconv -t UTF-8 {path}"
        ) from None
