"""The run watcher: the one process that follows a run's job after ``submit`` returns.

``submit`` starts it detached (``python -m npa.launch.watch DIR``, its own session) once the
launch transaction has a job id, or again on a rerun when none is alive
(:func:`ensure_watcher`). It works through the backend interface only, in one of two ways the
backend's capabilities decide:

- **hosted** (:class:`HostsExecutor`): npa itself executes the job. The watcher hands it to the
  backend's executor in this process, with a :class:`ManifestRecorder` that records each step
  in the run's manifest and applies the supervision policy to failed waves.
- **polled** (:class:`PolledByWatcher`): the job runs under a controller npa does not own. For
  its whole life the watcher holds the owner-only lock ``locks/supervisor.<project>.<run>.lock``
  (its pid inside), so at most one ever acts on a run; a second one exits at once.

A polled watcher reads the run's manifest at each poll, then asks the backend for the
manifest's job *by its id* (never by name). A job still going is mirrored into the manifest's
state, and each stage's record into its own task's state (matched by
:meth:`ExecutionBackend.stage_tasks`). A job that ended is classified with
:mod:`npa.launch.supervision` and the verdict recorded in the manifest's ``supervisor`` block:

- transient infrastructure (FAILED_CONTROLLER, FAILED_NO_RESOURCE): a new attempt under the same
  run id, job name ``<name>-a<N>``, through the launch transaction (which adopts that attempt's
  job if it already exists), until ``--max-infrastructure-recoveries`` is spent; then
  INFRASTRUCTURE_RECOVERY_EXHAUSTED;
- payload (FAILED): a new attempt only while ``--retries`` (or the stage's ``retries``) allows;
- actionable configuration (FAILED_SETUP, FAILED_PRECHECKS): no retry; only that job ended;
  also a live job's pod whose image the registry says is absent or forbidden
  (:func:`~npa.launch.supervision.classify_pull_failure`): at the first poll that shows it, the
  job is cancelled by its id and the run ends FAILED_STARTUP, with no threshold counting;
- unknown (the backend did not answer, the job is missing from it, an unmapped status): recorded
  once per episode, nothing is relaunched, and polling goes on.

The new attempt is written to the manifest (state LAUNCHING, the new job name, no job id) before
anything is launched, so a watcher killed half way, or a rerun ``submit``, completes the same
attempt instead of starting another. It exits when the run is terminal, and also when the npa
home it was started from no longer exists.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from npa.adapters.storage import ObjectStore, open_store
from npa.adapters.storage.patient import PatientStore, store_patience
from npa.backends import installed_backends, open_backend
from npa.backends.base import (
    TERMINAL_STATES,
    ExecutionBackend,
    HostsExecutor,
    JobRecord,
    JobState,
    JobSubmission,
    PolledByWatcher,
    PreparesLaunch,
    ReportsLaunchFailures,
    ReportsPodReasons,
    TaskRecord,
    release_ended_run,
)
from npa.core.commands import status_command
from npa.core.errors import BackendUnavailable, LaunchStopped, LockBusy, NotFound, NpaError
from npa.core.fsio import atomic_write_text, ensure_private_dir, exclusive_lock, spawn_detached
from npa.core.layout import (
    manifest_lock,
    relaunch_job_name,
    relaunch_suffix,
    shards_of_wave,
    watcher_dir,
    watcher_lock,
)
from npa.core.paths import NpaPaths
from npa.launch.progress import ManifestRecorder
from npa.launch.readiness import ReadinessCheck, readiness_check
from npa.launch.strays import end_strays, record_strays
from npa.launch.supervision import (
    POD_START,
    PULL_REASONS,
    STARTUP_STATUSES,
    Classification,
    Policy,
    Recovery,
    classify_failed_job,
    classify_pull_failure,
    count_startup_failure,
    failure_signature,
    payload_retries_of,
    record,
)
from npa.launch.transaction import Transaction
from npa.plan.model import StagePlan
from npa.runs.journal import OperationJournal
from npa.runs.manifest import (
    RunManifest,
    StageRecord,
    WaveRecord,
    base_job_name,
    job_stages,
    now_iso,
    read_manifest,
    read_plan,
    update_manifest,
)

SPEC_NAME = "supervisor.json"
# How often a polled watcher asks the backend for other jobs under the run's names: one queue
# request each time, so not at every poll.
STRAY_CHECK_SECONDS = 60.0
STRAY_CHECK_ENV = "NPA_STRAY_CHECK_SECONDS"
LOG_NAME = "supervisor.log"
# How many polls the watcher asks to release the run's resources at its end before it gives up.
RELEASE_ASKS = 3
# A backend's error can carry every job's task YAML (SkyPilot's queue errors do): a log line and
# a recorded detail keep one line of bounded length, and say how much they left out.
LOG_LINE_LIMIT = 2000
DETAIL_LIMIT = 500


def brief(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``limit`` characters at a word."""
    one = " ".join(text.split())
    if len(one) <= limit:
        return one
    cut = one[:limit].rsplit(" ", 1)[0] or one[:limit]
    return f"{cut} ... ({len(one) - len(cut)} more characters)"


