"""The one interface every execution backend implements, the capabilities some declare, and
the records they share.

A backend runs one run's stages as one job. Launch (:mod:`npa.launch`), the services and the
CLI talk to a backend only through :class:`ExecutionBackend`, so every backend is launched,
reconciled, adopted, watched, followed and cancelled the same way, by an immutable job id and
never by name. What only some backends do is a capability: a small mixin class below that a
backend inherits and callers test with ``isinstance``, never by comparing a backend's name.
docs/development.md lists the methods and capabilities, and which backend has which.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from npa.core.errors import NpaError

if TYPE_CHECKING:
    from npa.adapters.containers import RegistryLogin
    from npa.adapters.kube.controller import ControllerReach
    from npa.adapters.kube.pods import PodReason
    from npa.adapters.storage import ObjectStore
    from npa.core.output import Result


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
    # When the backend began launching the task (SkyPilot: its controller took it up and asked
    # for its cluster; the task's ``submitted_at``), and when it started running.
    launched_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    recovery_count: int | None = None
    infra: str | None = None
    # What the backend says the task waits on while it is not running (SkyPilot's ``details``
    # column: "Job is in backoff", "Waiting for other jobs to launch", ...).
    details: str | None = None
    waiting: bool = False  # the backend's launch of this task failed and it retries later


class LaunchFailure(BaseModel):
    """One failed attempt of a live job's controller to start one of its tasks (SkyPilot logs
    each, then waits and tries again, for ever): the job itself stays PENDING or STARTING with
    no failure reason and creates no pod, so only the controller's own record says why."""

    model_config = ConfigDict(extra="forbid")

    attempt: int  # 1 for the job's first failed launch, in the controller's order
    task: str | None  # the task it was launching, when the record says
    error: str


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
    # The exit codes of the failed program as the backend reports them, one per node in its
    # order; empty when the backend names none (the supervision rules read them, never the
    # reason's wording).
    exit_codes: list[int] = Field(default_factory=list)
    # No live executor and no final state (a :class:`HostsExecutor` backend): rerunning the same
    # submit starts an executor that continues this very job.
    continuable: bool = False
    # In task order; empty for a backend that keeps no per-task record (the local backend's
    # executor writes each stage's state into the run manifest itself).
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
    # The finished waves of a partly run stage the job does not run again.
    adopted_waves: dict[str, list[int]] = Field(default_factory=dict)

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
    # The IAM role a pod's stage library gets run-scoped credentials of (npa configure
    # --stage-role-arn); None: the store Secret's own.
    stage_role_arn: str | None = None
    # The URI of every input the spec declares from outside the run (no upstream stage): what
    # run-scoped credentials may read besides the run's own prefix.
    external_inputs: list[str] = Field(default_factory=list)
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
    # Which launch of the run this is (npa.runs.manifest.launch_generation): what it puts in
    # place for the run is marked with it.
    generation: int = 0


# --- what a backend runs: one task per stage ---------------------------------------------------


class TaskInput(BaseModel):
    """One input of a stage: an upstream stage's output in the run's store, or an external URI."""

    model_config = ConfigDict(extra="forbid")

    name: str
    variable: str  # the environment variable that names it to the stage (NPA_INPUT_<NAME>)
    uri: str | None  # the full URI (None when the run has no store URI)
    key: str | None = None  # store key of an upstream output; None for an external URI
    kind: str = "prefix"  # file | prefix | auto (an external URI: decided when fetched)


class TaskOutput(BaseModel):
    """One declared output of a stage."""

    model_config = ConfigDict(extra="forbid")

    name: str
    variable: str  # NPA_OUTPUT_<NAME>
    path: str  # as declared (a prefix keeps its trailing "/")
    kind: str  # file | prefix
    uri: str | None
    key: str  # its key in the run's store


