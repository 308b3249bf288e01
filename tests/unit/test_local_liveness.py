"""The local job table's liveness rules, on an injected clock: a job is executing only while a
process holds its lock, a job nobody took within the start deadline is FAILED_CONTROLLER with
the command that continues it, and a file store's temporary files are swept by a later writer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npa.adapters.storage.file import TMP_DIR, TMP_MAX_AGE, FileStore
from npa.backends.base import JobState, JobSubmission
from npa.backends.local.jobs import START_DEADLINE, LocalJobTable, ProcessRecord
from npa.core.paths import NpaPaths
from npa.core.procs import ProcessIdentity

pytestmark = pytest.mark.unit


def submission() -> JobSubmission:
    return JobSubmission(
        job_name="npa-w-r", project="demo", workflow="w", run_id="r", store="file:///s",
        prefix="w/r/npa-workflow", order=["a"], tasks={"a": "{}"},
    )  # fmt: skip


@pytest.fixture
def table(tmp_path: Path) -> tuple[LocalJobTable, list[float]]:
    now = [1_000_000.0]
    return LocalJobTable(NpaPaths(tmp_path / ".npa"), clock=lambda: now[0]), now


def test_a_job_nobody_takes_is_pending_until_the_deadline_then_failed_controller(
    table: tuple[LocalJobTable, list[float]],
) -> None:
    jobs, now = table
    job_id = jobs.create(submission())
    record = jobs.record(jobs.read(job_id))
    assert (record.state, record.continuable) == (JobState.PENDING, False)
    now[0] += START_DEADLINE - 1
    assert jobs.record(jobs.read(job_id)).state is JobState.PENDING
    now[0] += 2
    record = jobs.record(jobs.read(job_id))
    assert (record.state, record.continuable) == (JobState.FAILED_CONTROLLER, True)
    assert f"within {START_DEADLINE:g}s" in (record.failure_reason or "")


def test_a_spawned_executor_that_died_before_taking_the_job_is_failed_at_once(
    table: tuple[LocalJobTable, list[float]],
) -> None:
    jobs, now = table
    job_id = jobs.create(submission())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = ProcessIdentity.of(dead.pid)
    dead.wait()
    jobs.update(job_id, spawned=ProcessRecord(pid=identity.pid, start=identity.start, at=now[0]))
    record = jobs.record(jobs.read(job_id))
    assert (record.state, record.continuable) == (JobState.FAILED_CONTROLLER, True)
    assert "exited before it took the job" in (record.failure_reason or "")


def test_a_live_spawned_executor_gets_the_deadline_to_take_the_job(
    table: tuple[LocalJobTable, list[float]],
) -> None:
    jobs, now = table
    job_id = jobs.create(submission())
    me = ProcessIdentity.current()
    jobs.update(job_id, spawned=ProcessRecord(pid=me.pid, start=me.start, at=now[0]))
    assert jobs.record(jobs.read(job_id)).state is JobState.PENDING
    now[0] += START_DEADLINE + 1
    record = jobs.record(jobs.read(job_id))
    assert (record.state, record.continuable) == (JobState.FAILED_CONTROLLER, True)
    assert "has not taken the job" in (record.failure_reason or "")


def test_a_reused_pid_is_not_the_process_npa_recorded() -> None:
    me = ProcessIdentity.current()
    assert me.alive()
    assert not ProcessIdentity(pid=me.pid, start=(me.start or 0) + 1).alive()


def test_the_next_writer_sweeps_temporary_files_killed_writers_left(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    tmp = tmp_path / "store" / TMP_DIR
    tmp.mkdir(parents=True)
    old, fresh = tmp / "111-old", tmp / "222-fresh"
    for path in (old, fresh):
        path.write_bytes(b"x" * 100)
    past = time.time() - TMP_MAX_AGE - 5
    os.utime(old, (past, past))
    store.put("k", b"v")  # the first write of a process sweeps
    assert not old.exists() and fresh.exists()  # a live writer's file is left alone
    assert store.get("k") == b"v"
    assert sorted(p.name for p in tmp.iterdir()) == ["222-fresh"]


def test_a_shard_wrapper_runs_its_cleanup_then_kills_its_group_when_the_executor_is_gone(
    tmp_path: Path,
) -> None:
    """What a container shard relies on: when the executor's end of the death pipe closes, the
    wrapper first runs its --on-death command (removing the container by name, which a killed
    engine client would leave running), then kills the whole group of the shard."""
    from npa.backends.local.executor import spawn_shard
    from npa.core.procs import group_members

    removed = tmp_path / "removed"
    started = tmp_path / "started"
    death_r, death_w = os.pipe()
    with open(tmp_path / "shard.log", "ab") as log:
        child = spawn_shard(
            ["/bin/sh", "-c", f"touch {started}; exec sleep 600"],
            cwd=tmp_path,
            env=dict(os.environ),
            log=log,
            exit_file=tmp_path / "s0.exit",
            death_fd=death_r,
            on_death=[sys.executable, "-c", f"open({str(removed)!r}, 'w').write('gone')"],
        )
    os.close(death_r)
    leader = ProcessIdentity.of(child.pid)
    deadline = time.monotonic() + 30
    while not started.exists():  # the shard's command runs in the wrapper's group
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    assert len(group_members(leader)) >= 2
    os.close(death_w)  # the executor is gone
    assert child.wait(timeout=60) == -9
    assert removed.read_text() == "gone"
    while group_members(leader):
        assert time.monotonic() < deadline, "the shard's group outlived its executor"
        time.sleep(0.02)
    assert not (tmp_path / "s0.exit").exists()  # cut short: a continuing executor runs it again
