"""The local backend: stages run on this machine, executed by npa itself.

Launch records a job in the local job table (:mod:`npa.backends.local.jobs`); the run's watcher
then executes it in its own process (:class:`HostsExecutor`, :mod:`npa.backends.local.executor`).

Two runtimes, one stage contract (:mod:`npa.backends.contract`): :class:`LocalContainerBackend`
runs each stage in its image, pinned by digest and pulled by ``submit`` (it declares
:class:`PullsPinnedImages` and :class:`PullsImagesHere`); :class:`LocalBackend` runs host
processes. Both record the backend name ``local``: the runtime a job uses is in its task files,
so reading, cancelling and executing a job need not know which class launched it.

Capabilities: runs on this machine (the local disk must hold the outputs), executed by npa
(hosted), and a resume keeps the finished waves of a partly run stage.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from npa.adapters.containers import ContainerEngine
from npa.backends import contract
from npa.backends.base import (
    AdoptsPartialWaves,
    ExecutionBackend,
    HostsExecutor,
    ImagePull,
    JobRecord,
    JobStages,
    JobState,
    JobSubmission,
    PullsImagesHere,
    PullsPinnedImages,
    QueueAnswer,
    RunRecorder,
    RunsOnThisMachine,
    RunTasks,
)
from npa.backends.local import tasks
from npa.backends.local.jobs import BACKEND, LocalJobTable, ProcessRecord, start_deadline
from npa.core.errors import (
    BackendError,
    BackendUnavailable,
    InvalidInput,
    LaunchRejected,
    NotFound,
    NpaError,
)
from npa.core.paths import NpaPaths
from npa.core.procs import ProcessIdentity

REQUEST_PREFIX = "local-"
# How long cancel waits to see the job stop (its executor gives stages 10 s after SIGTERM).
CANCEL_WAIT = 30.0


class LocalBackend(ExecutionBackend, RunsOnThisMachine, AdoptsPartialWaves, HostsExecutor):
    name = BACKEND

    def __init__(self, paths: NpaPaths) -> None:
        self.paths = paths
        self.table = LocalJobTable(paths)
        self.queue_source = f"local job table {self.table.root}"

    @property
    def task_suffix(self) -> str:
        return ".json"

    @property
    def runtime(self) -> str:
        """How stages run: ``process`` here, ``container`` in :class:`LocalContainerBackend`."""
        return "process"

    def render_tasks(self, run: RunTasks) -> Iterator[tuple[str, str]]:
        return tasks.encoded(run, runtime="process", engine=None)

    def local_state(self) -> list[Path]:
        return [self.table.root]

    # --- launch ------------------------------------------------------------------------------
    def request_launch(self, submission: JobSubmission) -> str:
        for stage in submission.order:
            if stage not in submission.tasks:
                raise LaunchRejected(f"no local task for stage {stage!r}")
            # The executor reads each secret from the environment it inherits from here: one
            # that is not set fails now, before a job exists, not when its stage starts.
            declared = tasks.parse(submission.tasks[stage]).secrets
            try:
                contract.secret_values(declared, os.environ)
            except InvalidInput as error:
                raise InvalidInput(f"stage {stage}: {error.message}", fix=error.fix) from None
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
        if job.state.terminal or job.cancel_requested:
            return False
        if self.table.executor_holding(job_id) is not None:
            return False  # attached: a live executor holds it
        spawned = job.spawned
        starting = (
            spawned is not None
            and (job.executor is None or spawned.at > job.executor.at)
            and spawned.identity.alive()
            and self.table.clock() - spawned.at <= start_deadline()
        )
        return not starting

    def executor_started(self, job_id: int, pid: int) -> None:
        identity = ProcessIdentity.of(pid)
        self.table.update(
            job_id,
            spawned=ProcessRecord(pid=pid, start=identity.start, at=self.table.clock()),
        )

    def execute(self, job_id: int, recorder: RunRecorder) -> int:
        from npa.backends.local.executor import Executor

        try:
            executor = Executor(self.paths, job_id, recorder)
        except (OSError, ValueError, NotFound) as exc:
            print(f"cannot execute local job {job_id}: {exc}", flush=True)
            return 1
        return executor.run()

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
        """Stop what really runs: the live executor, by its proven identity (it stops its
        stages and records CANCELLED), else every stage process group an executor left; returns
        once the job is seen stopped (or raises BackendError saying what still runs)."""
        from npa.backends.local.executor import shard_trees

        job = self.table.update(job_id, cancel_requested=True)
        if job.state.terminal:
            return
        deadline = time.monotonic() + CANCEL_WAIT
        holder = self.table.executor_holding(job_id)
        if holder is not None:
            holder.signal(signal.SIGTERM)
            while self.table.executor_holding(job_id) is not None:
                if time.monotonic() >= deadline:
                    raise BackendError(
                        f"local job {job_id}'s executor ({holder}) did not stop within "
                        f"{CANCEL_WAIT:g}s of SIGTERM",
                        fix=f"kill -KILL {holder.pid}  # then cancel again",
                    )
                time.sleep(0.05)
            if self.table.read(job_id).state.terminal:
                return
        # No executor (it died, or never started): its stage processes are the job's, and so
        # are the containers its container shards started (they carry the run's label).
        trees = [tree for _, tree in shard_trees(self.table.job_dir(job_id))]
        for tree in trees:
            tree.signal(signal.SIGKILL)
        for tree in trees:
            if tree.end(max(0.0, deadline - time.monotonic())):
                raise BackendError(
                    f"stage processes of local job {job_id} did not stop", fix=tree.fix()
                )
        self.remove_leftovers(job_id)
        self.table.update(job_id, state=JobState.CANCELLED, ended_at=time.time())

    def remove_leftovers(self, job_id: int) -> list[str]:
        """Remove the containers a dead executor of this job's run left running (they carry the
        run's label); [] when its stages ran as processes or no engine answers."""
        from npa.adapters.containers import find_engine

        submission = self.table.submission(job_id)
        engines = set()
        for text in submission.tasks.values():
            task = tasks.parse(text)
            if task.runtime == "container" and task.engine:
                engines.add(task.engine)
        removed: list[str] = []
        for name in sorted(engines):
            try:
                engine = find_engine(name)
            except NpaError:
                continue
            if engine is not None:
                removed += engine.remove_labelled(submission.run_id)
        return removed

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


class LocalContainerBackend(LocalBackend, PullsPinnedImages, PullsImagesHere):
    """The local backend running every stage in its image through a container engine."""

    def __init__(self, paths: NpaPaths, engine: ContainerEngine) -> None:
        super().__init__(paths)
        self.engine = engine

    @property
    def runtime(self) -> str:
        return "container"

    def render_tasks(self, run: RunTasks) -> Iterator[tuple[str, str]]:
        return tasks.encoded(run, runtime="container", engine=self.engine.name)

    def pull_context(self) -> str | None:
        return None

    @property
    def verifies_contract(self) -> bool:
        return False

    def pull_images(self, pulls: list[ImagePull]) -> list[str]:
        return [
            self.engine.pull(p.reference, plain_http=p.plain_http, login=p.login) for p in pulls
        ]