def pod_security_context(run_as_user: int, run_as_group: int, fs_group: int) -> dict[str, Any]:
    """The pod security context a stage's task runs under (rendered into its ``pod_config``);
    the image capability probe runs under exactly this one."""
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "runAsGroup": run_as_group,
        "fsGroup": fs_group,
    }


class StageTask(BaseModel):
    """Everything a backend needs to run one stage, in backend-neutral terms: the domain fills
    it from the spec and the plan (:mod:`npa.render.tasks`), a backend encodes it as its task
    file (:meth:`ExecutionBackend.render_tasks`)."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    task_name: str
    command: str
    env: dict[str, str]  # the stage's own variables, as the spec gives them
    # The stage's secrets: variable name -> where its value is read (``env:VAR``), never a value.
    secrets: dict[str, str] = Field(default_factory=dict)
    image: str | None  # the pinned image when the backend pulls images, else None
    depends_on: list[str]
    shards: int
    parallel: int
    waves: int
    retries: int
    accelerators: str | None  # "<name>:<count>", renamed to the cluster's label when known
    cpus: float | None
    memory_gib: float | None
    disk_gib: int | None
    inputs: list[TaskInput]
    outputs: list[TaskOutput]
    checkpoint_uri: str | None = None
    checkpoint_loader: str | None = None
    run_as_user: int
    run_as_group: int
    fs_group: int


class RunTasks(BaseModel):
    """One run's stage tasks, in plan order, with where the run lives."""

    model_config = ConfigDict(extra="forbid")

    workflow: str
    run_id: str
    store: str | None  # the store URI the run's data lives in
    prefix: str  # the run prefix inside the store (<workflow>/<run>/npa-workflow)
    run_root: str | None  # <store>/<workflow>/<run>, NPA_RUN_PREFIX
    tasks: list[StageTask]


# --- the interface --------------------------------------------------------------------------------


class ExecutionBackend(abc.ABC):
    """A place runs execute. Implementations: ``npa/backends/<name>/backend.py``."""

    #: Recorded in receipts and manifests; :func:`npa.backends.open_backend` opens it again.
    name: ClassVar[str]
    #: Where ``queue`` answers come from, for the launch transaction's record.
    queue_source: str

    @property
    @abc.abstractmethod
    def task_suffix(self) -> str:
        """File suffix of the rendered tasks (``.yaml`` or ``.json``)."""

    @property
    def runtime(self) -> str:
        """How a stage runs: ``container`` (in its image) or ``process`` (a host process)."""
        return "container"

    @abc.abstractmethod
    def render_tasks(self, run: RunTasks) -> Iterator[tuple[str, str]]:
        """(stage name, the task file this backend runs for it: ``tasks/<stage><suffix>``) in
        plan order, each made as it is asked for, so a caller that writes them as they come
        holds one at a time. Raises InvalidInput, now or while iterating, when this backend
        cannot run the run as given."""

    @abc.abstractmethod
    def request_launch(self, submission: JobSubmission) -> str:
        """Ask for the job to be started; returns a request id that can be resolved later,
        also from another process. Raises LocalStateUnavailable only when a write on this
        machine failed before the request left it: then no job exists."""

    @abc.abstractmethod
    def launch_result(self, request_id: str) -> int:
        """The job id an accepted launch request created. Raises :class:`TransientRefusal`,
        :class:`LaunchRejected` or :class:`BackendUnavailable`."""

    @abc.abstractmethod
    def queue(self, job_name: str) -> QueueAnswer:
        """Every job whose name is exactly ``job_name``, finished ones included."""

    def jobs_named(self, names: Sequence[str]) -> list[JobRecord]:
        """Every job whose name is exactly one of ``names``, finished ones included (one
        :meth:`queue` per name; a backend that can ask once overrides it)."""
        return [r for name in dict.fromkeys(names) for r in self.queue(name).records]

    @abc.abstractmethod
    def job(self, job_id: int) -> JobRecord:
        """One job by its immutable id; NotFound only on an authoritative answer."""

    @abc.abstractmethod
    def cancel(self, job_id: int) -> None:
        """Cancel one job by id (never by name). Cancelling a finished job is a no-op."""

    @property
    def cancel_settle_seconds(self) -> float:
        """How long a sent cancel may take before the job shows it (CANCELLING or final):
        ``cancel`` re-asks that long before it reports the job still running."""
        return 20.0

    def stage_tasks(self, record: JobRecord, stages: JobStages) -> dict[str, TaskRecord]:
        """Stage -> the task of ``record`` that runs it, for every task that can be told apart;
        a stage the job does not run (adopted) or cannot be matched is left out. Empty for a
        backend without per-task records."""
        return {}

    def wave_tasks(self, record: JobRecord, stages: JobStages) -> dict[str, dict[int, TaskRecord]]:
        """Stage -> wave -> the task of ``record`` that runs that wave, for a backend that runs
        one task per wave; empty for one that records waves itself (a hosted executor)."""
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

    def observer(self) -> Callable[[str], None] | None:
        """A hook the launch transaction calls at each of its steps (``locked``,
        ``launch_requested``, ``launch_accepted``), given to the backend's constructor (a test
        stops its process at a chosen step with it); None when none was given."""
        return None

    def local_state(self) -> list[Path]:
        """The folders of this machine a launch into this backend writes (so submit can check
        they take a write before it records anything); none by default."""
        return []

    def controller_fix(self, project: str) -> str | None:
        """The command that shows this backend's controller side (what to run when a job's
        controller failed); None when the job's own logs are the place to look."""
        return None


