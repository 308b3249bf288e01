"""The one interface every execution backend implements, and the records they share.

A backend runs one run's stages as one job. The launch transaction (:mod:`npa.launch`) talks to
a backend only through this interface, so the SkyPilot managed-jobs backend and the local
process backend are launched, reconciled, adopted, followed and cancelled the same way, by an
immutable job id and never by name.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from npa.core.errors import InvalidInput, NpaError, Unavailable

if TYPE_CHECKING:
    from npa.runs.manifest import RunManifest


class JobState(StrEnum):
    """States of a run's job. The SkyPilot names are kept as they are (so a ManagedJobStatus
    maps one to one); FAILED_STARTUP and INFRASTRUCTURE_RECOVERY_EXHAUSTED are npa's own
    supervision verdicts."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_PRECHECKS = "FAILED_PRECHECKS"
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"
    FAILED_CONTROLLER = "FAILED_CONTROLLER"
    FAILED_STARTUP = "FAILED_STARTUP"
    INFRASTRUCTURE_RECOVERY_EXHAUSTED = "INFRASTRUCTURE_RECOVERY_EXHAUSTED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def failed(self) -> bool:
        return self.terminal and self not in (JobState.SUCCEEDED, JobState.CANCELLED)


TERMINAL_STATES = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.FAILED_SETUP,
        JobState.FAILED_PRECHECKS,
        JobState.FAILED_NO_RESOURCE,
        JobState.FAILED_CONTROLLER,
        JobState.FAILED_STARTUP,
        JobState.INFRASTRUCTURE_RECOVERY_EXHAUSTED,
    }
)


class TaskRecord(BaseModel):
    """One task of a job as its backend reports it: a SkyPilot pipeline job has one per stage it
    launched, each with its own state."""

    model_config = ConfigDict(extra="forbid")

    task_id: int  # the task's position in the job, from 0
    task_name: str | None
    state: JobState
    failure_reason: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    recovery_count: int | None = None
    infra: str | None = None


class JobRecord(BaseModel):
    """One job as its backend reports it."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    job_id: int
    job_name: str
    state: JobState
    submitted_at: float | None = None
    ended_at: float | None = None
    failure_reason: str | None = None
    # In task order; empty for a backend that keeps no per-task record (the local backend's
    # supervisor writes each stage's state into the run manifest itself).
    tasks: list[TaskRecord] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class JobStages(BaseModel):
    """Which of a run's stages one of its jobs runs: what maps a backend's per-task answers
    (states, logs) back to stages.

    A resumed run's job runs only the stages its resume did not adopt (an earlier job ran those),
    so a task's position in the job is not the stage's position in the plan.
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str
    stages: list[str] | None  # every stage of the run; None when not known (no manifest yet)
    adopted: list[str] = Field(default_factory=list)

    @classmethod
    def of_run(cls, manifest: RunManifest) -> JobStages:
        """The stages the manifest's current job runs: every stage but those the last resume
        adopted (a supervisor's relaunch of a resumed job runs the same stages)."""
        adopted = manifest.resumes[-1].adopted_stages if manifest.resumes else []
        return cls(run_id=manifest.run_id, stages=list(manifest.tasks), adopted=list(adopted))

    @property
    def launched(self) -> list[str] | None:
        """The stages this job runs; None when the run's stages are not known."""
        if self.stages is None:
            return None
        return [s for s in self.stages if s not in self.adopted]


class QueueAnswer(BaseModel):
    """An authoritative answer to "which jobs carry exactly this name?".

    A backend returns one only when its source answered; when it could not ask, it raises
    :class:`BackendUnavailable` instead, so an empty list always means proven absence.
    """

    model_config = ConfigDict(extra="forbid")

    job_name: str
    source: str
    records: list[JobRecord]