_TERMINAL = {s.value for s in TERMINAL_STATES}
# The status a launch the jobs controller tried and failed is counted under.
_LAUNCH = "LAUNCH_FAILED"
# States in which the controller may be retrying a start that keeps failing.
_STARTING = frozenset({JobState.PENDING, JobState.STARTING, JobState.RECOVERING})


@dataclass(frozen=True)
class _Startup:
    """One thing of a live job that could not start, as the watcher counts it."""

    what: str  # unique per failure: a pod (name and uid) or a launch attempt of the job
    stage: str | None
    failure: str  # its signature (identical failures compare equal)
    detail: str  # for the supervisor's record
    reason: str  # for the stage's record
    # An image the registry says is absent or forbidden is actionable configuration at once;
    # anything else that keeps a pod from starting is counted as transient (the threshold).
    classification: Classification = Classification.TRANSIENT_INFRASTRUCTURE


class ReadinessWindow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    window: float
    interval: float


class WatcherSpec(BaseModel):
    """What the detached watcher needs; written by ``submit``, holds no credential."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    submission: JobSubmission
    launch_base: str  # the launch journal/lock name of the run (before any -a<N> attempt)
    job_id: int | None = None  # the job a hosted watcher executes
    readiness: ReadinessWindow | None = None


def _dir(paths: NpaPaths, project: str, run_id: str) -> Path:
    return paths.root / "supervisors" / watcher_dir(project, run_id)


def lock_path(paths: NpaPaths, project: str, run_id: str) -> Path:
    return paths.lock(watcher_lock(project, run_id))


def alive(paths: NpaPaths, project: str, run_id: str) -> int | None:
    """The pid of the live polling watcher of a run, or None when nobody holds its lock."""
    path = lock_path(paths, project, run_id)
    if not path.exists():
        return None
    try:
        with exclusive_lock(path, timeout=0):
            return None
    except LockBusy:
        text = path.read_text().strip()
        return int(text) if text.isdigit() else -1


def ensure_watcher(
    paths: NpaPaths,
    backend: ExecutionBackend,
    submission: JobSubmission,
    *,
    job_id: int,
    launch_name: str,
    base_name: str,
    readiness: ReadinessCheck | None,
) -> int | None:
    """Start the run's watcher unless one is already at work; returns its pid (None when the
    backend needs none, or it was switched off, or the job needs no executor any more).
    ``base_name`` is the run's job name before any relaunch (``base_job_name``)."""
    hosted = isinstance(backend, HostsExecutor)
    if isinstance(backend, HostsExecutor):
        if not backend.needs_executor(job_id):
            return None
    elif not isinstance(backend, PolledByWatcher) or not backend.watcher_enabled:
        return None
    directory = _dir(paths, submission.project, submission.run_id)
    if hosted:  # one watcher per job: a resumed run's new job gets its own
        directory = directory / f"job-{job_id}"
    ensure_private_dir(directory)
    spec = WatcherSpec(
        backend=backend.name,
        submission=submission.model_copy(update={"job_name": base_name}),
        launch_base=launch_name.removesuffix(relaunch_suffix(submission.job_name, base_name)),
        job_id=job_id if hosted else None,
        readiness=None
        if readiness is None
        else ReadinessWindow(window=readiness.window, interval=readiness.interval),
    )
    atomic_write_text(directory / SPEC_NAME, spec.model_dump_json(indent=2))
    if not hosted:
        pid = alive(paths, submission.project, submission.run_id)
        if pid is not None:
            return pid
    module = installed_backends().watcher_module
    pid = spawn_detached(module, directory, directory / LOG_NAME, paths.root)
    if isinstance(backend, HostsExecutor):
        backend.executor_started(job_id, pid)
    return pid


