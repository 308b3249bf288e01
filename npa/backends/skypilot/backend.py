"""The SkyPilot backend: launch, reconcile, follow and cancel one managed job per run.

Answers of the managed-jobs service are translated here, once: SkyPilot's exceptions become
transient refusals, rejections or "could not ask" (:class:`BackendUnavailable`), and its
``ManagedJobRecord``/``ManagedJobStatus`` become npa's :class:`JobRecord`/:class:`JobState`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from npa.adapters.kube.client import project_namespace
from npa.adapters.skypilot.api import ApiServerDown
from npa.adapters.skypilot.layer import run_layer
from npa.backends.base import (
    BackendUnavailable,
    ExecutionBackend,
    JobRecord,
    JobStages,
    JobState,
    JobSubmission,
    LaunchRejected,
    QueueAnswer,
    TaskContext,
    TaskRecord,
    TransientRefusal,
)
from npa.backends.skypilot import tasks
from npa.backends.skypilot.jobs import ManagedJobsService, load_service
from npa.core.errors import NotFound
from npa.render.tasks import task_name

BACKEND = "skypilot"

# SkyPilot exception class names, by what they mean for a launch.
_TRANSIENT = {
    "ResourcesUnavailableError",
    "KubeAPIUnreachableError",
    "ServerTemporarilyUnavailableError",
    "ClusterSetUpError",
    "ExecutionRetryableError",
    "ExecutionPausedError",
    "ConcurrentWorkerExhaustedError",
}
_REJECTED = {
    "ValueError",
    "InvalidSkyPilotConfigError",
    "ClusterDoesNotExist",
    "NotSupportedError",
    "KubernetesValidationError",
    "UserRequestRejectedByPolicy",
    "PermissionDeniedError",
    "ProvisionPrechecksError",
    "InvalidCloudCredentials",
    "InvalidCloudConfigs",
    "UsageError",
}
# How SkyPilot says that a process of its own cannot resolve a context from its kubeconfig.
_SERVER_CANNOT_SEE_CONTEXT = "Failed to load Kubernetes configuration for"
# Statuses that are SkyPilot's own and map one to one; the rest are folded below.
_STATUS = {
    "DEPRECATED_SUBMITTED": JobState.PENDING,
    "SUBMITTED": JobState.PENDING,
    "WINDING_DOWN": JobState.RUNNING,
}


# What SkyPilot's log stream says, in place of log lines, when the job or the task it was asked
# for does not exist (sky/jobs/utils.py stream_logs_by_id; the request then exits NOT_FOUND, which
# a streamed tail never sees).
_NO_JOB = "Job {job_id} not found."
_NO_TASK = re.compile(
    r"No task found matching (?P<task>.+) in job (?P<job>\d+)\. Valid task IDs are .*"
)


def _kinds(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def no_jobs_controller(exc: BaseException) -> bool:
    """Whether the queue's error says that no jobs controller exists.

    SkyPilot answers a queue with ``ClusterNotUpError`` carrying the jobs controller's
    "non-existent" hint when the controller has never been created (or is being created for
    the first time, before it has allocated any job id). No controller means no managed job:
    that is an authoritative empty queue. A stopped or unreachable controller raises the same
    class with another message, and stays "could not ask".
    """
    if "ClusterNotUpError" not in _kinds(exc):
        return False
    from sky.utils import controller_utils

    hint = controller_utils.Controllers.JOBS_CONTROLLER.value.default_hint_if_non_existent
    return str(exc).strip() == hint.strip()


def job_state(status: Any) -> JobState:
    """A ManagedJobStatus (or its value) as npa's state."""
    value = getattr(status, "value", status)
    name = getattr(status, "name", value)
    if name in _STATUS:
        return _STATUS[name]
    try:
        return JobState(str(value))
    except ValueError:
        return JobState.PENDING


