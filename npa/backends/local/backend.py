"""The local backend: stages run as processes on this machine, executed by npa itself.

Launch records a job in the local job table (:mod:`npa.backends.local.jobs`); the run's watcher
then executes it in its own process (:class:`HostsExecutor`, :mod:`npa.backends.local.executor`).

Capabilities: runs on this machine (the local disk must hold the outputs), executed by npa
(hosted), and a resume keeps the finished waves of a partly run stage.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

from npa.backends.base import (
    AdoptsPartialWaves,
    ExecutionBackend,
    HostsExecutor,
    JobRecord,
    JobStages,
    JobState,
    JobSubmission,
    QueueAnswer,
    RunRecorder,
    RunsOnThisMachine,
    RunTasks,
)
from npa.backends.local import tasks
from npa.backends.local.jobs import BACKEND, LocalJobTable
from npa.core.errors import BackendUnavailable, LaunchRejected, NotFound
from npa.core.paths import NpaPaths

REQUEST_PREFIX = "local-"


class LocalBackend(ExecutionBackend, RunsOnThisMachine, AdoptsPartialWaves, HostsExecutor):
    name = BACKEND

    def __init__(self, paths: NpaPaths) -> None:
        self.paths = paths
        self.table = LocalJobTable(paths)
        self.queue_source = f"local job table {self.table.root}"

    @property
    def task_suffix(self) -> str:
        return ".json"

    def render_tasks(self, run: RunTasks) -> dict[str, str]:
        return tasks.encode(run)

    # --- launch ------------------------------------------------------------------------------
    def request_launch(self, submission: JobSubmission) -> str:
        for stage in submission.order:
            if stage not in submission.tasks:
                raise LaunchRejected(f"no local task for stage {stage!r}")
        job_id = self.table.create(submission)
        return f"{REQUEST_PREFIX}{job_id}"

    def launch_result(self, request_id: str) -> int:
        if (
            not request_id.startswith(REQUEST_PREFIX)
            or not request_id[len(REQUEST_PREFIX) :].isdigit()
        ):
            raise LaunchRejected(f"{request_id!r} is not a local launch request id")
        job_id = int(request_id[len(REQUEST_PREFIX) :])
        self.table.read(job_id)  # NotFound when the allocation never completed
        return job_id

    # --- execution ---------------------------------------------------------------------------
    def needs_executor(self, job_id: int) -> bool:
        job = self.table.read(job_id)
        return not job.supervisor_started and not job.state.terminal and not job.cancel_requested

    def executor_started(self, job_id: int, pid: int) -> None:
        self.table.update(job_id, supervisor_pid=pid, supervisor_started=True)

    def execute(self, job_id: int, recorder: RunRecorder) -> int:
        from npa.backends.local.executor import Executor

        return Executor(self.paths, job_id, recorder).run()

    # --- reading -----------------------------------------------------------------------------
    def queue(self, job_name: str) -> QueueAnswer:
        jobs = self.table.all()
        return QueueAnswer(
            job_name=job_name,
            source=self.queue_source,
            records=[self.table.record(j) for j in jobs if j.job_name == job_name],
        )

    def job(self, job_id: int) -> JobRecord:
        return self.table.record(self.table.read(job_id))

    def cancel(self, job_id: int) -> None:
        job = self.table.update(job_id, cancel_requested=True)
        if job.state.terminal:
            return
        if self.table.supervisor_alive(job_id) and job.supervisor_pid:
            # The supervisor stops its stage processes and records CANCELLED itself.
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.supervisor_pid, signal.SIGTERM)
            return
        self.table.update(job_id, state=JobState.CANCELLED, ended_at=time.time())

    def logs(
        self,
        job_id: int,
        *,
        follow: bool = False,
        stage: str | None = None,
        stages: JobStages | None = None,
    ) -> Iterator[str]:
        # Each stage writes under logs/<stage>/ (wave-W-shard-S.log); the supervisor's own log
        # sits beside them and belongs to no stage.
        directory = self.table.job_dir(job_id) / "logs"
        if not directory.is_dir():
            raise NotFound(f"local job {job_id} has no logs", fix=f"ls {self.table.root}")
        seen: dict[str, int] = {}
        while True:
            try:
                files = sorted(p for p in directory.rglob("*.log") if p.is_file())
            except OSError as exc:
                raise BackendUnavailable(f"cannot read {directory}: {exc.strerror}") from None
            for path in files:
                rel = str(path.relative_to(directory))
                if stage is not None and not rel.startswith(f"{stage}/"):
                    continue
                with path.open("rb") as f:
                    f.seek(seen.get(rel, 0))
                    data = f.read()
                    seen[rel] = f.tell()
                for line in data.decode("utf-8", "replace").splitlines():
                    yield f"[{rel}] {line}"
            if not follow or self.job(job_id).state.terminal:
                return
            time.sleep(0.5)