def _open_store(submission: JobSubmission, paths: NpaPaths) -> ObjectStore:
    return open_store(
        submission.store,
        endpoint_url=submission.endpoint_url,
        region=submission.region,
        profile=submission.profile,
        paths=paths,
    )


class Watcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.paths = NpaPaths.from_env()
        self.spec = WatcherSpec.model_validate_json((directory / SPEC_NAME).read_text())
        s = self.spec.submission
        self.submission = s
        self.policy = Policy(
            startup_failure_threshold=s.startup_failure_threshold,
            max_infrastructure_recoveries=s.max_infrastructure_recoveries,
            retries=s.retries,
        )
        self.manifest_lock = self.paths.lock(manifest_lock(s.project, s.run_id))
        self.backend = open_backend(self.spec.backend, self.paths, context=s.kube_context)
        self.store: ObjectStore | None = None
        self.episode: str | None = None  # the unknown condition last recorded, if still on
        self.waves: dict[str, dict[int, TaskRecord]] = {}  # the last poll's wave tasks
        self.strays_due = 0.0  # monotonic time of the next look for stray jobs

    # --- records -----------------------------------------------------------------------------
    def log(self, message: str) -> None:
        sys.stdout.write(f"{now_iso()} {brief(message, LOG_LINE_LIMIT)}\n")
        sys.stdout.flush()

    def update(self, mutate: Callable[[RunManifest], None]) -> RunManifest:
        assert self.store is not None
        return update_manifest(self.store, self.submission.prefix, self.manifest_lock, mutate)

    def unknown(self, job_id: int | None, failure: str, detail: str) -> None:
        """Record that npa cannot tell (once per episode); nothing is relaunched."""
        if self.episode == failure:
            return
        self.episode = failure
        self.log(f"unknown ({failure}): {detail}; relaunch blocked")

        def mutate(m: RunManifest) -> None:
            last = m.supervisor.attempts[-1] if m.supervisor.attempts else None
            what = f"job {job_id}" if job_id is not None else "relaunch"
            if last is not None and last.what == what and last.failure == failure:
                return  # an earlier supervisor recorded this same episode
            record(
                m.supervisor,
                what=what,
                failure=failure,
                classification=Classification.UNKNOWN,
                detail=brief(detail, DETAIL_LIMIT),
                policy=self.policy,
            )

        self.update(mutate)

    # --- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        s = self.submission
        if isinstance(self.backend, HostsExecutor):
            return self.execute(self.backend)
        try:
            with exclusive_lock(lock_path(self.paths, s.project, s.run_id), timeout=0):
                self.log(f"supervising run {s.run_id} (pid {os.getpid()}, poll {self.poll}s)")
                return self.loop()
        except LockBusy:
            self.log("another supervisor holds this run; exiting")
            return 0

    def execute(self, backend: HostsExecutor) -> int:
        """Hand the job to the backend's executor, with the run's manifest as its record."""
        assert self.spec.job_id is not None
        # The run's records are written through the same patience as the job's own objects:
        # a store outage shorter than it costs the run nothing.
        store = PatientStore(
            _open_store(self.submission, self.paths), store_patience(), note=self.log
        )
        s = self.submission
        status = status_command(s.run_id, s.project)
        recorder = ManifestRecorder(store, s.prefix, self.manifest_lock, self.policy, status)
        return backend.execute(self.spec.job_id, recorder)

    @property
    def poll(self) -> float:
        assert isinstance(self.backend, PolledByWatcher)
        return self.backend.poll_seconds

    def loop(self) -> int:
        self.store = _open_store(self.submission, self.paths)
        while True:
            if not self.paths.root.exists():
                self.log(f"{self.paths.root} is gone; exiting")
                return 0
            try:
                done = self.step()
            except NpaError as error:  # the store or a lock: try again at the next poll
                self.log(f"error: {error.message}")
                done = False
            if done:
                self.release()
                return 0
            time.sleep(self.poll)

    def release(self) -> None:
        """At the run's final verdict, remove what the launch put in place for this run alone
        (:func:`release_ended_run`), asking again at the next polls while the API does not
        answer; ``status`` and ``cancel`` do the same, so a run the watcher could not release
        is released by the next of them."""
        if not isinstance(self.backend, PreparesLaunch):
            return
        s = self.submission
        for ask in range(RELEASE_ASKS):
            done = release_ended_run(self.backend, s.project, s.workflow, s.run_id, s.generation)
            if done.error is None:
                gone = done.released
                self.log(f"released {', '.join(gone)}" if gone else "nothing of the run to release")
                return
            self.log(f"could not release the run's resources: {done.error}")
            if ask + 1 < RELEASE_ASKS:
                time.sleep(self.poll)
        self.log(f"gave up releasing; next: {status_command(s.run_id, s.project)}")

    def step(self) -> bool:
        """One poll; True when the run is terminal and the supervisor is done."""
        assert self.store is not None
        m = read_manifest(self.store, self.submission.prefix)
        if m is None:
            self.log("the run's manifest is gone; exiting")
            return True
        if m.state in _TERMINAL:
            self.log(f"run is {m.state}; exiting")
            return True
        if m.job_id is None:
            if m.state == "LAUNCHING" and relaunch_suffix(m.job_name, base_job_name(m)):
                return self.relaunch(m)
            return False  # submit is still launching
        try:
            job = self.backend.job(m.job_id)
        except BackendUnavailable as exc:
            self.unknown(m.job_id, "queue-unavailable", exc.message)
            return False
        except NotFound as exc:
            self.unknown(m.job_id, "job-not-in-queue", exc.message)
            return False
        self.episode = None
        if job.state.terminal or time.monotonic() >= self.strays_due:
            self.end_strays(m, job.job_id)
        # Tasks are matched to stages by the manifest's resume record, not by the submission
        # this supervisor was started with (a rerun submit that adopts a live resumed job
        # carries no adopted stages).
        stages = job_stages(m)
        tasks = self.backend.stage_tasks(job, stages)
        self.waves = self.backend.wave_tasks(job, stages)
        unproven = self._unproven_successes(m, tasks)
        if unproven is not None:
            return self.outputs_missing(job, tasks, *unproven)
        if job.state in _STARTING and self.startup_failed(m, job, tasks):
            return True
        if not job.state.terminal:
            if m.state != job.state.value or self._stages_changed(m, tasks):
                state = job.state.value

                def mirror(mm: RunManifest) -> None:
                    if mm.job_id == job.job_id and mm.state not in _TERMINAL:
                        mm.state = state
                        self._record_stages(mm, tasks)

                self.update(mirror)
            return False
        if job.state in (JobState.SUCCEEDED, JobState.CANCELLED):
            self.finish(job, tasks)
            return True
        return self.failed(job, tasks)

    def _stages_changed(self, m: RunManifest, tasks: dict[str, TaskRecord]) -> bool:
        # A stage without a record is PENDING (a record's default): nothing to write for it.
        for stage, task in tasks.items():
            rec = m.stages.get(stage, StageRecord())
            if rec.state != task.state.value:
                return True
            known = {w.wave: w.state for w in rec.waves}
            if any(known.get(w) != t.state.value for w, t in self.waves.get(stage, {}).items()):
                return True
        return False

    def _record_stages(self, m: RunManifest, tasks: dict[str, TaskRecord]) -> None:
        """Each launched stage's state as its tasks report it, and each of its waves' own
        (one task per wave: what a resume checks before adopting a stage or a wave)."""
        for stage, task in tasks.items():
            rec = m.stages.setdefault(stage, StageRecord())
            self._record_waves(rec, stage, self.waves.get(stage, {}))
            if rec.state == task.state.value:
                continue
            rec.state = task.state.value
            if task.state is not JobState.PENDING and rec.started_at is None:
                rec.started_at = _iso(task.started_at)
            if task.state.terminal:
                rec.ended_at = _iso(task.ended_at)

    def _record_waves(self, rec: StageRecord, stage: str, waves: dict[int, TaskRecord]) -> None:
        """Each wave task's state in the stage's record; waves an earlier job ran (adopted by a
        resume) keep their records."""
        if not waves:
            return
        planned = self._planned(stage)
        by_wave = {w.wave: w for w in rec.waves}
        for wave, task in waves.items():
            old = by_wave.get(wave)
            shards = (
                shards_of_wave(wave, planned.waves.parallel, planned.waves.shards)
                if planned is not None
                else (old.shards if old else [])
            )
            started = old.started_at if old else None
            if task.state is not JobState.PENDING and started is None:
                started = _iso(task.started_at)
            launched = old.launched_at if old else None
            if launched is None and task.launched_at is not None:
                launched = _iso(task.launched_at)
            by_wave[wave] = WaveRecord(
                wave=wave,
                shards=shards,
                state=task.state.value,
                attempts=1 + (task.recovery_count or 0),
                launched_at=launched,
                started_at=started,
                ended_at=_iso(task.ended_at) if task.state.terminal else None,
            )
        rec.waves = [by_wave[w] for w in sorted(by_wave)]

    def _unproven_successes(
        self, m: RunManifest, tasks: dict[str, TaskRecord]
    ) -> tuple[str, str] | None:
        """The first stage whose task ended SUCCEEDED without its declared outputs in the
        store, and why; None when every newly succeeded stage's outputs are there.

        A task's exit code says only that its command ended well; the stage has succeeded once
        what it declared is in the store, as on the local backend.
        """
        from npa.runs.outputs import check_stage

        assert self.store is not None
        for stage, task in sorted(tasks.items(), key=lambda item: item[1].task_id):
            if task.state is not JobState.SUCCEEDED:
                continue
            if m.stages.get(stage, StageRecord()).state == JobState.SUCCEEDED.value:
                continue  # proven at an earlier poll
            planned = self._planned(stage)
            if planned is None:
                continue  # plan.json unreadable now: the next poll checks again
            checked = check_stage(self.store, self.submission.prefix, planned, task.state.value)
            if not checked.ok:
                lacking = ", ".join(
                    f"{o.name} ({o.status})" for o in checked.outputs if o.status != "ok"
                )
                return stage, (
                    f"stage {stage} exited 0 but declared outputs are missing or empty in the "
                    f"store: {lacking}"
                )
        return None

    def outputs_missing(
        self, job: JobRecord, tasks: dict[str, TaskRecord], stage: str, detail: str
    ) -> bool:
        """A stage ended without its outputs: the stage and the run are FAILED (a payload
        failure, as on the local backend), and the job is cancelled by id so no later stage
        runs on inputs that are not there. True: the run is terminal."""
        cancelled = "the job was already over"
        if not job.state.terminal:
            try:
                self.backend.cancel(job.job_id)
                cancelled = f"job {job.job_id} cancelled"
            except NpaError as error:
                cancelled = f"cancelling job {job.job_id} failed: {error.message}"
        self.log(f"{detail}; {cancelled}")

        def mutate(m: RunManifest) -> None:
            if m.job_id != job.job_id or m.state in _TERMINAL:
                return
            record(
                m.supervisor,
                what=f"stage {stage}",
                failure="missing-outputs",
                classification=Classification.PAYLOAD,
                detail=f"{detail}; {cancelled}",
                policy=self.policy,
                stage=stage,
            )
            if job.job_id not in m.supervisor.job_ids:
                m.supervisor.job_ids.append(job.job_id)
            self._record_stages(m, {s: t for s, t in tasks.items() if s != stage})
            rec = m.stages.setdefault(stage, StageRecord())
            rec.state, rec.ended_at = JobState.FAILED.value, rec.ended_at or now_iso()
            rec.classification, rec.detail = Classification.PAYLOAD.value, detail
            m.state = JobState.FAILED.value

        self.update(mutate)
        return True

    def _pod_failures(self, job: JobRecord, tasks: dict[str, TaskRecord]) -> list[_Startup]:
        """Every pod of the job that could not start, from what outlives the pods the
        controller deletes and recreates; [] when the backend has no pods or they cannot be read
        now."""
        if not isinstance(self.backend, ReportsPodReasons):
            return []
        if self.backend.pods_source(self.submission.project).missing is not None:
            return []
        stage_of = {t.task_name: st for st, t in tasks.items() if t.task_name}
        try:
            failures = self.backend.startup_failures(job, self.submission.project)
        except Exception as exc:  # the API answers nothing: counting waits for the next poll
            self.log(f"pod events of job {job.job_id} unreadable: {type(exc).__name__}: {exc}")
            return []
        found: list[_Startup] = []
        for task, f in failures:
            detail = f"pod {f.namespace}/{f.pod} could not start: {f.reason}: {f.message}"
            classification = Classification.TRANSIENT_INFRASTRUCTURE
            if f.reason in PULL_REASONS:
                fault = classify_pull_failure(f.message, image=f.image, reason=f.reason)
                classification = fault.classification
                detail += f" [{fault.classification.value}: {fault.why}]"
            found.append(
                _Startup(
                    what=f"job {job.job_id} pod {f.pod} ({(f.uid or '-')[:8]})",
                    stage=stage_of.get(task),
                    failure=failure_signature(POD_START, f"{f.reason}: {f.message}"),
                    detail=detail,
                    reason=f"{f.reason}: {f.message}",
                    classification=classification,
                )
            )
        return found

    def _launch_failures(self, job: JobRecord, tasks: dict[str, TaskRecord]) -> list[_Startup]:
        """Every launch of the job's tasks that its controller tried and failed, while a task
        waits to try again (no pod exists then, so only the controller's log says why); []
        when no task waits or the log cannot be read now."""
        waiting = [st for st, t in sorted(tasks.items(), key=lambda i: i[1].task_id) if t.waiting]
        if not waiting or not isinstance(self.backend, ReportsLaunchFailures):
            return []
        stage_of = {t.task_name: st for st, t in tasks.items() if t.task_name}
        try:
            failures = self.backend.launch_failures(job)
        except NpaError as error:  # counting waits for the next poll
            self.log(f"launch failures of job {job.job_id} unreadable: {error.message}")
            return []
        return [
            _Startup(
                what=f"job {job.job_id} launch {f.attempt}",
                stage=stage_of.get(f.task or "", waiting[0]),
                failure=failure_signature(_LAUNCH, f.error),
                detail=f"the controller could not launch job {job.job_id}: {f.error}",
                reason=f"launch failed: {f.error}",
            )
            for f in failures
        ]

    def startup_failed(self, m: RunManifest, job: JobRecord, tasks: dict[str, TaskRecord]) -> bool:
        """Count what could not start in a live job: its pods that could not start, and the
        launches its controller failed (SkyPilot tries both again by itself, so the job stays
        PENDING/STARTING with no failure reason). The same failure
        ``--startup-failure-threshold`` times in a row ends the run FAILED_STARTUP and cancels
        the job by id. True when the run became terminal."""
        seen = {a.what for a in m.supervisor.attempts}
        # A pod that cannot start also fails the controller's launch: one fault seen from both
        # sides. Counted twice, with two signatures, the alternation would reset the run of
        # identical failures and never reach the threshold; the pods' reason is the precise one.
        # Once a pod of the job has failed, its launches are never counted: a poll that cannot
        # read the pods (or reads them between two pods) must not start the alternation either.
        pods = self._pod_failures(job, tasks)
        pod_seen = any(w.startswith(f"job {job.job_id} pod ") for w in seen)
        found = pods or ([] if pod_seen else self._launch_failures(job, tasks))
        new = [f for f in found if f.what not in seen]
        if not new:
            return False
        policy = self.policy
        preview = m.supervisor.model_copy(deep=True)
        verdicts = [
            count_startup_failure(
                preview,
                what=f.what,
                failure=f.failure,
                detail=f.detail,
                policy=policy,
                stage=f.stage,
                classification=f.classification,
            )
            for f in new
        ]
        stopped = next((v for v in verdicts if v.terminal_state is not None), None)
        cancelled = ""
        if stopped is not None:
            try:
                self.backend.cancel(job.job_id)
                cancelled = f"; job {job.job_id} cancelled"
            except NpaError as error:
                cancelled = f"; cancelling job {job.job_id} failed: {error.message}"
        for f in new:
            self.log(f"startup failure {f.what}: {f.reason}")

        def mutate(mm: RunManifest) -> None:
            if mm.job_id != job.job_id or mm.state in _TERMINAL:
                return
            known = {a.what for a in mm.supervisor.attempts}
            for f in new:
                if f.what in known:
                    continue
                verdict = count_startup_failure(
                    mm.supervisor,
                    what=f.what,
                    failure=f.failure,
                    detail=f.detail + (cancelled if stopped is not None else ""),
                    policy=policy,
                    stage=f.stage,
                    classification=f.classification,
                )
                if verdict.terminal_state is not None and stopped is not None:
                    if job.job_id not in mm.supervisor.job_ids:
                        mm.supervisor.job_ids.append(job.job_id)
                    self._record_stages(mm, tasks)
                    if f.stage is not None:
                        rec = mm.stages.setdefault(f.stage, StageRecord())
                        rec.state, rec.ended_at = verdict.terminal_state.value, now_iso()
                        rec.classification = verdict.classification.value
                        rec.detail = f.reason
                    mm.state = verdict.terminal_state.value
                    return

        updated = self.update(mutate)
        if stopped is not None:
            self.log(
                f"run is {updated.state} after {updated.supervisor.startup_failures} startup "
                f"failures{cancelled}"
            )
        return updated.state in _TERMINAL

    def finish(self, job: JobRecord, tasks: dict[str, TaskRecord]) -> None:
        self.log(f"job {job.job_id} ended {job.state.value}")

        def mutate(m: RunManifest) -> None:
            if m.job_id != job.job_id:
                return
            m.state = job.state.value
            self._record_stages(m, tasks)

        self.update(mutate)

    def _planned(self, stage: str) -> StagePlan | None:
        """The stage's entry in the run's ``plan.json``; None when it cannot be read."""
        assert self.store is not None
        try:
            plan = read_plan(self.store, self.submission.prefix)
        except NpaError:
            return None
        if plan is None:
            return None
        return next((p for p in plan.stages if p.name == stage), None)

    def _stage_retries(self, stage: str | None) -> int:
        planned = None if stage is None else self._planned(stage)
        return planned.retries if planned else 0

    def failed(self, job: JobRecord, tasks: dict[str, TaskRecord]) -> bool:
        """Classify an ended job, record the verdict; True when the run is now terminal."""
        classification = classify_failed_job(job.state.value, job.exit_codes)
        ordered = sorted(tasks.items(), key=lambda item: item[1].task_id)
        stage = next((st for st, task in ordered if task.state is job.state), None)
        allowed = self.policy.payload_retries(self._stage_retries(stage))
        where = f" in stage {stage}" if stage else ""
        detail = f"job {job.job_id} ({job.job_name}) ended {job.state.value}{where}" + (
            f": {job.failure_reason}" if job.failure_reason else ""
        )
        outcome: list[str] = []

        def mutate(m: RunManifest) -> None:
            if m.job_id != job.job_id or m.state in _TERMINAL:
                return  # already handled (a rerun submit or an earlier supervisor)
            spent = payload_retries_of(m.supervisor, stage) if stage else 0
            budget = max(0, allowed - spent)
            verdict = record(
                m.supervisor,
                what=f"job {job.job_id}",
                failure=failure_signature(job.state.value, job.failure_reason),
                classification=classification,
                detail=detail
                + (
                    "; only this job ended, nothing else was cancelled"
                    if classification is Classification.ACTIONABLE_CONFIGURATION
                    else ""
                ),
                policy=self.policy,
                payload_budget=budget,
                startup=job.state.value in STARTUP_STATUSES,
                stage=stage,
            )
            if job.job_id not in m.supervisor.job_ids:
                m.supervisor.job_ids.append(job.job_id)
            self._record_stages(m, tasks)
            if stage is not None:
                rec = m.stages.setdefault(stage, StageRecord())
                rec.state, rec.ended_at = job.state.value, rec.ended_at or now_iso()
                rec.classification, rec.detail = classification.value, detail
            if verdict.recovery is Recovery.RETRIED:
                m.supervisor.relaunches += 1
                m.job_name = relaunch_job_name(base_job_name(m), m.supervisor.relaunches)
                m.job_id, m.state = None, "LAUNCHING"
                outcome.append("relaunch")
                return
            # npa's own verdicts name the run's end; otherwise the job's own status does.
            own = (JobState.INFRASTRUCTURE_RECOVERY_EXHAUSTED, JobState.FAILED_STARTUP)
            terminal = verdict.terminal_state if verdict.terminal_state in own else job.state
            m.state = (terminal or job.state).value
            outcome.append(m.state)

        self.update(mutate)
        self.log(
            f"{detail}: {classification.value} -> {outcome[0] if outcome else 'already handled'}"
        )
        return bool(outcome) and outcome[0] != "relaunch"

    # --- a new attempt -----------------------------------------------------------------------
    def end_strays(self, m: RunManifest, keep: int) -> None:
        """Cancel, by id, any other live job under the run's names (:mod:`npa.launch.strays`):
        at the first poll of each job, every :data:`STRAY_CHECK_SECONDS` after (or what
        ``NPA_STRAY_CHECK_SECONDS`` says), and once the job ended."""
        every = float(os.environ.get(STRAY_CHECK_ENV) or STRAY_CHECK_SECONDS)
        self.strays_due = time.monotonic() + every
        try:
            ended = end_strays(self.backend, m, keep, "supervisor", self.log)
        except NpaError as error:
            self.log(f"could not look for stray jobs: {error.message}")
            return
        if ended:
            self.update(lambda mm: record_strays(mm, ended))

    def readiness(self) -> ReadinessCheck | None:
        r = self.spec.readiness
        if r is None:
            return None
        return readiness_check(self.backend, window=r.window, interval=r.interval)

    def relaunch(self, m: RunManifest) -> bool:
        """Launch (or adopt) the attempt the manifest names; True when the run became terminal."""
        name = m.job_name
        journal = f"{self.spec.launch_base}{relaunch_suffix(name, base_job_name(m))}"
        submission = self.submission.model_copy(update={"job_name": name})
        supervisor = m.supervisor.model_copy(deep=True)
        transaction = Transaction(
            self.backend,
            submission,
            journal=OperationJournal(self.paths, journal),
            lock_path=self.paths.lock(journal),
            readiness=self.readiness(),
            policy=self.policy,
            supervisor=supervisor,
            observe=self.backend.observer(),
        )
        self.log(f"launching attempt {name}")
        try:
            tx = transaction.run()
        except LaunchStopped as stopped:
            state = stopped.state.value
            self.log(f"attempt {name} stopped: {stopped.message}")

            def stop(mm: RunManifest) -> None:
                if mm.job_id is None and mm.job_name == name:
                    mm.state, mm.supervisor = state, supervisor
                    mm.launch_transaction = transaction.record.model_dump(mode="json")

            self.update(stop)
            return True
        except NpaError as error:  # ambiguous existence, readiness, the queue: never relaunch
            self.unknown(None, f"relaunch-{error.kind}", error.message)
            return False
        job_id = tx.job_id
        assert job_id is not None
        self.episode = None
        self.strays_due = 0.0  # a request the backend retried shows beside this job
        self.log(f"attempt {name} is job {job_id} ({tx.outcome})")

        def launched(mm: RunManifest) -> None:
            if mm.job_name != name:
                return
            mm.job_id = job_id
            mm.launch_transaction = tx.model_dump(mode="json")
            mm.supervisor = supervisor
            if job_id not in mm.supervisor.job_ids:
                mm.supervisor.job_ids.append(job_id)
            if mm.state == "LAUNCHING":
                mm.state = JobState.PENDING.value

        self.update(launched)
        self._receipt(name, job_id)
        return False

    def _receipt(self, name: str, job_id: int) -> None:
        """Point the run's receipt at the current attempt's job."""
        from npa.runs.receipts import JobIdentity, read_receipt, write_receipt

        s = self.submission
        try:
            receipt = read_receipt(self.paths, s.project, s.run_id)
        except NpaError:
            return
        receipt.job = JobIdentity(backend=self.backend.name, job_id=str(job_id), job_name=name)
        write_receipt(self.paths, receipt)


def _iso(at: float | None) -> str:
    """A backend's epoch timestamp as the manifest writes times; now when it gave none."""
    if at is None:
        return now_iso()
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m npa.launch.watch DIR\n")
        return 2
    return Watcher(Path(argv[0])).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
