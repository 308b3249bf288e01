"""The local job table: one directory per job under ``$NPA_HOME/local-jobs/<id>/``.

It plays the part SkyPilot's jobs controller plays for managed jobs: it hands out immutable job
ids, answers "which jobs carry this name" authoritatively (it is a local directory), and holds
each job's state, who executes it and the job's logs, so any shell can follow or cancel a run.
Records are written atomically; ids are allocated under a lock.

    local-jobs/<id>/job.json          state (rewritten by the executor as the run moves)
    local-jobs/<id>/submission.json   what to run (no credential)
    local-jobs/<id>/executor.lock     held by the live executor for its whole life ("pid start")
    local-jobs/<id>/shards/           each shard process's identity and exit code, per attempt
    local-jobs/<id>/logs/             supervisor.log and <stage>/wave-<w>-shard-<s>.log
    local-jobs/<id>/work/             materialised source, inputs and outputs

Liveness is proven, never assumed: a job is executing only while a process holds its
``executor.lock``. A job with no final state and no such process is read as FAILED_CONTROLLER
(its executor died, or never started within :data:`START_DEADLINE` seconds) and is
*continuable*: rerunning the same ``submit`` starts an executor that continues it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from npa.backends.base import JobRecord, JobState, JobSubmission
from npa.core.errors import BackendUnavailable, NotFound, local_state_error
from npa.core.fsio import (
    atomic_write_json,
    ensure_private_dir,
    exclusive_lock,
    read_json,
)
from npa.core.paths import NpaPaths
from npa.core.procs import ProcessIdentity

BACKEND = "local"
LOCK_NAME = "executor.lock"
# Seconds a job may wait for its executor to take it before it reads as FAILED_CONTROLLER.
START_DEADLINE = 60.0
START_DEADLINE_ENV = "NPA_LOCAL_START_DEADLINE_SECONDS"


def jobs_root(paths: NpaPaths) -> Path:
    """Where local jobs live."""
    return paths.local_jobs


def start_deadline() -> float:
    """:data:`START_DEADLINE`, or what ``NPA_LOCAL_START_DEADLINE_SECONDS`` says."""
    return float(os.environ.get(START_DEADLINE_ENV, START_DEADLINE))


class ProcessRecord(BaseModel):
    """A process npa started or that took a job: its identity, and when (epoch seconds)."""

    model_config = ConfigDict(extra="forbid")

    pid: int
    start: int | None = None
    at: float

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(pid=self.pid, start=self.start)


class LocalJob(BaseModel):
    """``job.json``."""

    model_config = ConfigDict(extra="forbid")

    job_id: int
    job_name: str
    state: JobState
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    spawned: ProcessRecord | None = None  # the last process submit started to execute the job
    executor: ProcessRecord | None = None  # the last process that took the job (its lock)
    executors: int = 0  # how many took it: more than one means it was continued
    cancel_requested: bool = False
    current_stage: str | None = None
    failure_reason: str | None = None
    # Why the last executor stopped without a final state on purpose (a store outage it could
    # not wait out); cleared by the next executor that takes the job.
    interruption: str | None = None


class LocalJobTable:
    def __init__(self, paths: NpaPaths, *, clock: Callable[[], float] = time.time) -> None:
        self.paths = paths
        self.root = jobs_root(paths)
        self.clock = clock

    def job_dir(self, job_id: int) -> Path:
        return self.root / str(int(job_id))

    def lock_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / LOCK_NAME

    # --- writing ---------------------------------------------------------------------------
    def create(self, submission: JobSubmission) -> int:
        """Allocate the next job id and record the job as PENDING."""
        with exclusive_lock(self.paths.lock("local-jobs"), timeout=30, purpose="a local job id"):
            ensure_private_dir(self.root)
            try:
                taken = [int(p.name) for p in self.root.iterdir() if p.name.isdigit()]
            except OSError as exc:
                raise local_state_error(exc, "list", self.root) from None
            job_id = max(taken, default=0) + 1
            directory = self.job_dir(job_id)
            ensure_private_dir(directory / "logs")
            atomic_write_json(directory / "submission.json", submission.model_dump(mode="json"))
            job = LocalJob(
                job_id=job_id,
                job_name=submission.job_name,
                state=JobState.PENDING,
                submitted_at=self.clock(),
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

    def executor_holding(self, job_id: int) -> ProcessIdentity | None:
        """The process holding the job's executor lock (as it wrote itself into the lock), or
        None when nobody holds it. Asked read-only, so a read-only NPA_HOME can answer."""
        path = self.lock_path(job_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BackendUnavailable(f"cannot read {path}: {exc.strerror}") from None
        try:
            try:
                # Shared, so a reader never keeps a starting executor from its exclusive lock
                # for longer than this one call.
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise BackendUnavailable(f"cannot lock {path}: {exc.strerror}") from None
                return _holder(os.pread(fd, 64, 0).decode(errors="replace"))
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def liveness(self, job: LocalJob) -> tuple[JobState, str | None, bool]:
        """The job's state as proven now, the reason when it differs from the record, and
        whether a rerun of submit can continue it (no live executor, no final state)."""
        if job.state.terminal:
            return job.state, job.failure_reason, False
        holder = self.executor_holding(job.job_id)
        if holder is not None:
            if job.cancel_requested:
                return JobState.CANCELLING, "cancel requested; the executor is stopping", False
            return job.state, job.failure_reason, False
        spawned, executor = job.spawned, job.executor
        if executor is not None and (spawned is None or spawned.at <= executor.at):
            why = job.interruption or "exited without recording a final state"
            return JobState.FAILED_CONTROLLER, f"its executor ({executor.identity}) {why}", True
        deadline = start_deadline()
        if spawned is not None:
            waited = self.clock() - spawned.at
            if not spawned.identity.alive():
                log = self.job_dir(job.job_id) / "logs" / "supervisor.log"
                return (
                    JobState.FAILED_CONTROLLER,
                    f"its executor ({spawned.identity}) exited before it took the job "
                    f"(its log: {log})",
                    True,
                )
            if waited > deadline:
                return (
                    JobState.FAILED_CONTROLLER,
                    f"its executor ({spawned.identity}) has not taken the job {waited:.0f}s "
                    f"after it was started (the limit is {deadline:g}s)",
                    True,
                )
            return job.state, None, False
        waited = self.clock() - job.submitted_at
        if waited > deadline:
            return (
                JobState.FAILED_CONTROLLER,
                f"no executor was started for it within {deadline:g}s of its submission",
                True,
            )
        return job.state, None, False

    def record(self, job: LocalJob) -> JobRecord:
        """The job as the shared record: a live state without a live executor reads as
        FAILED_CONTROLLER (the controller of this backend died) and is continuable."""
        state, reason, continuable = self.liveness(job)
        executor = job.executor.identity if job.executor else None
        return JobRecord(
            backend=BACKEND,
            job_id=job.job_id,
            job_name=job.job_name,
            state=state,
            submitted_at=job.submitted_at,
            ended_at=job.ended_at,
            failure_reason=reason,
            continuable=continuable,
            details={
                "executor_pid": executor.pid if executor else None,
                "executors": job.executors,
                "current_stage": job.current_stage,
                "job_dir": str(self.job_dir(job.job_id)),
            },
        )


def _holder(text: str) -> ProcessIdentity:
    """The identity an executor wrote into its lock ("pid start"); pid -1 when unreadable (a
    full disk can keep it from writing)."""
    parts = text.split()
    if parts and parts[0].isdigit():
        start = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        return ProcessIdentity(pid=int(parts[0]), start=start)
    return ProcessIdentity(pid=-1)
