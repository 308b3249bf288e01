"""The local job table's liveness rules, on an injected clock: a job is executing only while a
process holds its lock, a job nobody took within the start deadline is FAILED_CONTROLLER with
the command that continues it, and a file store's temporary files are swept by a later writer."""

from __future__ import annotations

import os
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


def test_a_group_that_outlives_sigkill_stops_the_run_naming_its_pids_and_the_kill() -> None:
    from npa.backends.local.executor import ShardTree, group_outlived
    from npa.core.procs import GroupMember

    leader = ProcessIdentity(pid=4242, start=7)
    left = [GroupMember(4243, "sleep 300"), GroupMember(4250, "cat /mnt/hung")]
    error = group_outlived("stage a wave 0 shard 1", ShardTree(leader), left, submission())
    assert error.message.startswith("stage a wave 0 shard 1: processes of its group are still")
    assert "(pids 4243, 4250)" in error.message
    assert error.fix == "kill -KILL -- -4242; npa workbench workflow status r --project demo"
    # A shard with a cgroup: the fix ends the cgroup too, and removes it.
    tree = ShardTree(leader, Path("/sys/fs/cgroup/npa-local-1-2-3"))
    error = group_outlived("stage a wave 0 shard 1", tree, left, submission())
    assert error.fix == (
        "kill -KILL -- -4242; echo 1 > /sys/fs/cgroup/npa-local-1-2-3/cgroup.kill; "
        "rmdir /sys/fs/cgroup/npa-local-1-2-3; npa workbench workflow status r --project demo"
    )


def test_a_shard_s_record_carries_its_cgroup_and_reads_back(tmp_path: Path) -> None:
    from npa.backends.local.executor import ShardTree, shard_trees

    folder = tmp_path / "shards" / "a" / "w0" / "a1"
    folder.mkdir(parents=True)
    trees = [
        ShardTree(ProcessIdentity(pid=11, start=5), Path("/sys/fs/cgroup/npa-local-1-2-3")),
        ShardTree(ProcessIdentity(pid=12, start=None)),
    ]
    for n, tree in enumerate(trees):
        (folder / f"s{n}.pid").write_text(tree.record())
    assert [tree for _, tree in shard_trees(tmp_path)] == trees