class JobSubmission(BaseModel):
    """Everything a backend needs to start one run's job. Holds no credential."""

    model_config = ConfigDict(extra="forbid")

    job_name: str
    project: str
    workflow: str
    run_id: str
    store: str  # canonical store URI
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    prefix: str  # the run's key prefix in the store: <workflow>/<run>/npa-workflow
    order: list[str]  # stages in dependency order
    tasks: dict[str, str]  # stage -> task file text, as the backend rendered it
    retries: int | None = None  # --retries: overrides each stage's retries when given
    startup_failure_threshold: int = 3
    max_infrastructure_recoveries: int = 3
    max_parallel: int = 4
    kubeconfig: str | None = None  # the file SkyPilot is pointed at (KUBECONFIG)
    kube_context: str | None = None
    # Resume: work an earlier job finished and submit validated; it is not run again.
    adopted_stages: list[str] = Field(default_factory=list)
    adopted_waves: dict[str, list[int]] = Field(default_factory=dict)


class BackendError(NpaError):
    """A backend refused or failed an operation."""

    kind = "backend_error"


class BackendUnavailable(Unavailable):
    """The backend could not be asked: nothing may be concluded about existence."""

    kind = "backend_unavailable"


class TransientRefusal(BackendError):
    """The backend refused to create its controller for a reason that may pass (API server
    restarting, controller pod evicted, quota being released). Retrying is allowed only after
    the job's absence is proven."""

    kind = "transient_refusal"


class LaunchRejected(BackendError):
    """The backend rejected the job itself (bad task, unknown infra): retrying cannot help."""

    exit_code = InvalidInput.exit_code
    kind = "launch_rejected"


class ExecutionBackend(abc.ABC):
    """A place runs execute. Implementations: ``local`` and ``skypilot``."""

    #: ``local`` or ``skypilot``; recorded in receipts and manifests.
    name: str
    #: Where ``queue`` answers come from, for the launch transaction's record.
    queue_source: str

    @abc.abstractmethod
    def render_tasks(self, context: TaskContext) -> dict[str, str]:
        """Stage name -> the task file this backend runs for it (``tasks/<stage>.<ext>``)."""

    @property
    @abc.abstractmethod
    def task_suffix(self) -> str:
        """File suffix of the rendered tasks (``.yaml`` or ``.json``)."""

    @abc.abstractmethod
    def request_launch(self, submission: JobSubmission) -> str:
        """Ask for the job to be started; returns a request id that can be resolved later,
        also from another process."""

    @abc.abstractmethod
    def launch_result(self, request_id: str) -> int:
        """The job id an accepted launch request created. Raises :class:`TransientRefusal`,
        :class:`LaunchRejected` or :class:`BackendUnavailable`."""

    @abc.abstractmethod
    def queue(self, job_name: str) -> QueueAnswer:
        """Every job whose name is exactly ``job_name``, finished ones included."""

    @abc.abstractmethod
    def job(self, job_id: int) -> JobRecord:
        """One job by its immutable id; NotFound only on an authoritative answer."""

    @abc.abstractmethod
    def cancel(self, job_id: int) -> None:
        """Cancel one job by id (never by name). Cancelling a finished job is a no-op."""

    def stage_tasks(self, record: JobRecord, stages: JobStages) -> dict[str, TaskRecord]:
        """Stage -> the task of ``record`` that runs it, for every task that can be told apart;
        a stage the job does not run (adopted) or cannot be matched is left out. Empty for a
        backend without per-task records."""
        return {}

    @abc.abstractmethod
    def logs(
        self,
        job_id: int,
        *,
        follow: bool = False,
        stage: str | None = None,
        stages: JobStages | None = None,
    ) -> Iterator[str]:
        """The job's log lines as the backend holds them; with ``stage``, only that stage's
        (``stages`` says which of the run's stages the job runs). Raises NotFound when the
        backend answers that the stage has no log in this job (yet)."""


class TaskContext(BaseModel):
    """What a backend renders its task files from."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    workflow: Any  # npa.spec.model.Workflow
    plan: Any  # npa.plan.model.WorkflowPlan
    images: dict[str, str]  # TOOL_REF -> pinned reference (verified by preflight)
    store: str
    kube_context: str | None = None
    accelerators: dict[str, str] = Field(default_factory=dict)  # spec name -> node-label name
