"""Reading a file the user named: a regular file, read with a size cap, or a clear refusal.

A path on the command line can name anything: ``/dev/zero``, a FIFO nobody writes to, a
directory, or a 1 GB file where a 2 KB one belongs. Each of those must end in an input error
(exit 2) that says what the path is, never in a hang, a ``MemoryError`` or a traceback. So
the file is opened without blocking (a FIFO does not wait for a writer), its type and size come
from the open descriptor (no race with a rename), and at most ``limit + 1`` bytes are ever read.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
from typing import Literal

from npa.core.errors import InvalidInput, NotFound

#: How a file's bytes become text: "utf-8" only, or every encoding YAML 1.2 reads.
Encodings = Literal["utf-8", "yaml"]

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
    encodings: Encodings = "utf-8",
) -> str:
    """:func:`read_user_bytes`, decoded by :func:`decode_user_text`."""
    raw = read_user_bytes(path, what, limit=limit, missing_is_not_found=missing_is_not_found)
    return decode_user_text(raw, path, what, encodings=encodings)


# The encodings YAML 1.2 (section 5.2) reads, told apart by the first bytes: a byte-order mark,
# else where the first character's NUL bytes are (an ASCII first character in UTF-16 or UTF-32),
# else UTF-8. Windows PowerShell 5 writes UTF-16 with a mark (`>` and Out-File), so a spec saved
# there is text npa reads as any YAML reader would. Longest first: FF FE 00 00 is UTF-32's mark.
_ENCODINGS = (
    (b"\x00\x00\xfe\xff", "utf-32-be", 4),
    (b"\xff\xfe\x00\x00", "utf-32-le", 4),
    (b"\xfe\xff", "utf-16-be", 2),
    (b"\xff\xfe", "utf-16-le", 2),
)


def _detected_encoding(raw: bytes) -> tuple[str, int]:
    """The encoding YAML 1.2 reads ``raw`` in, and the length of its byte-order mark (0 for
    none; UTF-8's mark is left in the text, where YAML and JSON readers skip it)."""
    for mark, encoding, size in _ENCODINGS:
        if raw.startswith(mark):
            return encoding, size
    head = raw[:4]
    if len(head) == 4 and head[:3] == b"\0\0\0" and head[3]:
        return "utf-32-be", 0
    if len(head) == 4 and head[0] and head[1:] == b"\0\0\0":
        return "utf-32-le", 0
    if len(head) >= 2 and not head[0] and head[1]:
        return "utf-16-be", 0
    if len(head) >= 2 and head[0] and not head[1]:
        return "utf-16-le", 0
    return "utf-8", 0


def decode_user_text(raw: bytes, path: Path, what: str, *, encodings: Encodings = "utf-8") -> str:
    """``raw`` as text. ``encodings="yaml"``, for a file only npa reads (a spec, a quota file,
    a digests file): in the encoding :func:`_detected_encoding` finds, as any YAML reader would.
    ``"utf-8"``, for a file other programs read too (a kubeconfig, a registry's credentials,
    which SkyPilot's Kubernetes client and docker read as UTF-8 only): UTF-8 alone, so npa
    never takes a file its neighbours refuse.

    Anything else is an input error that says what the file holds or where its bytes stop
    being text, and a command that writes a UTF-8 copy beside it (the source encoding a guess
    for a file that says nothing of its own)."""
    encoding, mark = _detected_encoding(raw)
    name = encoding.upper().replace("-BE", "BE").replace("-LE", "LE")
    if encodings == "yaml" or encoding == "utf-8":
        try:
            return raw[mark:].decode(encoding)
        except UnicodeDecodeError as exc:
            bad = exc.start + mark
        if encoding == "utf-8":
            line, start = raw.count(b"\n", 0, bad) + 1, raw.rfind(b"\n", 0, bad) + 1
            where = f"at line {line}, byte {bad - start + 1}"
        else:  # lines are not bytes there
            where = f"at offset {bad} of the file's {len(raw)} bytes"
        problem = f"is not {name} text: byte 0x{raw[bad]:02x} {where}"
    else:
        problem = f"is {name} text"
    readers = (
        "npa reads UTF-8, UTF-16 and UTF-32 here, as YAML does"
        if encodings == "yaml"
        else "npa reads it as UTF-8, as the other programs that read it do"
    )
    fix, note = _conversion(raw, path, encoding, name)
    raise InvalidInput(f"{what} {path} {problem} ({readers})", fix=fix + "  # " + note)


def _conversion(raw: bytes, path: Path, encoding: str, name: str) -> tuple[str, str]:
    """The command that writes a UTF-8 copy of ``path`` beside it, and what to know of it."""
    copy = path.with_name(f"{path.stem}.utf8{path.suffix}")
    into = ["-t", "UTF-8", "-o", str(copy)]
    check = f"check {copy}, then use it"
    if encoding == "utf-8":
        source = "WINDOWS-1252" if _decodes(raw, "cp1252") else "ISO-8859-1"
        return shlex.join(["iconv", "-f", source, *into, str(path)]), (
            f"if it was saved as {source}; {check}"
        )
    if _decodes(raw, encoding):
        return shlex.join(["iconv", "-f", name, *into, str(path)]), check
    # Cut short, or not that encoding after all: whole characters only, and what converts.
    whole = len(raw) - len(raw) % (4 if "32" in name else 2)
    fix = shlex.join(["head", "-c", str(whole), str(path)]) + " | "
    return fix + shlex.join(["iconv", "-c", "-f", name, *into]), (
        f"leaves out what is not {name}; {check}"
    )


def _decodes(raw: bytes, encoding: str) -> bool:
    try:
        raw.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True