class SkyPilotBackend(ExecutionBackend):
    name = BACKEND
    queue_source = "sky.jobs.queue_v2 (structured ManagedJobRecord)"

    def __init__(
        self,
        *,
        kubeconfig: str | None,
        service: ManagedJobsService | None = None,
        start_server: bool = False,
    ) -> None:
        self.kubeconfig = kubeconfig
        self._service = service
        self.start_server = start_server

    @property
    def service(self) -> ManagedJobsService:
        if self._service is None:
            self._service = load_service(self.kubeconfig, start_server=self.start_server)
        return self._service

    @property
    def task_suffix(self) -> str:
        return ".yaml"

    def render_tasks(self, context: TaskContext) -> dict[str, str]:
        return tasks.render(context)

    # --- launch ------------------------------------------------------------------------------
    def request_launch(self, submission: JobSubmission) -> str:
        # A resumed run relaunches only the stages it did not adopt (SkyPilot runs a stage's
        # task whole, so a partly finished stage is run again from its first wave).
        texts = [
            submission.tasks[stage]
            for stage in submission.order
            if stage not in submission.adopted_stages
        ]
        config = run_layer(project_namespace(submission.project))
        try:
            return self.service.launch(texts, submission.job_name, config)
        except Exception as exc:
            raise self._translate(exc, "sending the launch request") from None

    def launch_result(self, request_id: str) -> int:
        try:
            result = self.service.get(request_id)
        except Exception as exc:
            raise self._translate(exc, f"resolving launch request {request_id}") from None
        job_ids = result[0] if isinstance(result, tuple | list) and result else None
        if not job_ids or len(job_ids) != 1 or not isinstance(job_ids[0], int):
            raise BackendUnavailable(
                f"launch request {request_id} answered {result!r}, not exactly one job id"
            )
        return job_ids[0]

    def _translate(self, exc: Exception, doing: str) -> Exception:
        kinds = _kinds(exc)
        message = f"{doing}: {type(exc).__name__}: {exc}"
        if isinstance(exc, ApiServerDown):
            return BackendUnavailable(f"{doing}: {exc}", fix=exc.fix)
        if kinds & _TRANSIENT:
            return TransientRefusal(message, details={"signature": type(exc).__name__})
        if self.kubeconfig and _SERVER_CANNOT_SEE_CONTEXT in str(exc):
            # SkyPilot's API server validates the task's context in its own process, with its
            # own kubeconfig: a server started without npa's placed kubeconfig cannot see it.
            own = "$HOME/.kube/config"
            return LaunchRejected(
                f"{message}\n(the SkyPilot API server resolves contexts with its own "
                f"kubeconfig, which does not hold {self.kubeconfig})",
                fix=f"sky api stop && KUBECONFIG={self.kubeconfig}:{own} sky api start",
            )
        if kinds & _REJECTED:
            return LaunchRejected(
                message, fix="npa workbench workflow render SPEC --run-id RUN --out DIR  # check"
            )
        return BackendUnavailable(message, fix="npa skypilot status --project P --context CTX")

    # --- reading -----------------------------------------------------------------------------
    def _records(self, name: str) -> list[Any]:
        try:
            return self.service.queue(name)
        except Exception as exc:
            if no_jobs_controller(exc):
                return []  # no controller, so no job: SkyPilot's authoritative "none"
            if isinstance(exc, ApiServerDown):
                raise BackendUnavailable(str(exc), fix=exc.fix) from None
            raise BackendUnavailable(
                f"sky.jobs.queue_v2 did not answer: {type(exc).__name__}: {exc}",
                fix="npa skypilot status --project P --context CTX",
            ) from None

    def _record(self, rows: list[Any]) -> JobRecord:
        """One job from its rows (a pipeline has one row per task, all with one job id)."""
        first = rows[0]
        current = next((r for r in rows if not job_state(r.status).terminal), rows[-1])
        failed = next((r for r in rows if job_state(r.status).failed), None)
        state = job_state((failed or current).status)
        if all(job_state(r.status) is JobState.SUCCEEDED for r in rows):
            state = JobState.SUCCEEDED
        return JobRecord(
            backend=BACKEND,
            job_id=int(first.job_id),
            job_name=str(first.job_name),
            state=state,
            submitted_at=first.submitted_at,
            ended_at=rows[-1].end_at,
            failure_reason=(failed.failure_reason if failed else None),
            tasks=[
                TaskRecord(
                    task_id=int(r.task_id or 0),
                    task_name=r.task_name,
                    state=job_state(r.status),
                    failure_reason=r.failure_reason,
                    started_at=r.start_at,
                    ended_at=r.end_at,
                    recovery_count=r.recovery_count,
                    infra=r.infra,
                )
                for r in rows
            ],
        )

    def queue(self, job_name: str) -> QueueAnswer:
        rows = [r for r in self._records(job_name) if r.job_name == job_name]
        by_id: dict[int, list[Any]] = {}
        for row in rows:
            if row.job_id is None:
                raise BackendUnavailable(f"the queue returned a record of {job_name!r} without id")
            by_id.setdefault(int(row.job_id), []).append(row)
        return QueueAnswer(
            job_name=job_name,
            source=self.queue_source,
            records=[self._record(sorted(v, key=lambda r: r.task_id or 0)) for v in by_id.values()],
        )

    def job(self, job_id: int) -> JobRecord:
        rows = [r for r in self._records("") if r.job_id == job_id]
        if not rows:
            raise NotFound(f"managed job {job_id} is not in the SkyPilot queue")
        return self._record(sorted(rows, key=lambda r: r.task_id or 0))

    def cancel(self, job_id: int) -> None:
        try:
            self.service.cancel([job_id])
        except Exception as exc:
            raise self._translate(exc, f"cancelling job {job_id}") from None

    def stage_tasks(self, record: JobRecord, stages: JobStages) -> dict[str, TaskRecord]:
        """Each launched stage's task, by the name npa rendered for it; SkyPilot names the lone
        task of a one-task job after the job, so that task is the one stage the job runs."""
        launched = stages.launched
        if launched is None:
            return {}
        names = {task_name(stages.run_id, stage): stage for stage in launched}
        found = {names[t.task_name]: t for t in record.tasks if t.task_name in names}
        if not found and len(launched) == 1 and len(record.tasks) == 1:
            (lone,) = record.tasks
            if lone.task_name in (record.job_name, None):
                found[launched[0]] = lone
        return found

    def logs(
        self,
        job_id: int,
        *,
        follow: bool = False,
        stage: str | None = None,
        stages: JobStages | None = None,
    ) -> Iterator[str]:
        task = None if stage is None else self._stage_task(job_id, stage, stages, follow)
        try:
            for line in self.service.tail_logs(job_id, follow, task):
                self._refuse_not_found(job_id, line)
                yield line
        except NotFound:
            raise
        except ApiServerDown as exc:
            raise BackendUnavailable(str(exc), fix=exc.fix) from None
        except Exception as exc:
            raise BackendUnavailable(f"sky.jobs.tail_logs: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _refuse_not_found(job_id: int, line: str) -> None:
        text = line.strip()
        if text == _NO_JOB.format(job_id=job_id):
            raise NotFound(f"SkyPilot: {text}")
        match = _NO_TASK.fullmatch(text)
        if match and match["job"] == str(job_id):
            raise NotFound(f"SkyPilot: {text}")

    def _stage_task(
        self, job_id: int, stage: str, stages: JobStages | None, follow: bool
    ) -> str | int:
        """The ``task=`` selector of the stage's task, after checking that SkyPilot can serve its
        log now: its tail waits, even without ``follow``, for a task that is not running in a
        live job (a finished task's cluster is torn down, and its stored log is read only once
        the whole job has ended)."""
        cached = "npa workbench workflow logs RUN --project P --stage S --cached"
        if stages is None or stages.launched is None:
            raise BackendUnavailable(
                f"which task of job {job_id} runs stage {stage!r} is unknown: the run's "
                "manifest, which lists its stages, was not read",
                fix=cached,
            )
        if stage not in stages.launched:
            why = "was adopted from an earlier job" if stage in stages.adopted else "is unknown"
            raise NotFound(f"stage {stage!r} {why}: job {job_id} does not run it", fix=cached)
        record = self.job(job_id)
        task = self.stage_tasks(record, stages).get(stage)
        if task is None:
            names = ", ".join(f"{t.task_id}:{t.task_name}" for t in record.tasks) or "none"
            raise BackendUnavailable(
                f"job {job_id} has no task npa can tell runs stage {stage!r} (tasks: {names})",
                fix=cached,
            )
        state = task.state
        selector: str | int = task.task_name if task.task_name else task.task_id
        if record.state.terminal or state is JobState.RUNNING:
            return selector
        if follow and state in (JobState.PENDING, JobState.STARTING):
            return selector  # --follow waits for the task to start, as SkyPilot's tail does
        if state is JobState.PENDING:
            raise NotFound(
                f"stage {stage!r} (task {task.task_id} of job {job_id}) is PENDING: it has not "
                "started, so it has no log yet"
            )
        raise BackendUnavailable(
            f"stage {stage!r} (task {task.task_id} of job {job_id}) is {state.value} while the job "
            f"is {record.state.value}: SkyPilot serves that task's log only while it runs or once "
            "the whole job has ended",
            fix=cached,
        )
