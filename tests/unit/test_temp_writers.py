"""Whose temporary file is it, and is it abandoned: the one rule the file store and npa's own
atomic writes share. A writer of this host that no longer runs leaves its file to be removed at
once; a live one keeps it however old; another host's writer, or a name that does not say, is
judged by the file's age alone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.core.fsio import remove_abandoned_temps
from npa.core.procs import (
    TEMP_MAX_AGE,
    ProcessIdentity,
    host_id,
    parse_writer_tag,
    temp_abandoned,
    writer_tag,
)
from tests.tiers import examples

pytestmark = pytest.mark.unit

HOST = host_id()
ME = ProcessIdentity.current()
# Above the largest pid_max Linux allows (2**22): no process has one of these pids.
NO_PROCESS = st.integers(4_194_304, 2**31 - 1)
STARTS = st.none() | st.integers(0, 2**40)
AGES = st.floats(0, 10 * TEMP_MAX_AGE)
OTHER_HOSTS = st.text("0123456789abcdef", min_size=12, max_size=12).filter(lambda h: h != HOST)


def tag(host: str, pid: int, start: int | None) -> str:
    return f"{host}-{pid}-{'n' if start is None else start}"


def test_this_process_s_tag_names_this_host_and_this_process() -> None:
    assert len(HOST) == 12 and int(HOST, 16) >= 0
    assert parse_writer_tag(writer_tag()) == (HOST, ME)


@settings(max_examples=examples(200))
@given(host=st.text("0123456789abcdef", min_size=12, max_size=12), pid=NO_PROCESS, start=STARTS)
def test_a_tag_reads_back_as_the_host_and_process_it_names(
    host: str, pid: int, start: int | None
) -> None:
    assert parse_writer_tag(tag(host, pid, start)) == (host, ProcessIdentity(pid=pid, start=start))


@settings(max_examples=examples(200))
@given(pid=NO_PROCESS, start=STARTS, age=AGES)
def test_a_dead_writer_of_this_host_leaves_a_file_abandoned_at_once(
    pid: int, start: int | None, age: float
) -> None:
    assert temp_abandoned(tag(HOST, pid, start), age)


@settings(max_examples=examples(200))
@given(shift=st.integers(1, 2**30), age=AGES)
def test_a_reused_pid_does_not_keep_a_dead_writer_s_file(shift: int, age: float) -> None:
    # This test's own pid, live, but with another start time: another (dead) writer.
    assert temp_abandoned(tag(HOST, ME.pid, (ME.start or 0) + shift), age)


@settings(max_examples=examples(100))
@given(age=AGES)
def test_a_live_writer_of_this_host_keeps_its_file_however_old(age: float) -> None:
    assert not temp_abandoned(writer_tag(), age)


@settings(max_examples=examples(200))
@given(host=OTHER_HOSTS, pid=st.integers(1, 2**31 - 1), start=STARTS, age=AGES)
def test_another_host_s_writer_is_judged_by_the_file_s_age_alone(
    host: str, pid: int, start: int | None, age: float
) -> None:
    # Its pid says nothing here, whether or not a process of this host has it.
    assert temp_abandoned(tag(host, pid, start), age) == (age > TEMP_MAX_AGE)


@settings(max_examples=examples(300))
@given(text=st.text(), age=AGES)
def test_a_name_that_names_no_writer_is_judged_by_age_alone(text: str, age: float) -> None:
    if parse_writer_tag(text) is None:
        assert temp_abandoned(text, age) == (age > TEMP_MAX_AGE)


def test_a_sweep_removes_dead_writers_files_at_once_and_old_foreign_ones(tmp_path: Path) -> None:
    old = time.time() - TEMP_MAX_AGE - 5
    files = {
        "dead": f"{tag(HOST, 4_194_999, 12)}-aa",
        "reused": f"{tag(HOST, ME.pid, (ME.start or 0) + 1)}-bb",
        "live": f"{writer_tag()}-cc",
        "live-old": f"{writer_tag()}-dd",
        "foreign": f"{tag('0' * 12 if HOST != '0' * 12 else '1' * 12, 4_194_999, 5)}-ee",
        "foreign-old": f"{tag('0' * 12 if HOST != '0' * 12 else '1' * 12, 7, 5)}-ff",
        "legacy-young": "123-0123abcd",
        "legacy-old": "124-0123abcd",
    }
    for key, name in files.items():
        (tmp_path / name).write_bytes(b"partial")
        if key.endswith("-old"):
            os.utime(tmp_path / name, (old, old))
    (tmp_path / "a-folder").mkdir()
    assert remove_abandoned_temps(tmp_path) == 4
    left = {key for key, name in files.items() if (tmp_path / name).exists()}
    assert left == {"live", "live-old", "foreign", "legacy-young"}
    assert (tmp_path / "a-folder").is_dir()