# --- capabilities -------------------------------------------------------------------------------


class AdoptsPartialWaves:
    """The backend runs a stage's waves one by one and can start a stage at any wave, so a
    resumed run keeps the waves of a partly finished stage that succeeded."""


class PullsPinnedImages(abc.ABC):
    """Stages run in container images pulled by digest: submit verifies each image first
    (image preflight) and the tasks name the verified digests."""

    @abc.abstractmethod
    def pull_context(self) -> str | None:
        """The Kubernetes context the images are pulled in (an image without a contract label
        is probed there); None when there is none."""

    @property
    def verifies_contract(self) -> bool:
        """Whether preflight verifies the bootstrap contract (labels, or a probe): SkyPilot's pod
        set-up needs what it promises; an engine that starts the stage's command itself needs
        only the image to exist at its digest."""
        return True


@dataclass(frozen=True)
class ImagePull:
    """One image to pull onto this machine: pinned by digest, and how to reach its registry."""

    reference: str  # repository@sha256:<hex>
    plain_http: bool  # a registry served without TLS (loopback)
    login: RegistryLogin | None = field(default=None, repr=False)


class PullsImagesHere(abc.ABC):
    """The job's images are pulled onto this machine by ``submit`` itself, which holds the
    registry credentials, before the launch; the job then runs only what is already here (a
    credential is never handed to the job or written anywhere)."""

    @abc.abstractmethod
    def pull_images(self, pulls: list[ImagePull]) -> list[str]:
        """Pull each image; returns the local image ids. Raises what the engine raises."""


class RunsOnThisMachine:
    """Stages run on this machine, so its disk must hold the run's outputs (the quota gate
    checks the local store's free space)."""


