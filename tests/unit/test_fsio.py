"""Atomic owner-only writes and locks, including crashes in the middle of a write."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from npa.core.errors import LocalStateUnavailable, LockBusy, StateCorrupt, local_state_error
from npa.core.fsio import (
    append_line,
    atomic_write_bytes,
    atomic_write_json,
    ensure_private_dir,
    exclusive_lock,
    probe_writable,
    read_json,
)

pytestmark = pytest.mark.unit


def mode_of(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_atomic_write_creates_owner_only_file_and_dirs(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    atomic_write_json(target, {"run": "r1", "n": 2})
    assert json.loads(target.read_text()) == {"n": 2, "run": "r1"}
    assert mode_of(target) == 0o600
    assert mode_of(tmp_path / "a") == 0o700
    assert mode_of(tmp_path / "a" / "b") == 0o700
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_overwrite_replaces_content_and_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert mode_of(target) == 0o600


def test_umask_does_not_loosen_or_tighten_modes(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        ensure_private_dir(tmp_path / "x" / "y")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "x" / "y") == 0o700


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (errno.ENOSPC, "df -h"),
        (errno.EDQUOT, "df -h"),
        (errno.EROFS, "findmnt -T"),
        (errno.EACCES, "ls -ld"),
    ],
)
def test_a_refused_write_leaves_the_old_file_and_says_where_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, fix: str
) -> None:
    target = tmp_path / "f"
    atomic_write_bytes(target, b"old content")

    def failing_fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(LocalStateUnavailable) as refused:
        atomic_write_bytes(target, b"new content")
    error = refused.value
    assert error.exit_code == 4 and str(target) in error.message
    # A full or read-only disk is the filesystem's state: its command names the folder.
    where = target if code == errno.EACCES else tmp_path
    assert error.fix is not None and error.fix.startswith(f"{fix} {where}  #")
    assert target.read_bytes() == b"old content"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_a_refusal_names_a_path_that_exists_in_its_fix(tmp_path: Path, code: int) -> None:
    # The file a refused write was to create is not there: df, findmnt and ls would fail on it.
    missing = tmp_path / "made" / "not" / "here.db"
    (tmp_path / "made").mkdir()
    error = local_state_error(OSError(code, os.strerror(code)), "write", missing)
    assert str(missing) in error.message
    command = (error.fix or "").split("  #", 1)[0].split()
    assert command[-1] == str(tmp_path / "made"), error.fix
    assert shutil.which(command[0]), error.fix


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_refusal_whose_file_nobody_named_never_says_question_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # A write's ENOSPC carries no file name; the CLI's last resort printed "could not use ?"
    # and "df -h ?". It names the folders npa writes in instead, and its fix runs.
    monkeypatch.setenv("NPA_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    error = local_state_error(OSError(code, os.strerror(code)), "use")
    assert "?" not in error.message + (error.fix or ""), (error.message, error.fix)
    assert str(tmp_path / "home") in error.message and os.strerror(code) in error.message
    command = (error.fix or "").split("  #", 1)[0].split()
    assert str(tmp_path / "home") in command and shutil.which(command[0]), error.fix
    assert all(Path(word).exists() for word in command[1:] if word.startswith("/")), error.fix


def test_the_open_file_limit_is_named_as_a_limit_never_as_a_missing_file(tmp_path: Path) -> None:
    """EMFILE is this process's ``ulimit -n``, reached: the error says so and its fix raises
    the limit, with the real figures (it once said to check that the file exists)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = max(int(n) for n in os.listdir("/proc/self/fd")) + 8
    filler: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (held, hard))
    try:
        with pytest.raises(OSError) as full:  # every descriptor below the limit taken
            while True:
                filler.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        assert full.value.errno == errno.EMFILE
        with pytest.raises(LocalStateUnavailable) as refused:
            atomic_write_bytes(tmp_path / "f", b"x")
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    error = refused.value
    assert error.details["errno"] == errno.EMFILE
    assert f"reached this process's limit of {held} open files" in error.message
    assert error.fix is not None and "exists" not in error.fix
    wanted = max(4096, 4 * held)
    if hard == resource.RLIM_INFINITY or hard > held:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        assert error.fix == f"ulimit -n {raised}  # this shell's open-file limit is {held}"
    else:
        assert error.fix.startswith(f"sudo prlimit --pid $$ --nofile={wanted}:{wanted}")


def test_a_journal_line_that_does_not_fit_is_cut_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "j.jsonl"
    append_line(journal, '{"step": 1}')
    real_write = os.write

    def short_write(fd: int, data: bytes) -> int:
        return real_write(fd, data[:5])  # the disk filled half way through the line

    monkeypatch.setattr(os, "write", short_write)
    with pytest.raises(LocalStateUnavailable, match="full"):
        append_line(journal, '{"step": 2}')
    monkeypatch.undo()
    assert journal.read_text() == '{"step": 1}\n'  # every line still parses


def test_the_lock_holds_when_its_note_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with (
        exclusive_lock(tmp_path / "x.lock"),
        pytest.raises(LockBusy),
        exclusive_lock(tmp_path / "x.lock"),
    ):
        pass


def test_probe_writable_names_a_read_only_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ro"
    probe_writable(folder)
    assert folder.is_dir() and list(folder.iterdir()) == []  # the probe leaves nothing
    real_open = os.open

    def read_only(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(LocalStateUnavailable) as refused:
        probe_writable(folder)
    assert str(folder) in refused.value.message and "Read-only" in refused.value.message
    assert (
        refused.value.fix == f"findmnt -T {folder}  # remount it read-write, or point "
        "NPA_HOME at a writable folder"
    )


def test_read_json_reports_corrupt_state_with_a_fix(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    target.write_text("{not json")
    with pytest.raises(StateCorrupt) as err:
        read_json(target)
    assert str(target) in err.value.message
    assert err.value.fix and err.value.fix.startswith("mv ")


def test_append_line_is_owner_only_and_rejects_newlines(tmp_path: Path) -> None:
    journal = tmp_path / "ops" / "op.jsonl"
    append_line(journal, '{"step": 1}')
    append_line(journal, '{"step": 2}')
    assert journal.read_text().splitlines() == ['{"step": 1}', '{"step": 2}']
    assert mode_of(journal) == 0o600
    with pytest.raises(ValueError):
        append_line(journal, "a\nb")
