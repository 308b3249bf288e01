"""Every file a user names is read with a cap, and only if it is a regular file.

Through the real CLI, under a memory limit, for the spec and every flag that names a file: a
device that never ends, a FIFO nobody writes to, a directory, a sparse 1 GiB file. Each must be
a clean input error (exit 2) naming the path and what it is: no hang, no MemoryError, no
traceback.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.core.errors import InvalidInput, NotFound
from npa.core.userfiles import read_user_bytes, read_user_text

pytestmark = pytest.mark.unit


def test_reader_reads_regular_files_and_refuses_the_rest(tmp_path: Path) -> None:
    small = tmp_path / "small.yaml"
    small.write_bytes(b"a: 1\n")
    assert read_user_bytes(small, "quota file") == b"a: 1\n"
    assert read_user_text(small, "quota file") == "a: 1\n"
    with pytest.raises(InvalidInput, match="at most 4 bytes"):
        read_user_bytes(small, "quota file", limit=4)
    with pytest.raises(InvalidInput, match="does not exist"):
        read_user_bytes(tmp_path / "none", "quota file")
    with pytest.raises(NotFound):
        read_user_bytes(tmp_path / "none", "spec", missing_is_not_found=True)
    (tmp_path / "latin1.yaml").write_bytes(b"caf\xe9\n")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        read_user_text(tmp_path / "latin1.yaml", "spec")
    link = tmp_path / "link.yaml"
    link.symlink_to(small)
    assert read_user_bytes(link, "spec") == b"a: 1\n"  # a link to a regular file is that file
    locked = tmp_path / "locked.yaml"
    locked.write_text("x")
    locked.chmod(0)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(InvalidInput, match="Permission denied"):
            read_user_bytes(locked, "spec")


# Every encoding YAML 1.2 reads, as a writer puts it on disk: (codec, byte-order mark).
_WRITTEN = [
    ("utf-8", b""),
    ("utf-16-le", b"\xff\xfe"),  # Windows PowerShell 5's `>` and Out-File
    ("utf-16-be", b"\xfe\xff"),
    ("utf-32-le", b"\xff\xfe\x00\x00"),
    ("utf-32-be", b"\x00\x00\xfe\xff"),
    ("utf-16-le", b""),
    ("utf-16-be", b""),
    ("utf-32-le", b""),
    ("utf-32-be", b""),
]
# Any text of characters a file can hold (no lone surrogate), and, for a file without a mark,
# one whose first character is ASCII (not NUL): what tells the encoding apart there, as in YAML.
_texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_first = st.characters(min_codepoint=1, max_codepoint=127)


# Without a mark, a NUL among the first characters is part of what tells the encoding apart
# ("0\0" in UTF-8 is 30 00, UTF-16LE's pattern): such a text has its own test below.
_rest = _texts.filter(lambda text: "\x00" not in text[:3])


@given(first=_first, rest=_rest, written=st.sampled_from(_WRITTEN))
def test_text_in_every_encoding_yaml_reads_is_read_as_that_text(
    tmp_path_factory: pytest.TempPathFactory, first: str, rest: str, written: tuple[str, bytes]
) -> None:
    codec, mark = written
    text = first + rest
    path = tmp_path_factory.mktemp("enc") / "spec.yaml"
    path.write_bytes(mark + text.encode(codec))
    assert read_user_text(path, "spec file", encodings="yaml") == text
    if codec != "utf-8":  # a kubeconfig or registry credentials: UTF-8 only, as their readers
        with pytest.raises(InvalidInput, match=f"is {codec.upper()[:6]}"):
            read_user_text(path, "kubeconfig")


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"0\x00a\x00", "0a"),  # x 00: UTF-16LE
        (b"\x000\x00a", "0a"),  # 00 x: UTF-16BE
        (b"0\x00\x00\x00", "0"),  # x 00 00 00: UTF-32LE
        (b"\x00\x00\x000", "0"),  # 00 00 00 x: UTF-32BE
    ],
)
def test_without_a_mark_the_nuls_among_the_first_bytes_decide(
    tmp_path: Path, raw: bytes, text: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(raw)
    assert read_user_text(path, "spec file", encodings="yaml") == text


@given(text=_texts, written=st.sampled_from([w for w in _WRITTEN if w[1]]))
def test_a_byte_order_mark_decides_whatever_the_first_character(
    tmp_path_factory: pytest.TempPathFactory, text: str, written: tuple[str, bytes]
) -> None:
    codec, mark = written
    path = tmp_path_factory.mktemp("enc") / "spec.yaml"
    path.write_bytes(mark + text.encode(codec))
    if codec == "utf-16-le" and text.startswith("\0"):
        return  # FF FE 00 00 is UTF-32's mark: YAML 1.2 reads it so too
    assert read_user_text(path, "spec file", encodings="yaml") == text


def test_utf8_keeps_its_mark_so_a_specs_identity_is_what_it_was(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_user_text(path, "spec file", encodings="yaml") == "\ufeffa: 1\n"
    assert read_user_text(path, "kubeconfig") == "\ufeffa: 1\n"


@given(
    good=st.binary(max_size=30).map(lambda b: b.decode("utf-8", "ignore").encode("utf-8")),
    bad=st.sampled_from([b"\xe9", b"\x93", b"\x81", b"\xff", b"\xc3(", b"\xed\xa0\x80"]),
    after=st.text(st.characters(max_codepoint=127), max_size=10).map(str.encode),
)
def test_bytes_that_are_not_text_are_refused_with_where_they_are(
    tmp_path_factory: pytest.TempPathFactory, good: bytes, bad: bytes, after: bytes
) -> None:
    raw = b"a" + good + bad + after  # an ASCII first byte: read as UTF-8 (or UTF-16 if NUL next)
    path = tmp_path_factory.mktemp("enc") / "my spec.yaml"
    path.write_bytes(raw)
    try:
        text = read_user_text(path, "spec file", encodings="yaml")
    except InvalidInput as exc:
        message = str(exc)
        assert f"spec file {path} is not " in message
        if (at := re.search(r"byte 0x(..) at line (\d+), byte (\d+)", message)) is not None:
            line, column = int(at.group(2)), int(at.group(3))
            offset = sum(len(x) + 1 for x in raw.split(b"\n")[: line - 1]) + column - 1
        else:  # UTF-16 (a NUL second byte): an offset, lines are not bytes there
            at = re.search(r"byte 0x(..) at offset (\d+) of the file's (\d+) bytes", message)
            assert at is not None and int(at.group(3)) == len(raw), message
            offset = int(at.group(2))
        assert raw[offset] == int(at.group(1), 16)
        assert exc.fix is not None
        words = shlex.split(exc.fix.split("  #")[0])  # (the integration tier runs it)
        assert words[0] == "iconv" or words[:2] == ["head", "-c"], exc.fix
        assert str(path) in words  # quoted: it has a space
    else:
        assert raw[1:2] == b"\0"  # only UTF-16 without a mark reads such bytes as text
        assert text
