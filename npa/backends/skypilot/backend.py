"""The SkyPilot backend: launch, reconcile, follow and cancel one managed job per run, on the
Kubernetes context ``--infra k8s/<context>`` names.

Answers of the managed-jobs service are translated here, once: SkyPilot's exceptions become
transient refusals, rejections or "could not ask" (:class:`BackendUnavailable`), and its
``ManagedJobRecord``/``ManagedJobStatus`` become npa's :class:`JobRecord`/:class:`JobState`.

Everything SkyPilot says that npa shows or keeps (a log line, a job's or task's failure reason
and details, the jobs controller's log, an exception's words) passes through :meth:`redact`
first, npa's one redaction rule (:mod:`npa.core.redaction`), whoever reads it.

Capabilities: stages run in digest-pinned images, one task per wave (a resume starts a stage at
any wave); the context's kubeconfig and the SkyPilot SDK are prerequisites; the API must be
stable before a launch; accelerators are renamed to the cluster's node labels; a waiting job's
pods say why; npa's run watcher polls the job.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npa.adapters.kube.client import project_namespace
from npa.adapters.skypilot.api import CONTROLLER_PREFIX, ApiServerDown
from npa.adapters.skypilot.home import private_home
from npa.adapters.skypilot.layer import run_layer
from npa.backends import contract
from npa.backends.base import (
    AdoptsPartialWaves,
    ChecksController,
    ChecksItsSide,
    ExecutionBackend,
    HasPrerequisites,
    JobRecord,
    JobStages,
    JobState,
    JobSubmission,
    LaunchFailure,
    NeedsReadinessCheck,
    PodSource,
    PolledByWatcher,
    PreparesLaunch,
    Prerequisite,
    PullsPinnedImages,
    QueueAnswer,
    ReadinessTarget,
    ReportsLaunchFailures,
    ReportsPodReasons,
    ResolvesAccelerators,
    RunTasks,
    TaskRecord,
)
from npa.backends.skypilot import tasks
from npa.backends.skypilot.jobs import ManagedJobsService, SkyManagedJobs
from npa.core.commands import (
    kubectl_command,
    npa_command,
    provision_command,
    store_credentials_command,
)
from npa.core.errors import (
    BackendUnavailable,
    InvalidInput,
    LaunchRejected,
    NotFound,
    NpaError,
    TransientRefusal,
    Unavailable,
)
from npa.core.layout import wave_of_task
from npa.core.paths import NpaPaths
from npa.core.redaction import KnownSecrets, known_secrets

if TYPE_CHECKING:
    from sky.schemas.api.responses import ManagedJobRecord

    from npa.adapters.kube.controller import ControllerReach
    from npa.adapters.kube.pods import PodReason
    from npa.core.output import Result

# Seconds between the jobs controller's looks for cancel requests (SkyPilot 0.14).
CONTROLLER_CANCEL_ROUND = 15.0
POLL_ENV = "NPA_SKYPILOT_POLL_SECONDS"  # seconds between the watcher's polls (tests: a fraction)
WATCHER_ENV = "NPA_SKYPILOT_SUPERVISOR"  # "off": submit starts no watcher
DEFAULT_POLL = 15.0

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


# What the jobs controller logs each time a launch of a task fails and it will try again later
# (sky/jobs/recovery_strategy.py), and each time it starts a task of a pipeline (controller.py).
_LAUNCH_FAILED = re.compile(r"Failed to launch a cluster with error: (?P<error>.*)$")
_TASK_STARTED = re.compile(r"Starting task (?P<id>\d+) \((?P<name>[^)]*)\) for job \d+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# SkyPilot's schedule state of a job whose launch failed and that waits before the next one.
_BACKOFF_STATE = "ALIVE_BACKOFF"


def launch_failures_in(lines: list[str]) -> list[LaunchFailure]:
    """The failed launches a jobs controller's log records, oldest first."""
    found: list[LaunchFailure] = []
    task: str | None = None
    for raw in lines:
        line = _ANSI.sub("", raw).strip()
        started = _TASK_STARTED.search(line)
        if started:
            task = started["name"]
            continue
        failed = _LAUNCH_FAILED.search(line)
        if failed:
            error = failed["error"].strip()
            # SkyPilot closes the message with a stray parenthesis.
            if error.endswith(")") and error.count(")") > error.count("("):
                error = error[:-1].rstrip()
            found.append(LaunchFailure(attempt=len(found) + 1, task=task, error=error))
    return found