@dataclass(frozen=True)
class Prerequisite:
    """One thing a backend needs before a launch can work, as it found it."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None


class HasPrerequisites(abc.ABC):
    """The backend depends on things outside npa (a kubeconfig, an SDK); submit checks each as
    a gate before anything is written."""

    @abc.abstractmethod
    def prerequisites(self, project: str) -> list[Prerequisite]:
        """Each prerequisite with its state; reads only."""


class PreparesLaunch(abc.ABC):
    """Before its launch transaction, ``submit`` (and only it) hands the backend the submission:
    the backend puts in place what its job needs from this process (credentials the job's pods
    read, a local service it may start), so that nothing of it is written into a task file."""

    @abc.abstractmethod
    def prepare_launch(self, submission: JobSubmission) -> None:
        """Make ``submission`` launchable; raises an NpaError with its fix when it cannot."""

    @abc.abstractmethod
    def release_run(self, project: str, workflow: str, run_id: str, generation: int) -> list[str]:
        """Remove what :meth:`prepare_launch` put in place for this run alone (not what the
        project's runs share), once the run has ended or is cancelled: the run's watcher calls
        it at its final verdict, ``cancel`` after the cancel. ``generation`` is the launch the
        caller saw end (:attr:`JobSubmission.generation`): what a later launch (a resume that
        raced the caller) put in place is kept. Repeat-safe. Returns what it removed, by name;
        raises an NpaError with its fix when it could not ask. Callers go through
        :func:`release_ended_run`, the one rule for when and how."""


class Released(BaseModel):
    """What :func:`release_ended_run` did: what it removed (by name), or why it could not.
    Never a run state: a refused release is reported beside the run's state, not in it."""

    released: list[str] = Field(default_factory=list)
    error: str | None = None  # the API refused or did not answer; nothing is hidden
    fix: str | None = None

    def lines(self) -> list[str]:
        """The text lines a command prints about it (none when there was nothing to remove)."""
        out = [f"  removed {name}: the run's own, it ends with the run" for name in self.released]
        if self.error:
            out.append(f"  not removed: {self.error}")
        return out


def release_ended_run(
    backend: ExecutionBackend | None,
    project: str,
    workflow: str | None,
    run_id: str,
    generation: int,
) -> Released:
    """Remove what the launch put in place for this run alone (:meth:`PreparesLaunch.
    release_run`: the SkyPilot backend's run Secret) once nothing of the run can use it any
    more: the run has a final state, or its job was cancelled. Every path that learns that
    calls this (the watcher at its verdict, ``cancel``, ``status`` and ``--watch``, the
    project's ``release`` sweep), with the launch ``generation`` whose end it saw: what a later
    launch of the run (a resume racing the caller) put in place is never removed. Repeat-safe
    (a Secret already gone is no error); a refusal comes back as ``error`` with the command to
    check, never raised, so the caller's own answer (the run's state) stands as it is."""
    if not isinstance(backend, PreparesLaunch) or workflow is None:
        return Released()
    try:
        return Released(released=backend.release_run(project, workflow, run_id, generation))
    except NpaError as error:
        return Released(error=error.message, fix=error.fix)


@dataclass(frozen=True)
class ReadinessTarget:
    """The API a launch needs stable first, and one question to it (``/readyz``)."""

    context: str
    kubeconfig: Path
    ask: Callable[[], tuple[int | None, str]]  # -> (HTTP status or None, short detail)


class NeedsReadinessCheck(abc.ABC):
    """A launch is sent to an API that must be stable first (the launch transaction checks it
    before reconciling and before every retry)."""

    @abc.abstractmethod
    def readiness_target(self) -> ReadinessTarget | None:
        """The API to check; None when it is not configured (a prerequisite reports that)."""


class ResolvesAccelerators(abc.ABC):
    """The cluster names GPU types its own way (node labels); submit renames the spec's
    accelerators to the names the cluster uses."""

    #: How the backend places a task's GPUs on nodes, as ``gpus`` explains a stage that fits
    #: on no single node.
    placement: ClassVar[str]

    @abc.abstractmethod
    def can_resolve_accelerators(self) -> bool:
        """False when the cluster cannot be asked (a prerequisite gate says why)."""

    @abc.abstractmethod
    def accelerator_names(self) -> list[str]:
        """The GPU type names the cluster's nodes carry. Raises what its client raises."""

    @abc.abstractmethod
    def node_labels_fix(self) -> str:
        """The command that shows the nodes' labels to a person."""

    @abc.abstractmethod
    def gpus_fix(self) -> str:
        """The npa command that lists the cluster's GPUs against the spec."""


#: The source ``status`` reports a :class:`ReportsPodReasons` answer under.
POD_REASONS_SOURCE = "kubernetes-pods"


class ReportsPodReasons(abc.ABC):
    """A waiting job's pods can say why they wait (image pull, scheduling): status asks."""

    @abc.abstractmethod
    def pending_reasons(self, record: JobRecord, project: str) -> list[PodReason]:
        """Why ``record``'s pods (of ``project``) are not running, and why those that could not
        start and are gone failed; [] when they run or do not exist yet. Raises what its client
        raises (the caller reports "unavailable")."""

    @abc.abstractmethod
    def startup_failures(self, record: JobRecord, project: str) -> list[tuple[str, PodReason]]:
        """Every pod of ``record`` that could not start, gone ones included (one per pod,
        oldest first), with the name of the task it ran; the run watcher counts them while the
        job itself still waits. Raises what its client raises."""

    @abc.abstractmethod
    def pods_source(self, project: str) -> PodSource:
        """Where the answer comes from, and whether it can be asked."""


class ReportsLaunchFailures(abc.ABC):
    """A job's controller keeps a record of the launches it tried and failed (a task that
    cannot be placed, a catalog it cannot read): status shows the latest, the run watcher
    counts them."""

    @abc.abstractmethod
    def launch_failures(self, record: JobRecord) -> list[LaunchFailure]:
        """Every failed launch of ``record``'s tasks so far, oldest first; [] when none failed.
        Raises what its client raises (the caller reports "unavailable")."""

    @abc.abstractmethod
    def launch_failures_source(self, record: JobRecord) -> tuple[str, str]:
        """Where :meth:`launch_failures` reads, and the command a person runs to read it."""


class ChecksController(abc.ABC):
    """The jobs run under a controller that is itself a pod: when the queue does not answer,
    the cluster can say whether that pod runs and whether its node's kubelet answers (status
    shows it beside the unanswered queue, so "unknown" comes with its cause)."""

    @abc.abstractmethod
    def controller_reach(self, project: str) -> ControllerReach:
        """The controller pod of ``project`` and its kubelet, as the cluster sees them; never
        raises (what cannot be asked is ``unknown``)."""

    @abc.abstractmethod
    def controller_node_fix(self, node: str) -> str:
        """The command that shows a person the state of ``node``."""


class ChecksItsSide(abc.ABC):
    """What the backend depends on outside npa (its API server, its controller, the cluster's
    RBAC, the environment its client runs in) can be checked by npa's own commands, and that
    environment created or repaired (``npa skypilot status / verify / bootstrap``). Each
    result's exit code is 1 when a check failed, else 4 when one could not be asked, else 0."""

    @abc.abstractmethod
    def side_status(self, project: str) -> Result:
        """Everything a submit of ``project`` to this backend's context depends on."""

    @abc.abstractmethod
    def side_verify(self, *, project: str | None, namespace: str | None) -> Result:
        """Whether the backend can use its context's cluster (pods in the project's namespace,
        or in ``namespace``)."""

    @abc.abstractmethod
    def side_bootstrap(self, venv: Path | None, *, repair: bool) -> Result:
        """Create the environment the backend's client runs in, or (``repair``) fix it."""


@dataclass(frozen=True)
class PodSource:
    where: str
    missing: str | None  # why the pods cannot be asked (None when they can)
    fix: str  # the command a person runs to look at the pods


class PolledByWatcher(abc.ABC):
    """The job runs under a controller npa does not own: npa's run watcher polls it by id,
    mirrors its state into the run's manifest and relaunches it as the supervision policy
    allows (:mod:`npa.launch.watch`)."""

    @property
    @abc.abstractmethod
    def poll_seconds(self) -> float:
        """Seconds between two polls."""

    @property
    def watcher_enabled(self) -> bool:
        """False when the user switched the watcher off for this backend."""
        return True


@dataclass(frozen=True)
class WaveVerdict:
    """What the supervision policy decided about a failed wave."""

    retry: bool  # run the wave again
    state: JobState | None  # the job's final state when it must end now
    classification: str
    detail: str
    spends_retry: bool  # a retry of the payload itself: it counts against the stage's retries


@dataclass(frozen=True)
class WaveProgress:
    """One wave as the run's record holds it: its state and how many attempts it had."""

    state: str  # RUNNING (an attempt was cut short) / SUCCEEDED / FAILED (judged)
    attempts: int


@dataclass(frozen=True)
class StageProgress:
    """What the run's record says about one stage, for an executor that continues a job."""

    state: str  # PENDING / RUNNING / SUCCEEDED / FAILED ...
    detail: str | None
    waves: dict[int, WaveProgress]
    retries_spent: int  # payload retries the stage had since the job started

    @property
    def succeeded_waves(self) -> set[int]:
        return {w for w, p in self.waves.items() if p.state == "SUCCEEDED"}


class RunRecorder(Protocol):
    """What an executor reports to while it runs a job: launch implements it by recording the
    run's manifest and applying the supervision policy, so an executor needs neither."""

    def retry_budget(self, stage_retries: int) -> int:
        """How many times a failed payload may be run again (``--retries`` or the stage's)."""

    def started(self, job_id: int, stages: list[str]) -> None: ...

    def progress(self, stage: str, *, since: float) -> StageProgress:
        """The stage as recorded so far (a continued job skips what is done); ``since`` is when
        the job was first taken (epoch seconds): retries before it belong to earlier jobs."""

    def running(self) -> None: ...

    def restore_source(self, store: ObjectStore, prefix: str, into: Path) -> None:
        """Rebuild the run's committed source tree under ``into``."""

    def stage_started(self, stage: str) -> None: ...

    def wave_started(self, stage: str, wave: int, shards: list[int], attempt: int) -> None: ...

    def wave_succeeded(
        self,
        stage: str,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        stored: dict[str, int],
    ) -> None: ...

    def wave_failed(
        self,
        stage: str,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        retries_left: int,
    ) -> WaveVerdict:
        """Record a failed wave (its first failing shard decides) and say what happens next."""

    def outputs_missing(self, stage: str, found: dict[str, int], missing: list[str]) -> str:
        """Record a stage that exited 0 without its declared outputs; returns the detail."""

    def stage_succeeded(self, stage: str, outputs: dict[str, int]) -> None: ...

    def infrastructure_fault(self, detail: str, *, stage: str | None) -> WaveVerdict:
        """Record that the platform failed under the job (a store outage that outlasted the
        store's patience) and say whether the job goes on (an infrastructure recovery, counted
        against ``--max-infrastructure-recoveries``) or ends now."""

    def ended(
        self, state: JobState, detail: str | None, *, infrastructure: bool, actionable: bool = False
    ) -> None:
        """Record the job's final state (``infrastructure``: the controller side failed;
        ``actionable``: for a reason a person must fix, such as refused store credentials)."""


class HostsExecutor(abc.ABC):
    """npa itself executes the backend's jobs, in the run watcher's process (there is no other
    controller): the watcher hands the job to :meth:`execute` and records what it reports."""

    @abc.abstractmethod
    def needs_executor(self, job_id: int) -> bool:
        """True while nothing executes the job yet and it is not final or cancelled."""

    @abc.abstractmethod
    def executor_started(self, job_id: int, pid: int) -> None:
        """Record the process that will execute the job (a reader can then tell it died)."""

    @abc.abstractmethod
    def execute(self, job_id: int, recorder: RunRecorder) -> int:
        """Run the job to its end in this process; returns the process exit code."""
