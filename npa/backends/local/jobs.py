"""The local job table: one directory per job under ``$NPA_HOME/local-jobs/<id>/``.

It plays the part SkyPilot's jobs controller plays for managed jobs: it hands out immutable job
ids, answers "which jobs carry this name" authoritatively (it is a local directory), and holds
each job's state, the supervisor's pid and the job's logs, so any shell can follow or cancel a
run. Records are written atomically; ids are allocated under a lock.

    local-jobs/<id>/job.json          state (rewritten by the supervisor as the run moves)
    local-jobs/<id>/submission.json   what to run (no credential)
    local-jobs/<id>/supervisor.lock   held by the live supervisor for its whole life
    local-jobs/<id>/logs/             supervisor.log and <stage>/wave-<w>-shard-<s>.log
    local-jobs/<id>/work/             materialised source, inputs and outputs
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from npa.backends.base import JobRecord, JobState, JobSubmission
from npa.core.errors import BackendUnavailable, NotFound
from npa.core.fsio import (
    atomic_write_json,
    ensure_private_dir,
    exclusive_lock,
    pid_running,
    read_json,
)
from npa.core.paths import NpaPaths

BACKEND = "local"


def jobs_root(paths: NpaPaths) -> Path:
    """Where local jobs live."""
    return paths.local_jobs


class LocalJob(BaseModel):
    """``job.json``."""

    model_config = ConfigDict(extra="forbid")

    job_id: int
    job_name: str
    state: JobState
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    supervisor_pid: int | None = None
    supervisor_started: bool = False
    cancel_requested: bool = False
    current_stage: str | None = None
    failure_reason: str | None = None


class LocalJobTable:
    def __init__(self, paths: NpaPaths) -> None:
        self.paths = paths
        self.root = jobs_root(paths)

    def job_dir(self, job_id: int) -> Path:
        return self.root / str(int(job_id))

    # --- writing ---------------------------------------------------------------------------
    def create(self, submission: JobSubmission) -> int:
        """Allocate the next job id and record the job as PENDING."""
        with exclusive_lock(self.paths.lock("local-jobs"), timeout=30, purpose="a local job id"):
            ensure_private_dir(self.root)
            taken = [int(p.name) for p in self.root.iterdir() if p.name.isdigit()]
            job_id = max(taken, default=0) + 1
            directory = self.job_dir(job_id)
            ensure_private_dir(directory / "logs")
            atomic_write_json(directory / "submission.json", submission.model_dump(mode="json"))
            job = LocalJob(
                job_id=job_id,
                job_name=submission.job_name,
                state=JobState.PENDING,
                submitted_at=time.time(),
            )
            # job.json last: a directory without it is an allocation that never completed.
            self.write(job)
        return job_id

    def write(self, job: LocalJob) -> None:
        atomic_write_json(self.job_dir(job.job_id) / "job.json", job.model_dump(mode="json"))

    def update(self, job_id: int, **changes: Any) -> LocalJob:
        with exclusive_lock(self.job_dir(job_id) / "job.lock", timeout=30, purpose="a job record"):
            job = self.read(job_id).model_copy(update=changes)
            self.write(job)
            return job

    # --- reading ---------------------------------------------------------------------------
    def read(self, job_id: int) -> LocalJob:
        path = self.job_dir(job_id) / "job.json"
        try:
            data = read_json(path)
        except FileNotFoundError:
            raise NotFound(f"local job {job_id} does not exist", fix=f"ls {self.root}") from None
        except OSError as exc:
            raise BackendUnavailable(f"cannot read {path}: {exc.strerror}") from None
        try:
            return LocalJob.model_validate(data)
        except ValidationError as exc:
            raise BackendUnavailable(
                f"{path} is not a local job record: {exc.errors()[0]['msg']}",
                fix=f"mv {path.parent} {path.parent}.broken",
            ) from None

    def submission(self, job_id: int) -> JobSubmission:
        path = self.job_dir(job_id) / "submission.json"
        return JobSubmission.model_validate(read_json(path))

    def all(self) -> list[LocalJob]:
        """Every job, in id order; raises BackendUnavailable when the table cannot be read."""
        try:
            names = sorted((p.name for p in self.root.iterdir() if p.name.isdigit()), key=int)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise BackendUnavailable(f"cannot list {self.root}: {exc.strerror}") from None
        jobs = []
        for name in names:
            if not (self.job_dir(int(name)) / "job.json").exists():
                continue  # an allocation cut short before its record: no job
            jobs.append(self.read(int(name)))
        return jobs

    def supervisor_alive(self, job_id: int) -> bool:
        """True while a supervisor holds the job's supervisor lock."""
        path = self.job_dir(job_id) / "supervisor.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return True
                raise
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def executor_gone(self, job: LocalJob) -> bool:
        """True when the job's executor was started and neither holds the job's lock nor runs
        (a process still starting up has not taken the lock yet)."""
        if not job.supervisor_started or self.supervisor_alive(job.job_id):
            return False
        return job.supervisor_pid is None or not pid_running(job.supervisor_pid)

    def record(self, job: LocalJob) -> JobRecord:
        """The job as the shared record; a live state whose executor is gone reads as
        FAILED_CONTROLLER (the controller of this backend died)."""
        state = job.state
        reason = job.failure_reason
        if not state.terminal and self.executor_gone(job):
            state = JobState.FAILED_CONTROLLER
            reason = reason or "the local supervisor exited without recording a final state"
        return JobRecord(
            backend=BACKEND,
            job_id=job.job_id,
            job_name=job.job_name,
            state=state,
            submitted_at=job.submitted_at,
            ended_at=job.ended_at,
            failure_reason=reason,
            details={
                "supervisor_pid": job.supervisor_pid,
                "current_stage": job.current_stage,
                "job_dir": str(self.job_dir(job.job_id)),
            },
        )