# A failed task's reason as the jobs controller writes it (sky/jobs/controller.py): "Job exited
# with exit code 75 (user program failure). ..." or, one per node, "... exit codes [0, 75] ...".
_EXIT_CODES = re.compile(r"exited with exit codes? \[?(-?\d+(?:\s*,\s*-?\d+)*)\]?")


def exit_codes_in(reason: str | None) -> list[int]:
    """The exit codes a failed task's reason names, in its order; [] when it names none."""
    found = _EXIT_CODES.search(reason or "")
    if found is None:
        return []
    return [int(code) for code in re.split(r"\s*,\s*", found.group(1))]


def _cancel_requested(details: str | None) -> bool:
    """Whether SkyPilot's details column names a cancel request (sky/jobs/state.py
    CANCEL_REQUESTED_EVENT_REASON_PREFIX)."""
    return (details or "").startswith("Cancellation requested")


def in_backoff(schedule_state: str | None, details: str | None) -> bool:
    """Whether SkyPilot's record says the task's launch failed and it waits to try again."""
    return schedule_state == _BACKOFF_STATE or "backoff" in (details or "").lower()


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
    with private_home():
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


class SkyPilotBackend(
    ExecutionBackend,
    AdoptsPartialWaves,
    PullsPinnedImages,
    HasPrerequisites,
    NeedsReadinessCheck,
    ResolvesAccelerators,
    ReportsPodReasons,
    ReportsLaunchFailures,
    PolledByWatcher,
    PreparesLaunch,
    ChecksController,
    ChecksItsSide,
):
    name = BACKEND
    placement = "SkyPilot places all of a task's GPUs on one node"
    queue_source = "sky.jobs.queue_v2 (structured ManagedJobRecord)"

    def __init__(
        self,
        paths: NpaPaths,
        *,
        context: str | None,
        service: ManagedJobsService | None = None,
        observe: Callable[[str], None] | None = None,
    ) -> None:
        """``service``: the managed-jobs service (the real SDK when None); ``observe``: called
        at each step of a launch transaction (see :meth:`observer`)."""
        self.context = context
        self._paths = paths
        # The file provisioning placed for the context: SkyPilot is pointed at exactly it.
        self.kubeconfig_path = paths.cluster_kubeconfig(context) if context else None
        placed = self.kubeconfig_path is not None and self.kubeconfig_path.is_file()
        self.kubeconfig = str(self.kubeconfig_path) if placed else None
        self._service = service
        self._observe = observe
        self._npa_home = paths.root
        self._secrets: KnownSecrets | None = None

    def redact(self, text: str) -> str:
        """What SkyPilot said, without a credential: the values this machine holds (read once
        per backend) and every credential-shaped value (:meth:`KnownSecrets.redact`)."""
        return self._known().redact(text)

    def _known(self) -> KnownSecrets:
        """The credential values this process holds: the machine's (read once per backend) and
        the run-scoped session :meth:`_scoped_store` got from STS, which no file or variable of
        the machine holds."""
        if self._secrets is None:
            self._secrets = known_secrets(npa_home=self._npa_home)
        return self._secrets

    def _redacted(self, text: str | None) -> str | None:
        return self.redact(text) if text else text

    def _words(self, exc: BaseException) -> str:
        """An exception SkyPilot raised, as npa words it (its class and message), redacted."""
        return self.redact(f"{type(exc).__name__}: {exc}")

    def side_status(self, project: str) -> Result:
        from npa.backends.skypilot import health

        assert self.context is not None
        return health.skypilot_status(project, self.context, paths=self._paths)

    def side_verify(self, *, project: str | None, namespace: str | None) -> Result:
        from npa.backends.skypilot import health

        assert self.context is not None
        return health.verify(self.context, project=project, namespace=namespace, paths=self._paths)

    def side_bootstrap(self, venv: Path | None, *, repair: bool) -> Result:
        from npa.backends.skypilot import health

        return health.bootstrap(venv, repair=repair)

    @property
    def service(self) -> ManagedJobsService:
        if self._service is None:
            self._service = SkyManagedJobs(kubeconfig=self.kubeconfig)
        return self._service

    @property
    def task_suffix(self) -> str:
        return ".yaml"

    def render_tasks(self, run: RunTasks) -> Iterator[tuple[str, str]]:
        external = [
            (t.stage, i.name, i.uri) for t in run.tasks for i in t.inputs if i.key is None and i.uri
        ]
        problems = tasks.mount_problems(run.store, external)
        unpinned = [t.stage for t in run.tasks if t.image is None]
        if unpinned:
            problems.append(f"stages without a pinned image: {', '.join(unpinned)}")
        if problems:
            # No fix here: the caller knows the spec and the project the fix line names.
            raise InvalidInput(
                "cannot render:\n" + "\n".join(f"  - {p}" for p in problems),
                details={"problems": problems, "unpinned": bool(unpinned)},
            )
        assert self.context is not None
        return tasks.encoded(run, kube_context=self.context)

    def observer(self) -> Callable[[str], None] | None:
        return self._observe

    def controller_fix(self, project: str) -> str | None:
        if self.context is None:
            return None
        return shlex.join(
            ["npa", "skypilot", "status", "--project", project, "--context", self.context]
        )

    # --- capabilities -------------------------------------------------------------------------
    def prerequisites(self, project: str) -> list[Prerequisite]:
        found: list[Prerequisite] = []
        path = self.kubeconfig_path
        if path is not None and path.is_file():
            found.append(Prerequisite("kubeconfig", True, f"{path}"))
        else:
            fix = provision_command(str(self.context), project)
            found.append(
                Prerequisite(
                    "kubeconfig", False, f"no kubeconfig for context {self.context} at {path}", fix
                )
            )
        if importlib.util.find_spec("sky") is None:
            found.append(
                Prerequisite(
                    "skypilot",
                    False,
                    "the SkyPilot SDK is not installed",
                    "pip install 'skypilot[kubernetes]==0.14.1'",
                )
            )
        else:
            found.append(Prerequisite("skypilot", True, "SkyPilot SDK importable"))
        if path is not None and path.is_file():
            found.append(self._namespace(path, project))
        return found

    def _namespace(self, path: Path, project: str) -> Prerequisite:
        """The project's namespace, where SkyPilot runs the job's pods, exists (read only)."""
        from npa.adapters.kube.client import REQUEST_TIMEOUT, core_api

        assert self.context is not None
        namespace = project_namespace(project)
        provision = provision_command(self.context, project)
        try:
            core_api(path, self.context).read_namespace(namespace, _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status in (403, 404):
                why = "does not exist" if status == 404 else "cannot be read with this kubeconfig"
                return Prerequisite("namespace", False, f"namespace {namespace} {why}", provision)
            return Prerequisite(
                "namespace",
                False,
                f"cannot read namespace {namespace}: {type(exc).__name__}",
                kubectl_command(str(path), self.context, "get", "namespace", namespace),
            )
        return Prerequisite("namespace", True, f"{namespace} (the job's pods run there)")

    def prepare_launch(self, submission: JobSubmission) -> None:
        """Put the store's credentials and endpoint into the project's store Secret, which every
        pod of the job takes as its environment (the values go from boto3 straight to the
        API), the values of the secrets the launched tasks declare into the run's Secret (read
        from this process's environment, all of them before anything is written), and let this
        process start the local SkyPilot API server if none answers."""
        if self._service is None:
            self._service = SkyManagedJobs(kubeconfig=self.kubeconfig, start_server=True)
        elif isinstance(self._service, SkyManagedJobs):
            self._service.start_server = True
        if self.kubeconfig_path is None:
            return
        values = _secret_values(_launched_texts(submission))
        # Before anything is written: a role STS refuses leaves no Secret and launches nothing.
        values.update(self._scoped_store(submission))
        if submission.store.startswith("s3://"):
            self._store_secret(submission)
        if values:
            self._run_secret(submission, values)

    def _scoped_store(self, submission: JobSubmission) -> dict[str, str]:
        """The run-scoped store credentials for the run's Secret (``npa.store.<VARIABLE>``, which
        every task's pods take in place of the store Secret's): a session of the project's stage
        role limited to the run's prefix, the workflow's shared source and the declared inputs
        (:mod:`npa.adapters.storage.stage_scope`). None without a stage role."""
        from npa.adapters.kube.secrets import STORE_KEY_PREFIX
        from npa.adapters.storage import stage_scope

        role = submission.stage_role_arn
        if not role or not submission.store.startswith("s3://"):
            return {}
        policy = stage_scope.session_policy(
            submission.store, submission.workflow, submission.run_id, submission.external_inputs
        )
        try:
            scoped = stage_scope.assume_stage_role(
                role,
                policy,
                run_id=submission.run_id,
                profile=submission.profile,
                region=submission.region,
            )
        except stage_scope.NoCallerCredentials as exc:
            fix = store_credentials_command(submission.project, submission.profile, _aws_profiles())
            raise NpaError(str(exc), fix=fix) from None
        except stage_scope.StageRoleRefused as exc:
            raise NpaError(str(exc), fix=_stage_role_fix(submission, exc.absent)) from None
        except Exception as exc:  # botocore: STS or IAM did not answer
            raise Unavailable(
                f"cannot ask STS for the stage role {role}: {type(exc).__name__}: {exc}",
                fix=shlex.join(["aws", "sts", "get-caller-identity"])
                + "  # STS answers here? then rerun the same command",
            ) from None
        known = self._known()
        for name, value in scoped.env.items():
            known.add(value, f"stage-role-session:{name}")
        return {f"{STORE_KEY_PREFIX}{k}": v for k, v in scoped.env.items()}

    def _store_secret(self, submission: JobSubmission) -> None:
        from npa.adapters.kube.secrets import NoStoreCredentials, ensure_store_secret

        assert self.context is not None and self.kubeconfig_path is not None
        namespace = project_namespace(submission.project)
        try:
            ensure_store_secret(
                self.kubeconfig_path,
                self.context,
                namespace,
                profile=submission.profile,
                endpoint_url=submission.endpoint_url,
                region=submission.region,
            )
        except NoStoreCredentials as exc:
            raise NpaError(
                str(exc),
                fix=store_credentials_command(
                    submission.project, submission.profile, _aws_profiles()
                ),
            ) from None
        except Exception as exc:
            raise self._secret_unavailable(exc, "write the store Secret", namespace) from None

    def _run_secret(self, submission: JobSubmission, values: dict[str, str]) -> None:
        """Write the run's Secret (one request: it holds all of ``values`` or is unchanged)."""
        from npa.adapters.kube.secrets import run_secret_name, write_run_secret

        assert self.context is not None and self.kubeconfig_path is not None
        namespace = project_namespace(submission.project)
        name = run_secret_name(submission.workflow, submission.run_id)
        try:
            write_run_secret(
                self.kubeconfig_path,
                self.context,
                namespace,
                name,
                values,
                run_id=submission.run_id,
                workflow=submission.workflow,
                generation=submission.generation,
            )
        except Exception as exc:
            raise self._secret_unavailable(
                exc, f"write the run's Secret {name}", namespace
            ) from None

    def _secret_unavailable(
        self, exc: Exception, doing: str, namespace: str, verb: str = "create"
    ) -> Unavailable:
        """The Kubernetes API refused or did not answer a Secret request (never with a value:
        the message is the exception's first line, which names the object); the fix asks
        whether this kubeconfig may ``verb`` Secrets there."""
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Unavailable(
            f"cannot {doing} in namespace {namespace}: {type(exc).__name__}: {first}",
            fix=kubectl_command(
                str(self.kubeconfig_path),
                str(self.context),
                "auth",
                "can-i",
                verb,
                "secrets",
                "-n",
                namespace,
            )
            + "  # then rerun the same command",
        )

    def release_run(self, project: str, workflow: str, run_id: str, generation: int) -> list[str]:
        """Delete the run's Secret (its declared secrets' values) unless a launch after
        ``generation`` wrote it (:func:`~npa.adapters.kube.secrets.delete_run_secret`); the
        project's store Secret stays, for its other runs."""
        from npa.adapters.kube.secrets import delete_run_secret, run_secret_name

        if self.kubeconfig is None or self.context is None:
            return []  # no kubeconfig placed for the context: nothing was ever written there
        assert self.kubeconfig_path is not None
        namespace = project_namespace(project)
        name = run_secret_name(workflow, run_id)
        try:
            gone = delete_run_secret(
                self.kubeconfig_path, self.context, namespace, name, generation
            )
        except Exception as exc:
            raise self._secret_unavailable(
                exc, f"delete the run's Secret {name}", namespace, "delete"
            ) from None
        return [f"secret/{name}"] if gone else []

    def readiness_target(self) -> ReadinessTarget | None:
        if self.kubeconfig is None or self.context is None:
            return None
        from npa.adapters.kube.readyz import readyz_asker

        path = self.kubeconfig_path
        assert path is not None
        return ReadinessTarget(self.context, path, readyz_asker(path, self.context))

    def accelerator_names(self) -> list[str]:
        from npa.adapters.kube.nodes import gpu_label_values

        assert self.kubeconfig_path is not None and self.context is not None
        return gpu_label_values(self.kubeconfig_path, self.context)

    def can_resolve_accelerators(self) -> bool:
        return self.kubeconfig is not None and self.context is not None

    def node_labels_fix(self) -> str:
        return kubectl_command(
            str(self.kubeconfig_path), str(self.context), "get", "nodes", "--show-labels"
        )

    def gpus_fix(self) -> str:
        return shlex.join(["npa", "workbench", "workflow", "gpus", "--context", str(self.context)])

    def pull_context(self) -> str | None:
        return self.context

    def pods_source(self, project: str) -> PodSource:
        where = f"kubernetes context {self.context}"
        missing = None if self.kubeconfig else f"no kubeconfig at {self.kubeconfig_path}"
        fix = kubectl_command(
            str(self.kubeconfig_path),
            str(self.context),
            "get",
            "pods",
            "-n",
            project_namespace(project),
        )
        return PodSource(where=where, missing=missing, fix=fix)

    def controller_reach(self, project: str) -> ControllerReach:
        from npa.adapters.kube.controller import ControllerReach, controller_reach

        if self.kubeconfig_path is None or not self.kubeconfig:
            where = (
                f"at {self.kubeconfig_path}" if self.kubeconfig_path else "for the run's context"
            )
            return ControllerReach(answer="unknown", detail=f"not asked: no kubeconfig {where}")
        namespace = project_namespace(project)
        return controller_reach(self.kubeconfig_path, self.context, namespace, CONTROLLER_PREFIX)

    def controller_node_fix(self, node: str) -> str:
        return kubectl_command(
            str(self.kubeconfig_path), str(self.context), "describe", "node", node
        )

    def pending_reasons(self, record: JobRecord, project: str) -> list[PodReason]:
        """The job's waiting pods, and the pods SkyPilot already deleted after they failed to
        start (it deletes a pod that cannot pull its image within seconds and tries again with
        a new one): those are read from their events, the latest of each kind with the count
        of pods that failed so."""
        from npa.adapters.kube.pods import (
            managed_job_clusters,
            pending_reasons,
            startup_failures,
        )

        assert self.kubeconfig_path is not None
        names = [t.task_name for t in record.tasks if t.task_name]
        with private_home():  # SkyPilot's naming: importing it would create ~/.sky
            clusters = managed_job_clusters(names or [record.job_name], record.job_id)
        reasons = pending_reasons(self.kubeconfig_path, self.context, clusters)
        failed = startup_failures(
            self.kubeconfig_path, self.context, project_namespace(project), clusters
        )
        live = {r.pod for r in reasons}
        gone: dict[tuple[str, str | None], PodReason] = {}
        for failure in failed:  # oldest first: the latest of each kind is kept, with the count
            if failure.pod in live:
                continue
            key = (failure.reason, failure.image)
            count = gone[key].count + 1 if key in gone else 1
            gone[key] = failure.model_copy(update={"count": count})
        return reasons + list(gone.values())

    def startup_failures(self, record: JobRecord, project: str) -> list[tuple[str, PodReason]]:
        from npa.adapters.kube.pods import managed_job_clusters, startup_failures

        assert self.kubeconfig_path is not None
        names = [t.task_name for t in record.tasks if t.task_name] or [record.job_name]
        with private_home():
            task_of = {c: n for n in names for c in managed_job_clusters([n], record.job_id)}
        failures = startup_failures(
            self.kubeconfig_path, self.context, project_namespace(project), set(task_of)
        )
        found = []
        for failure in failures:
            cluster = next((c for c in task_of if failure.pod.startswith(f"{c}-")), None)
            found.append((task_of[cluster] if cluster else record.job_name, failure))
        return found

    def launch_failures(self, record: JobRecord) -> list[LaunchFailure]:
        """From the jobs controller's log of the job: SkyPilot keeps no count of the launches a
        live job failed, and its record says only that the job is in backoff."""
        try:
            lines = self.service.controller_log(record.job_id)
        except Exception as exc:
            if isinstance(exc, ApiServerDown):
                raise BackendUnavailable(self.redact(str(exc)), fix=exc.fix) from None
            raise BackendUnavailable(
                f"the jobs controller's log of job {record.job_id} did not answer: "
                f"{self._words(exc)}",
                fix=self._queue_fix(),
            ) from None
        return launch_failures_in([self.redact(line) for line in lines])

    def launch_failures_source(self, record: JobRecord) -> tuple[str, str]:
        where = f"KUBECONFIG={shlex.quote(self.kubeconfig)} " if self.kubeconfig else ""
        return (
            f"skypilot: jobs controller log of job {record.job_id}",
            f"{where}sky jobs logs --controller {record.job_id} --no-follow",
        )

    @property
    def poll_seconds(self) -> float:
        return float(os.environ.get(POLL_ENV, DEFAULT_POLL))

    @property
    def cancel_settle_seconds(self) -> float:
        # The jobs controller looks for cancel requests every 15 s and only then marks the job
        # CANCELLING; four of its rounds leave room for a controller slowed by a busy node.
        return 4 * CONTROLLER_CANCEL_ROUND

    @property
    def watcher_enabled(self) -> bool:
        return os.environ.get(WATCHER_ENV, "").lower() != "off"

    # --- launch ------------------------------------------------------------------------------
    def request_launch(self, submission: JobSubmission) -> str:
        texts = _launched_texts(submission)
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
        message = f"{doing}: {self._words(exc)}"
        if isinstance(exc, ApiServerDown):
            return BackendUnavailable(f"{doing}: {self.redact(str(exc))}", fix=exc.fix)
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
            # The caller, which knows the spec and the run, says how to review the task.
            return LaunchRejected(message)
        return BackendUnavailable(message, fix=self._queue_fix())

    def _queue_fix(self) -> str:
        """Ask the managed-jobs controller directly, through the same kubeconfig."""
        where = f"KUBECONFIG={shlex.quote(self.kubeconfig)} " if self.kubeconfig else ""
        return f"{where}sky jobs queue  # does the jobs controller answer?"

    # --- reading -----------------------------------------------------------------------------
    def _records(self, name: str) -> list[ManagedJobRecord]:
        try:
            return self.service.queue(name)
        except Exception as exc:
            if no_jobs_controller(exc):
                return []  # no controller, so no job: SkyPilot's authoritative "none"
            if isinstance(exc, ApiServerDown):
                raise BackendUnavailable(self.redact(str(exc)), fix=exc.fix) from None
            raise BackendUnavailable(
                f"sky.jobs.queue_v2 did not answer: {self._words(exc)}",
                fix=self._queue_fix(),
            ) from None

    def _record(self, rows: list[ManagedJobRecord]) -> JobRecord:
        """One job from its rows (a pipeline has one row per task, all with one job id)."""
        first = rows[0]
        if first.job_id is None:
            raise BackendUnavailable(
                f"the queue returned a record of {first.job_name!r} without id"
            )
        current = next((r for r in rows if not job_state(r.status).terminal), rows[-1])
        failed = next((r for r in rows if job_state(r.status).failed), None)
        state = job_state((failed or current).status)
        if all(job_state(r.status) is JobState.SUCCEEDED for r in rows):
            state = JobState.SUCCEEDED
        if not state.terminal and any(_cancel_requested(r.details) for r in rows):
            # SkyPilot recorded the cancel (a CANCELLING event, shown in the details column)
            # before its controller acts on it and changes the status.
            state = JobState.CANCELLING
        return JobRecord(
            backend=BACKEND,
            job_id=first.job_id,
            job_name=str(first.job_name),
            state=state,
            submitted_at=first.submitted_at,
            ended_at=rows[-1].end_at,
            failure_reason=self._redacted(failed.failure_reason if failed else None),
            exit_codes=exit_codes_in(failed.failure_reason if failed else None),
            tasks=[
                TaskRecord(
                    task_id=int(r.task_id or 0),
                    task_name=r.task_name,
                    state=job_state(r.status),
                    failure_reason=self._redacted(r.failure_reason),
                    launched_at=r.submitted_at,
                    started_at=r.start_at,
                    ended_at=r.end_at,
                    recovery_count=r.recovery_count,
                    infra=r.infra,
                    details=self._redacted(r.details),
                    waiting=in_backoff(r.schedule_state, r.details),
                )
                for r in rows
            ],
        )

    def queue(self, job_name: str) -> QueueAnswer:
        return QueueAnswer(
            job_name=job_name, source=self.queue_source, records=self._named([job_name])
        )

    def jobs_named(self, names: Sequence[str]) -> list[JobRecord]:
        return self._named(names)

    def _named(self, names: Sequence[str]) -> list[JobRecord]:
        """The jobs named exactly one of ``names``, from one queue request: SkyPilot matches
        ``name_match`` as a substring, so the names' common beginning finds them all."""
        wanted = set(names)
        common = os.path.commonprefix(sorted(wanted))  # noqa: RUF071 (names, not paths)
        rows = [r for r in self._records(common) if r.job_name in wanted]
        by_id: dict[int, list[ManagedJobRecord]] = {}
        for row in rows:
            if row.job_id is None:
                raise BackendUnavailable(
                    f"the queue returned a record of {row.job_name!r} without id"
                )
            by_id.setdefault(int(row.job_id), []).append(row)
        return [self._record(sorted(v, key=lambda r: r.task_id or 0)) for v in by_id.values()]

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

    def wave_tasks(self, record: JobRecord, stages: JobStages) -> dict[str, dict[int, TaskRecord]]:
        """Each launched stage's wave tasks, by the names npa rendered for them; SkyPilot names
        the lone task of a one-task job after the job, so that task is the one wave the job
        runs when exactly one is launched."""
        launched = stages.launched
        if launched is None:
            return {}
        found: dict[str, dict[int, TaskRecord]] = {}
        for task in record.tasks:
            named = wave_of_task(stages.run_id, task.task_name or "")
            if named is not None and named[0] in launched:
                found.setdefault(named[0], {})[named[1]] = task
        if not found and len(launched) == 1 and len(record.tasks) == 1:
            (lone,) = record.tasks
            if lone.task_name in (record.job_name, None):
                skipped = stages.adopted_waves.get(launched[0], [])
                wave = next(w for w in range(len(skipped) + 1) if w not in skipped)
                found[launched[0]] = {wave: lone}
        return found

    def stage_tasks(self, record: JobRecord, stages: JobStages) -> dict[str, TaskRecord]:
        """Each launched stage as one task record, from its wave tasks: SUCCEEDED once every
        wave the job runs for it did, the first failed wave's state when one failed, else the
        state of the wave that is under way."""
        return {
            stage: _stage_record(waves) for stage, waves in self.wave_tasks(record, stages).items()
        }

    def logs(
        self,
        job_id: int,
        *,
        follow: bool = False,
        stage: str | None = None,
        stages: JobStages | None = None,
    ) -> Iterator[str]:
        selectors: list[str | int | None] = [None]
        if stage is not None:
            selectors = list(self._stage_selectors(job_id, stage, stages, follow))
        try:
            for selector in selectors:
                for line in self.service.tail_logs(job_id, follow, selector):
                    self._refuse_not_found(job_id, line)
                    yield self.redact(line)
        except NotFound:
            raise
        except ApiServerDown as exc:
            raise BackendUnavailable(self.redact(str(exc)), fix=exc.fix) from None
        except Exception as exc:
            raise BackendUnavailable(f"sky.jobs.tail_logs: {self._words(exc)}") from None

    @staticmethod
    def _refuse_not_found(job_id: int, line: str) -> None:
        text = line.strip()
        if text == _NO_JOB.format(job_id=job_id):
            raise NotFound(f"SkyPilot: {text}")
        match = _NO_TASK.fullmatch(text)
        if match and match["job"] == str(job_id):
            raise NotFound(f"SkyPilot: {text}")

    def _stage_selectors(
        self, job_id: int, stage: str, stages: JobStages | None, follow: bool
    ) -> list[str | int]:
        """The ``task=`` selectors of the stage's wave tasks whose logs SkyPilot can serve now,
        in wave order: all of them once the job has ended; in a live job only the wave under
        way (its tail waits, even without ``follow``, for a task that is not running: a
        finished task's cluster is torn down, and its stored log is read only once the whole
        job has ended)."""
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
        waves = self.wave_tasks(record, stages).get(stage)
        if not waves:
            names = ", ".join(f"{t.task_id}:{t.task_name}" for t in record.tasks) or "none"
            raise BackendUnavailable(
                f"job {job_id} has no task npa can tell runs stage {stage!r} (tasks: {names})",
                fix=cached,
            )
        ordered = [waves[w] for w in sorted(waves)]
        if record.state.terminal:
            return [_selector(t) for t in ordered]
        running = [_selector(t) for t in ordered if t.state is JobState.RUNNING]
        if running:
            return running
        return _waiting_selector(record, stage, ordered, follow, cached)


def _selector(task: TaskRecord) -> str | int:
    """SkyPilot's ``task=`` for one task: its name, or its id in the job when it has none."""
    return task.task_name if task.task_name else task.task_id


def _waiting_selector(
    record: JobRecord, stage: str, ordered: list[TaskRecord], follow: bool, cached: str
) -> list[str | int]:
    """In a live job with none of the stage's tasks running: with ``follow`` the task about to
    start (SkyPilot's tail waits for it), else why no log can be served now."""
    job_id = record.job_id
    waiting = next((t for t in ordered if not t.state.terminal), ordered[-1])
    state = waiting.state
    if follow and state in (JobState.PENDING, JobState.STARTING):
        # --follow waits for the task to start, as SkyPilot's tail does
        return [_selector(waiting)]
    if state is JobState.PENDING:
        raise NotFound(
            f"stage {stage!r} (task {waiting.task_id} of job {job_id}) is PENDING: it has "
            "not started, so it has no log yet"
        )
    raise BackendUnavailable(
        f"stage {stage!r} (task {waiting.task_id} of job {job_id}) is {state.value} while "
        f"the job is {record.state.value}: SkyPilot serves that task's log only while it "
        "runs or once the whole job has ended",
        fix=cached,
    )


def _stage_record(waves: dict[int, TaskRecord]) -> TaskRecord:
    """One stage's state from its wave tasks (those this job runs), as one task record."""
    ordered = [waves[w] for w in sorted(waves)]
    failed = next((t for t in ordered if t.state.failed), None)
    current = next((t for t in ordered if not t.state.terminal), None)
    if failed is not None:
        state, reason = failed.state, failed.failure_reason
    elif any(t.state is JobState.CANCELLED for t in ordered):
        state, reason = JobState.CANCELLED, None
    elif current is not None:
        started = current.state is not JobState.PENDING or current is not ordered[0]
        state = JobState.RUNNING if current.state is JobState.PENDING and started else current.state
        reason = None
    else:
        state, reason = JobState.SUCCEEDED, None
    first = ordered[0]
    return TaskRecord(
        task_id=first.task_id,
        task_name=first.task_name,
        state=state,
        failure_reason=reason,
        started_at=first.started_at,
        ended_at=ordered[-1].ended_at if state.terminal else None,
        recovery_count=sum(t.recovery_count or 0 for t in ordered),
        infra=first.infra,
        details=current.details if current is not None else None,
        waiting=current is not None and current.waiting,
    )


def _launched_texts(submission: JobSubmission) -> list[str]:
    """The wave tasks the job runs: one per wave, chained in plan order; a resumed run launches
    only the waves it did not adopt (whole stages, and the finished waves of a partly run one)."""
    return [
        text
        for stage in submission.order
        if stage not in submission.adopted_stages
        for wave, text in enumerate(tasks.documents(submission.tasks[stage]))
        if wave not in submission.adopted_waves.get(stage, [])
    ]


def _secret_values(texts: list[str]) -> dict[str, str]:
    """What the run's Secret holds for ``texts``: each secret source variable they reference
    (the Secret's key) -> its value in this process's environment. Raises InvalidInput naming
    the first that is unset, before anything is written."""
    values: dict[str, str] = {}
    for text in texts:
        declared = tasks.declared_secrets(text)
        for name, value in contract.secret_values(declared, os.environ).items():
            values[declared[name].removeprefix(contract.SECRET_FROM_ENV)] = value
    return values


def _stage_role_fix(submission: JobSubmission, absent: bool) -> str:
    """What makes a refused stage role work: for a role IAM does not have, the command that
    stops asking for it (or record an existing role's ARN the same way); for one the caller
    may not assume, the role's trust policy to compare with the caller, then the same."""
    from npa.adapters.storage.stage_scope import role_name

    unset = npa_command("configure", "--project", submission.project, "--stage-role-arn", "")
    profile = ["--profile", submission.profile] if submission.profile else []
    if absent:
        return f"{unset}  # or record the ARN of a role IAM has, then rerun the same command"
    trust = shlex.join(
        ["aws", "iam", "get-role", "--role-name", role_name(str(submission.stage_role_arn)),
         "--query", "Role.AssumeRolePolicyDocument", *profile]
    )  # fmt: skip
    return (
        f"{trust}  # let your identity (aws sts get-caller-identity) assume it, or: {unset}; "
        "then rerun the same command"
    )


def _aws_profiles() -> list[str]:
    """The AWS profiles this machine's config names."""
    import botocore.session

    return list(botocore.session.Session().available_profiles)
