"""The local backend's liveness with real processes: an executor that died before it took
the job, and a shard wrapper that outlives its executor."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npa.backends.base import JobState
from npa.backends.local.jobs import LocalJobTable, ProcessRecord
from npa.core.procs import ProcessIdentity
from tests.unit import test_local_liveness as unit
from tests.unit.test_local_liveness import submission

pytestmark = pytest.mark.integration

# The unit file's fixture, used here by name.
table = unit.table


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
