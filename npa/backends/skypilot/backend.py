"""The SkyPilot backend: launch, reconcile, follow and cancel one managed job per run.

Answers of the managed-jobs service are translated here, once: SkyPilot's exceptions become
transient refusals, rejections or "could not ask" (:class:`BackendUnavailable`), and its
``ManagedJobRecord``/``ManagedJobStatus`` become npa's :class:`JobRecord`/:class:`JobState`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from npa.backends.base import (
    BackendUnavailable,
    ExecutionBackend,
    JobRecord,
    JobState,
    JobSubmission,
    LaunchRejected,
    QueueAnswer,
    TaskContext,
    TransientRefusal,
)
from npa.backends.skypilot import tasks
from npa.backends.skypilot.jobs import ManagedJobsService, load_service
from npa.core.errors import NotFound

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
# Statuses that are SkyPilot's own and map one to one; the rest are folded below.
_STATUS = {
    "DEPRECATED_SUBMITTED": JobState.PENDING,
    "SUBMITTED": JobState.PENDING,
    "WINDING_DOWN": JobState.RUNNING,
}


def _kinds(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


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
        self, *, kubeconfig: str | None, service: ManagedJobsService | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self._service = service

    @property
    def service(self) -> ManagedJobsService:
        if self._service is None:
            self._service = load_service(self.kubeconfig)
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
        try:
            return self.service.launch(texts, submission.job_name)
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
        if kinds & _TRANSIENT:
            return TransientRefusal(message, details={"signature": type(exc).__name__})
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
            details={
                "tasks": [
                    {
                        "task_id": r.task_id,
                        "task_name": r.task_name,
                        "status": job_state(r.status).value,
                        "recovery_count": r.recovery_count,
                        "infra": r.infra,
                    }
                    for r in rows
                ]
            },
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

    def logs(self, job_id: int, *, follow: bool = False) -> Iterator[str]:
        try:
            yield from self.service.tail_logs(job_id, follow)
        except Exception as exc:
            raise BackendUnavailable(f"sky.jobs.tail_logs: {type(exc).__name__}: {exc}") from None
