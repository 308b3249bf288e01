"""``submit``: every gate first, then stage, render, record, and launch exactly once.

1. Gates, all of them, read-only (:mod:`npa.services.gates`): the spec, the run's identity, the
   store and its credentials, the plan and its quota, what the backend needs, image preflight.
   Everything that fails is reported in one error, each item with its fixing command, and
   nothing has been written anywhere.
2. Stage the source (content-addressed, idempotent), render each stage's task for the backend
   with the verified images, put the plan and tasks into the run prefix, write the manifest and
   the receipt.
3. Launch through the launch transaction, record the job id in the receipt and the manifest,
   start the run's watcher, return. The run is then followed with ``status`` from any shell.

The backend is chosen by ``--infra`` (:func:`npa.backends.backend_for_infra`); what differs
between backends is asked of their capabilities, never of their name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from npa.adapters.storage import ObjectStore, inspect_command
from npa.backends import (
    LOCAL_INFRA,
    ExecutionBackend,
    JobSubmission,
    backend_for_infra,
    infra_context,
)
from npa.backends.base import (
    TERMINAL_STATES,
    AdoptsPartialWaves,
    HostsExecutor,
    ImagePull,
    JobRecord,
    JobState,
    PreparesLaunch,
    PullsImagesHere,
    PullsPinnedImages,
)
from npa.core.commands import cancel_command, status_command
from npa.core.errors import (
    GatesFailed,
    GatesUnknown,
    InvalidInput,
    LaunchStopped,
    LocalStateUnavailable,
    NotFound,
    NpaError,
    StoreUnavailable,
    with_rerun,
)
from npa.core.fsio import exclusive_lock, probe_writable
from npa.core.layout import (
    job_name as run_job_name,
)
from npa.core.layout import (
    launch_name as run_launch_name,
)
from npa.core.layout import (
    manifest_key,
    manifest_lock,
    resume_job_name,
    run_prefix,
    task_key,
)
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.launch.readiness import ReadinessCheck, readiness_check
from npa.launch.supervision import Policy
from npa.launch.transaction import LaunchTransaction, Observer, Transaction
from npa.launch.watch import ensure_watcher
from npa.runs.index import mark_run
from npa.runs.journal import OperationJournal
from npa.runs.manifest import (
    ResumeRecord,
    RunManifest,
    base_job_name,
    delete_manifest,
    launch_generation,
    read_manifest,
    update_manifest,
    write_manifest,
    write_plan,
)
from npa.runs.receipts import JobIdentity, Receipt, write_receipt
from npa.runs.staging import Progress
from npa.services.configure import ProjectSettings, resolve_project
from npa.services.gates import Admission, Gate, GateInput, GateReport, run_gates

if TYPE_CHECKING:
    from npa.plan.model import WorkflowPlan
    from npa.spec.model import Workflow

__all__ = ["Gate", "GatesFailed", "SubmitOptions", "SubmitResult", "submit"]


class SubmitResult(Result):
    """What ``submit`` did: gates, staging, tasks, records, and the launch transaction."""

    project: str
    workflow: str
    run_id: str
    infra: str
    backend: str
    job_name: str
    job_id: int
    outcome: str  # launched | adopted | ended (the job had already ended without success)
    job_state: str | None = None  # the job's state as its backend reported it after launch
    failure_reason: str | None = None
    watcher: str | None = None  # what submit did about the process that follows the job
    gates: list[Gate]
    source_digest: str
    source_dir: str  # the directory staged, and what it held
    source_files: int
    source_bytes: int
    run_prefix: str
    manifest: str
    receipt: str
    tasks: dict[str, str]
    task_sha256: dict[str, str] = Field(default_factory=dict)
    runtime: str = "container"  # container | process: how the stages run
    runtime_reason: str | None = None  # why, when --runtime auto chose
    images: dict[str, str]
    accelerator_remap: dict[str, str]
    launch_transaction: dict[str, Any]
    resume: ResumeRecord | None = None  # what --resume-run adopted, when it started a new job
    next: list[str] = Field(default_factory=list)

    def text_lines(self) -> list[str]:
        lines = [f"gates: {sum(g.status == 'ok' for g in self.gates)} ok"]
        for g in self.gates:
            if g.status != "ok":
                lines.append(f"  {g.name}: {g.status}: {g.detail}")
        how = "in their images" if self.runtime == "container" else "as host processes"
        if self.outcome == "ended":
            lines.append("nothing was staged, recorded or launched")
        else:
            lines.append(
                f"source {self.source_dir} staged: {plural(self.source_files, 'file')}, "
                f"{plural(self.source_bytes, 'byte')} ({self.source_digest}); "
                f"{plural(len(self.tasks), 'task')} rendered; stages run {how}"
                + (f" ({self.runtime_reason})" if self.runtime_reason else "")
            )
        if self.outcome == "ended":
            why = f": {self.failure_reason}" if self.failure_reason else ""
            lines.append(
                f"run {self.run_id}: its {self.backend} job {self.job_id} ({self.job_name}) "
                f"already ended {self.job_state}{why}; a plain submit never runs a finished job "
                "again"
            )
        else:
            lines.append(
                f"run {self.run_id} {self.outcome} as {self.backend} job {self.job_id} "
                f"({self.job_name})"
            )
        if self.watcher:
            lines.append(f"  {self.watcher}")
        lines += [
            f"  prefix:   {self.run_prefix}",
            f"  manifest: {self.manifest}",
            f"  receipt:  {self.receipt}",
        ]
        if self.resume is not None:
            r = self.resume
            partial = ", ".join(f"{k} waves {v}" for k, v in r.adopted_waves.items())
            lines.append(
                f"  resumed after job {r.previous_job_id} ({r.previous_state}): adopted stages "
                f"{', '.join(r.adopted_stages) or '-'}" + (f"; {partial}" if partial else "")
            )
        lines += [f"  next: {n}" for n in self.next]
        return lines

    def exit_code(self) -> int:
        return 1 if self.outcome == "ended" else 0


@dataclass
class SubmitOptions:
    spec: Path
    project: str | None = None
    run_id: str | None = None
    resume_run: str | None = None
    infra: str = LOCAL_INFRA
    runtime: str = "auto"
    image_overrides: tuple[str, ...] = ()
    image: str | None = None
    registry_auth: tuple[str, ...] = ()
    digests: Path | None = None
    retries: int | None = None
    startup_failure_threshold: int = 3
    max_infrastructure_recoveries: int = 3
    resolve_accelerators: bool = True
    preflight_images: bool = True
    max_parallel: int = 4

    def command(self, run_id: str, *, resume: bool | None = None) -> str:
        """This submit as a command line for ``run_id`` (``--resume-run`` when resuming), with
        every option given: what a person runs to do it again."""
        resume = bool(self.resume_run) if resume is None else resume
        argv = ["workbench", "workflow", "submit", str(self.spec)]
        argv += ["--project", self.project] if self.project else []
        argv += ["--resume-run" if resume else "--run-id", run_id]
        argv += ["--infra", self.infra] if self.infra != LOCAL_INFRA else []
        argv += ["--runtime", self.runtime] if self.runtime != "auto" else []
        for override in self.image_overrides:
            argv += ["--image-override", override]
        argv += ["--image", self.image] if self.image else []
        argv += ["--digests", str(self.digests)] if self.digests else []
        for auth in self.registry_auth:
            argv += ["--registry-auth", auth]
        argv += ["--retries", str(self.retries)] if self.retries is not None else []
        if self.startup_failure_threshold != 3:
            argv += ["--startup-failure-threshold", str(self.startup_failure_threshold)]
        if self.max_infrastructure_recoveries != 3:
            argv += ["--max-infrastructure-recoveries", str(self.max_infrastructure_recoveries)]
        argv += [] if self.resolve_accelerators else ["--no-resolve-accelerators"]
        argv += [] if self.preflight_images else ["--no-preflight-images"]
        argv += ["--max-parallel", str(self.max_parallel)] if self.max_parallel != 4 else []
        return _cmd(*argv)


def _rerun_with_overrides(options: SubmitOptions) -> Callable[[tuple[str, ...]], str] | None:
    """``options``' submit again with other image overrides (None without a run to name)."""
    run = options.resume_run or options.run_id
    if run is None:
        return None
    return lambda overrides: replace(options, image_overrides=overrides).command(run)


def _cmd(*argv: str) -> str:
    return shlex.join(["npa", *argv])


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _plan_digest(plan_json: dict[str, Any]) -> str:
    return _digest(json.dumps(plan_json, sort_keys=True, separators=(",", ":")))


def _resumed_from(existing: RunManifest, backend: ExecutionBackend) -> str | None:
    """The state of the job a resume replaces; None when that job is live or succeeded (then
    the launch transaction adopts it as it is). The backend is asked by job id."""
    assert existing.job_id is not None
    try:
        record = backend.job(existing.job_id)
    except NotFound:
        previous = existing.state  # the job is gone from the backend; the manifest is the record
        if previous not in {s.value for s in JobState if s.terminal}:
            raise InvalidInput(
                f"job {existing.job_id} of run {existing.run_id} is unknown to the backend but "
                f"the manifest says {previous}; npa will not relaunch what it cannot account for",
                fix=f"npa workbench workflow status {existing.run_id} --project {existing.project}",
            ) from None
        return previous
    if not record.state.terminal or record.state is JobState.SUCCEEDED:
        return None
    return record.state.value


def _plan_resume(
    existing: RunManifest,
    backend: ExecutionBackend,
    store: ObjectStore,
    prefix: str,
    plan: WorkflowPlan,
) -> ResumeRecord | None:
    """What ``--resume-run`` adopts from a run whose job ended without success; None when the
    job is still live or succeeded.

    A stage is adopted whole when all its waves succeeded and every declared output validates
    non-empty in the store; in the first stage that is not, the waves that succeeded are adopted
    under the same check (where the backend can start a stage at any wave); nothing after it is
    adopted (its inputs may change).
    """
    from npa.runs.outputs import check_stage

    previous = _resumed_from(existing, backend)
    if previous is None:
        return None
    adopted: list[str] = []
    waves: dict[str, list[int]] = {}
    for planned in plan.stages:
        rec = existing.stages.get(planned.name)
        done = sorted(w.wave for w in (rec.waves if rec else []) if w.state == "SUCCEEDED")
        if not done or not check_stage(store, prefix, planned, rec.state if rec else "PENDING").ok:
            break
        if len(done) == planned.waves.waves and rec is not None and rec.state == "SUCCEEDED":
            adopted.append(planned.name)
            continue
        if isinstance(backend, AdoptsPartialWaves):
            waves[planned.name] = done
        break
    attempt = len(existing.resumes) + 1
    return ResumeRecord(
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        attempt=attempt,
        previous_job_id=existing.job_id,
        previous_state=previous,
        adopted_stages=adopted,
        adopted_waves=waves,
        job_name=resume_job_name(existing.workflow, existing.run_id, attempt),
    )


def _apply_resume(resume: ResumeRecord) -> Callable[[RunManifest], None]:
    """The manifest change a resume makes: a new launch, and every stage it does not adopt
    reset to PENDING (keeping the waves it adopts)."""

    def resumed(m: RunManifest) -> None:
        m.resumes.append(resume)
        m.state, m.job_id, m.job_name = "LAUNCHING", None, resume.job_name
        for stage, rec in m.stages.items():
            if stage in resume.adopted_stages:
                continue
            keep = set(resume.adopted_waves.get(stage, []))
            rec.waves = [w for w in rec.waves if w.wave in keep]
            rec.state, rec.ended_at, rec.classification, rec.detail = "PENDING", None, None, None

    return resumed


@dataclass
class _Run:
    """One submit's run as it is being recorded and launched."""

    options: SubmitOptions
    paths: NpaPaths
    settings: ProjectSettings
    backend: ExecutionBackend
    admission: Admission
    store: ObjectStore
    workflow: Workflow
    plan: WorkflowPlan
    run_id: str
    prefix: str
    source_digest: str = ""
    source_dir: str = ""  # the directory staged, and what it held
    source_files: int = 0
    source_bytes: int = 0
    tasks: dict[str, str] = field(default_factory=dict)

    @property
    def project(self) -> str:
        return self.settings.project

    @property
    def spec_sha256(self) -> str:
        assert self.admission.spec_sha256 is not None
        return self.admission.spec_sha256

    @property
    def store_uri(self) -> str:
        return self.admission.store_uri

    @property
    def lock(self) -> Path:
        return self.paths.lock(manifest_lock(self.project, self.run_id))

    def update(self, mutate: Callable[[RunManifest], None]) -> RunManifest:
        return update_manifest(self.store, self.prefix, self.lock, mutate)


def _render(run: _Run) -> dict[str, str]:
    """Each stage's task file for the backend, with the images preflight verified: the same
    call ``render`` makes, so ``render --run-id`` shows these bytes."""
    from npa.render.tasks import pinned_images, render_run

    try:
        images: dict[str, str] = {}
        if isinstance(run.backend, PullsPinnedImages):
            images = pinned_images(run.workflow, run.admission.digests, run.admission.images)
        rendered = render_run(
            run.workflow,
            run.plan,
            run.backend,
            images=images,
            accelerators=run.admission.accelerators,
        )
    except InvalidInput as error:
        if error.fix is None:
            project = run.project
            error.fix = (
                _cmd("workbench", "workflow", "preflight-images", str(run.options.spec))
                + f" --project {shlex.quote(project)}"
                if error.details.get("unpinned")
                else _cmd("configure", "--show", "--project", project)
            )
        raise
    return {t.stage: t.text for t in rendered}


def _store_run_files(run: _Run, existing: RunManifest | None) -> dict[str, str]:
    """Put the plan and the task files into the run prefix; returns each task's sha256. A run
    that was launched never changes: other tasks than it launched are refused."""
    digests = _check_tasks(run, existing)
    write_plan(run.store, run.prefix, run.plan)
    for stage, text in run.tasks.items():
        run.store.put(task_key(run.prefix, stage, run.backend.task_suffix), text.encode())
    return digests


def _check_tasks(run: _Run, existing: RunManifest | None) -> dict[str, str]:
    """Each task's sha256; refused when the run was launched with other tasks."""
    digests = {s: hashlib.sha256(t.encode()).hexdigest() for s, t in run.tasks.items()}
    if existing is not None and existing.job_id is not None and existing.tasks != digests:
        raise InvalidInput(
            f"run {run.run_id} was already launched (job {existing.job_id}) with different "
            "tasks; a launched run never changes",
            fix=f'RUN_ID="$(npa workbench workflow prepare-run {run.options.spec} --project '
            f'{run.project})"  # a new run for the changed spec',
        )
    return digests


def _new_manifest(run: _Run, digests: dict[str, str], now: str) -> RunManifest:
    options = run.options
    manifest = RunManifest(
        project=run.project,
        workflow=run.workflow.metadata.name,
        run_id=run.run_id,
        backend=run.backend.name,
        infra=options.infra,
        state="LAUNCHING",
        submitted_at=now,
        updated_at=now,
        store=run.store_uri,
        prefix=run.prefix,
        spec_sha256=run.spec_sha256,
        source_digest=run.source_digest,
        plan_digest=_plan_digest(run.plan.model_dump(mode="json")),
        tasks=digests,
        order=run.plan.order,
        images=run.admission.images,
        accelerator_remap=run.admission.accelerators,
        policy={
            "retries": options.retries,
            "runtime": options.runtime,
            "startup_failure_threshold": options.startup_failure_threshold,
            "max_infrastructure_recoveries": options.max_infrastructure_recoveries,
            "resolve_accelerators": options.resolve_accelerators,
        },
        job_name=run_job_name(run.workflow.metadata.name, run.run_id),
    )
    write_manifest(run.store, manifest)
    return manifest


def _record(run: _Run) -> tuple[RunManifest, ResumeRecord | None]:
    """Store the run's files and its manifest (a resume's record added to an existing one)."""
    existing = read_manifest(run.store, run.prefix)
    if existing is None:
        # The run's marker in its project's index, before its first manifest (npa.runs.index).
        mark_run(run.store, run.project, run.workflow.metadata.name, run.run_id)
    digests = _store_run_files(run, existing)
    resume: ResumeRecord | None = None
    if existing is not None and existing.job_id is not None and run.options.resume_run:
        resume = _plan_resume(existing, run.backend, run.store, run.prefix, run.plan)
    if resume is not None:
        existing = run.update(_apply_resume(resume))
    if existing is not None:
        return existing, resume
    now = datetime.now(UTC).isoformat(timespec="seconds")
    return _new_manifest(run, digests, now), resume


def _receipt(run: _Run, manifest: RunManifest) -> Receipt:
    settings = run.settings
    return Receipt(
        project=run.project,
        project_identity=settings.identity,
        workflow=run.workflow.metadata.name,
        run_id=run.run_id,
        # When the run was submitted: a later submit of it (an adoption, a continuation, a
        # resume) keeps that time, as the manifest does.
        submitted_at=manifest.submitted_at,
        store=run.store_uri,
        workflow_prefix=f"{run.store_uri}/{run.prefix}",
        endpoint_url=settings.value("endpoint_url"),
        region=settings.value("region"),
        profile=settings.value("profile"),
        credentials_source=settings.credentials,
        source_digest=run.source_digest,
        plan_digest=manifest.plan_digest,
        tasks=dict(manifest.tasks),
        runtime=run.backend.runtime,
        job=JobIdentity(
            backend=run.backend.name,
            job_id=manifest.job_id and str(manifest.job_id),
            job_name=manifest.job_name,
        ),
    )


def _submission(run: _Run, manifest: RunManifest) -> JobSubmission:
    # The run's current job runs what its last resume left: also when this submit only adopts
    # that job, or completes a resume whose launch was interrupted (its journal decides).
    options, settings = run.options, run.settings
    last_resume = manifest.resumes[-1] if manifest.resumes else None
    context = infra_context(options.infra)
    kubeconfig = str(run.paths.cluster_kubeconfig(context)) if context else None
    return JobSubmission(
        job_name=manifest.job_name,
        project=run.project,
        workflow=run.workflow.metadata.name,
        run_id=run.run_id,
        store=run.store_uri,
        endpoint_url=settings.value("endpoint_url"),
        region=settings.value("region"),
        profile=settings.value("profile"),
        stage_role_arn=settings.value("stage_role_arn"),
        external_inputs=sorted(
            {i.uri for s in run.plan.stages for i in s.inputs if i.from_stage is None and i.uri}
        ),
        prefix=run.prefix,
        order=run.plan.order,
        tasks=run.tasks,
        retries=options.retries,
        startup_failure_threshold=options.startup_failure_threshold,
        max_infrastructure_recoveries=options.max_infrastructure_recoveries,
        max_parallel=options.max_parallel,
        kubeconfig=kubeconfig,
        kube_context=context,
        adopted_stages=last_resume.adopted_stages if last_resume else [],
        adopted_waves=last_resume.adopted_waves if last_resume else {},
        generation=launch_generation(manifest),
    )


def _review_fix(run: _Run) -> str:
    """What a backend refused is the run's task: the command that shows it for review (the
    render verb for a Kubernetes context, else the task files stored in the run prefix)."""
    context = infra_context(run.options.infra)
    if context is None:
        return inspect_command(run.store, run.prefix, listing=True) + "  # the run's task files"
    return _cmd(
        "workbench", "workflow", "render", str(run.options.spec), "--run-id", run.run_id,
        "--out", f"{run.run_id}-render", "--context", context,
    )  # fmt: skip


def _launch(
    run: _Run,
    submission: JobSubmission,
    manifest: RunManifest,
    *,
    launch_name: str,
    readiness: ReadinessCheck | None,
    observe: Observer | None,
    started: Callable[[Transaction], None],
) -> LaunchTransaction:
    """The launch transaction (handed to ``started`` first), and its outcome recorded in the
    manifest."""
    policy = Policy(
        startup_failure_threshold=run.options.startup_failure_threshold,
        max_infrastructure_recoveries=run.options.max_infrastructure_recoveries,
        retries=run.options.retries,
    )
    supervisor = manifest.supervisor.model_copy(deep=True)
    transaction = Transaction(
        run.backend,
        submission,
        journal=OperationJournal(run.paths, launch_name),
        lock_path=run.paths.lock(launch_name),
        readiness=readiness,
        policy=policy,
        supervisor=supervisor,
        observe=observe or run.backend.observer(),
    )
    started(transaction)
    try:
        record = transaction.run()
    except LaunchStopped as stopped:
        final_state = stopped.state.value

        def stop(m: RunManifest) -> None:
            m.state = final_state
            m.supervisor = supervisor
            m.launch_transaction = transaction.record.model_dump(mode="json")

        run.update(stop)
        stopped.details["launch_transaction"] = transaction.record.model_dump(mode="json")
        if stopped.fix is None:
            stopped.fix = _review_fix(run)
        raise
    job_id = record.job_id
    assert job_id is not None

    def launched(m: RunManifest) -> None:
        m.job_id = job_id
        m.launch_transaction = record.model_dump(mode="json")
        m.supervisor.startup_failures = supervisor.startup_failures
        m.supervisor.infrastructure_recoveries = max(
            m.supervisor.infrastructure_recoveries, supervisor.infrastructure_recoveries
        )
        known = {(a.at, a.what) for a in m.supervisor.attempts}
        m.supervisor.attempts += [a for a in supervisor.attempts if (a.at, a.what) not in known]
        if supervisor.attempts and m.supervisor.classification is None:
            m.supervisor.classification = supervisor.classification
            m.supervisor.recovery = supervisor.recovery
        if m.state == "LAUNCHING":
            m.state = "PENDING"

    run.update(launched)
    return record


def _pull_images(
    options: SubmitOptions, backend: ExecutionBackend, workflow: Workflow, images: dict[str, str]
) -> None:
    """Pull the stages' images, as preflight verified them, onto this machine when the backend
    runs them here. This process holds the registry credentials: they go to the engine on its
    standard input, never to a file or to the job."""
    if not isinstance(backend, PullsImagesHere):
        return
    from npa.adapters.containers import RegistryLogin
    from npa.images.credentials import load_store
    from npa.images.reference import parse_reference
    from npa.images.registry import is_loopback

    credentials = load_store(options.registry_auth)
    pulls = []
    for reference in sorted({images[s.tool] for s in workflow.stages}):
        ref = parse_reference(reference)
        found = credentials.lookup(ref.credential_host)
        login = (
            None
            if found is None
            else RegistryLogin(
                registry=ref.credential_host,
                source=found.source,
                username=found.username,
                secret=found.secret,
            )
        )
        pulls.append(ImagePull(reference, plain_http=is_loopback(ref.api_host), login=login))
    backend.pull_images(pulls)


def _runtime_reason(options: SubmitOptions, backend: ExecutionBackend) -> str | None:
    """Why the stages run as they do, when ``--runtime auto`` decided."""
    if options.runtime != "auto" or options.infra != LOCAL_INFRA:
        return None
    if backend.runtime == "process":
        return "--runtime auto: no container engine (podman, docker) answers on this machine"
    return "--runtime auto: a container engine answers on this machine"


def _admit(
    options: SubmitOptions, paths: NpaPaths, backend: ExecutionBackend
) -> tuple[ProjectSettings, GateReport]:
    """Every gate; raises GatesFailed (nothing written) unless all pass."""
    settings = resolve_project(options.project, paths=paths)
    asked = GateInput(
        spec=options.spec,
        run=options.resume_run or options.run_id,
        preflight_images=options.preflight_images,
        resolve_accelerators=options.resolve_accelerators,
        image_overrides=options.image_overrides,
        image=options.image,
        registry_auth=options.registry_auth,
        digests=options.digests,
        rerun=_rerun_with_overrides(options),
    )
    report = run_gates(asked, paths, settings, backend)
    try:
        report.raise_if_failed()
    except GatesUnknown as error:
        # Nothing is wrong with the run: once the source answers, this same submit goes on.
        if asked.run:
            with_rerun(error, options.command(asked.run))
        raise
    return settings, report


def submit(
    options: SubmitOptions,
    *,
    paths: NpaPaths | None = None,
    backend: ExecutionBackend | None = None,
    readiness: ReadinessCheck | None = None,
    observe: Observer | None = None,
    progress: Progress | None = None,
) -> SubmitResult:
    """Gate, stage, render, record and launch one run; ``progress`` shows the staging."""
    from npa.services.runs import stage_run_source

    paths = paths or NpaPaths.from_env()
    if options.run_id and options.resume_run and options.run_id != options.resume_run:
        raise InvalidInput("--run-id and --resume-run name different runs; pass only one of them")
    backend = backend or backend_for_infra(options.infra, paths, runtime=options.runtime)
    settings, report = _admit(options, paths, backend)
    admission = report.admission
    assert admission.workflow is not None and admission.entry is not None
    assert admission.plan is not None and admission.store is not None
    workflow = admission.workflow
    run = _Run(
        options=options,
        paths=paths,
        settings=settings,
        backend=backend,
        admission=admission,
        store=admission.store,
        workflow=workflow,
        plan=admission.plan,
        run_id=admission.entry.run_id,
        prefix=run_prefix(workflow.metadata.name, admission.entry.run_id),
    )
    rerun = options.command(run.run_id)
    try:
        # Rendering reads nothing it writes, so a submit the run's records refuse (a finished
        # job, a launched run with other tasks) is refused here, before anything is written.
        run.tasks = _render(run)
        refused = _refusal(run, report)
        if refused is not None:
            return refused
        # Keep what the gates verified, now that the submit goes on.
        admission.commit()
        _pull_images(options, backend, workflow, admission.images)
        _probe_local_state(paths, backend, run.project)
        staged = stage_run_source(
            options.spec,
            run.project,
            run.run_id,
            None,
            interactive=False,
            paths=paths,
            progress=progress,
        )
        run.source_digest = staged.source_digest
        run.source_dir, run.source_files, run.source_bytes = (
            staged.source,
            staged.files,
            staged.bytes,
        )
        return _record_and_launch(run, report, readiness=readiness, observe=observe)
    except (StoreUnavailable, LocalStateUnavailable) as error:
        # Once the store answers (or the disk is fixed), the same submit picks up where this one
        # stopped: it never launches a second job for the run.
        raise with_rerun(error, rerun, replace=True) from None


def _refusal(run: _Run, report: GateReport) -> SubmitResult | None:
    """What the run's own records refuse, decided before this submit writes anything (a
    refused submit leaves the receipt, the journals and the manifest as they were):

    - a launched run whose tasks would change (InvalidInput);
    - a resume of a job the backend does not know while the manifest says it is live
      (InvalidInput);
    - a plain submit of a job npa executes that ended without success: the ``ended`` result,
      whose next command is the resume.
    """
    existing = read_manifest(run.store, run.prefix)
    if existing is None or existing.job_id is None:
        return None
    _check_tasks(run, existing)
    if run.options.resume_run:
        _resumed_from(existing, run.backend)
        return None
    if not isinstance(run.backend, HostsExecutor):
        return None  # its watcher decides whether the job is relaunched
    try:
        job = run.backend.job(existing.job_id)
    except NotFound:
        return None
    if not job.state.terminal or job.state is JobState.SUCCEEDED or job.continuable:
        return None
    if existing.state not in {s.value for s in JobState if s.terminal}:
        # The executor records its verdict in the job; a manifest the store kept from recording
        # it is brought to what the job says (the one write a finished job still gets).
        _record_final(run, job)
    return _ended(run, report, existing, job)


def _ended(run: _Run, report: GateReport, m: RunManifest, job: JobRecord) -> SubmitResult:
    """The result of a plain submit of a finished job: what the records say, nothing new."""
    assert job.job_id is not None
    base = f"{run.store_uri}/{run.prefix}"
    suffix = run.backend.task_suffix
    return SubmitResult(
        project=run.project,
        workflow=m.workflow,
        run_id=run.run_id,
        infra=run.options.infra,
        backend=run.backend.name,
        job_name=m.job_name,
        job_id=job.job_id,
        outcome="ended",
        job_state=job.state.value,
        failure_reason=job.failure_reason,
        gates=report.gates,
        source_digest=m.source_digest or "",
        source_dir="",
        source_files=0,
        source_bytes=0,
        run_prefix=base,
        manifest=f"{run.store_uri}/{manifest_key(run.prefix)}",
        receipt=str(run.paths.submission_receipt(run.project, run.run_id)),
        tasks={s: f"{run.store_uri}/{task_key(run.prefix, s, suffix)}" for s in m.tasks},
        task_sha256=dict(m.tasks),
        runtime=run.backend.runtime,
        images=dict(m.images),
        accelerator_remap=dict(m.accelerator_remap),
        launch_transaction=m.launch_transaction or {},
        next=[run.options.command(run.run_id, resume=True)],
    )


def _record_and_launch(
    run: _Run,
    report: GateReport,
    *,
    readiness: ReadinessCheck | None,
    observe: Observer | None,
) -> SubmitResult:
    """Record the run (manifest, receipt), launch it exactly once and start its watcher. A
    failure before any launch request left this machine puts the records back as they were."""
    paths, backend, options = run.paths, run.backend, run.options
    before = _Before.capture(run)
    transaction: list[Transaction] = []
    prepared: PreparesLaunch | None = None
    generation = 0  # the launch this submit makes (its manifest says which, once recorded)
    try:
        manifest, resume = _record(run)
        generation = launch_generation(manifest)
        receipt = _receipt(run, manifest)
        receipt_path = write_receipt(paths, receipt)
        # Each resume is its own launch (its own job name and journal), so rerunning the same
        # resume adopts its job rather than launching another; so is a watcher's relaunch (-a<N>).
        launch_name = run_launch_name(
            run.project,
            run.run_id,
            resumes=len(manifest.resumes),
            job_name=manifest.job_name,
            base=base_job_name(manifest),
        )
        submission = _submission(run, manifest)
        prepared = _prepare(backend, submission)
        readiness = readiness or readiness_check(backend)
        record = _launch(
            run,
            submission,
            manifest,
            launch_name=launch_name,
            readiness=readiness,
            observe=observe,
            started=transaction.append,
        )
    except NpaError as error:
        if not transaction or not transaction[0].requested:
            before.restore(run, error)
            before.unprepare(run, prepared, error, generation)
        raise
    job_id = record.job_id
    assert job_id is not None
    receipt.job = JobIdentity(backend=backend.name, job_id=str(job_id), job_name=manifest.job_name)
    write_receipt(paths, receipt)
    # A job npa executes that ended without success stays ended; one whose executor died
    # without a final state is continued by the watcher started below. A job another service
    # runs goes to the watcher whatever its state: supervision decides whether it is relaunched,
    # and its state is not asked here (a SkyPilot queue request, seconds, only to print it).
    hosted = isinstance(backend, HostsExecutor)
    job = backend.job(job_id) if hosted else None
    ended = (
        job is not None
        and job.state.terminal
        and job.state is not JobState.SUCCEEDED
        and not job.continuable
    )
    if ended:
        assert job is not None
        _record_final(run, job)
    watcher = None
    if not ended:
        # Follow the job from now on: keep a live watcher, or start one (which, for a job whose
        # executor died, continues the job).
        pid = ensure_watcher(
            paths,
            backend,
            submission,
            job_id=job_id,
            launch_name=launch_name,
            base_name=base_job_name(manifest),
            readiness=readiness,
        )
        watcher = _watcher_note(job, pid)
    status = status_command(run.run_id, run.project)
    resume_cmd = options.command(run.run_id, resume=True)
    workflow = run.workflow.metadata.name
    base = f"{run.store_uri}/{run.prefix}"
    return SubmitResult(
        project=run.project,
        workflow=workflow,
        run_id=run.run_id,
        infra=options.infra,
        backend=backend.name,
        job_name=manifest.job_name,
        job_id=job_id,
        outcome="ended" if ended else record.outcome or "launched",
        job_state=job.state.value if job else None,
        failure_reason=job.failure_reason if job else None,
        watcher=watcher,
        gates=report.gates,
        source_digest=run.source_digest,
        source_dir=run.source_dir,
        source_files=run.source_files,
        source_bytes=run.source_bytes,
        run_prefix=base,
        manifest=f"{run.store_uri}/{manifest_key(run.prefix)}",
        receipt=str(receipt_path),
        tasks={
            s: f"{run.store_uri}/{task_key(run.prefix, s, backend.task_suffix)}" for s in run.tasks
        },
        task_sha256=dict(manifest.tasks),
        runtime=backend.runtime,
        runtime_reason=_runtime_reason(options, backend),
        images=run.admission.images,
        accelerator_remap=run.admission.accelerators,
        launch_transaction=record.model_dump(mode="json"),
        resume=resume,
        next=[resume_cmd] if ended else [status + " --watch"],
    )


def _watcher_note(job: JobRecord | None, pid: int | None) -> str | None:
    """What submit did about the process that follows the job."""
    if pid is None:
        return None
    if job is not None and job.continuable:
        return (
            f"started watcher pid {pid} to continue the job ({job.failure_reason}); work "
            "already done is not repeated"
        )
    return f"watcher pid {pid}"


def _record_final(run: _Run, job: JobRecord) -> None:
    """Write a hosted job's final state into the manifest when its executor could not (the
    store did not answer at the end): the run's record says what the job says."""
    if job.job_id is None:
        return
    state = job.state.value

    def final(m: RunManifest) -> None:
        if m.job_id == job.job_id and m.state not in {s.value for s in JobState if s.terminal}:
            m.state = state

    run.update(final)


def _probe_local_state(paths: NpaPaths, backend: ExecutionBackend, project: str) -> None:
    """Every folder of this machine the launch will write must take a write now, so a full or
    read-only disk stops submit before anything is recorded (never half way)."""
    folders = [
        paths.locks_dir,
        paths.operations_dir,
        paths.submissions_dir / project,
        paths.root / "supervisors",
        *backend.local_state(),
    ]
    for folder in folders:
        probe_writable(folder)


def _prepare(backend: ExecutionBackend, submission: JobSubmission) -> PreparesLaunch | None:
    """Let a backend that prepares its launches do so; the backend when it did."""
    if not isinstance(backend, PreparesLaunch):
        return None
    backend.prepare_launch(submission)
    return backend


@dataclass
class _Before:
    """The run's manifest and receipt as they were before this submit changed them."""

    manifest: RunManifest | None
    receipt: bytes | None

    @classmethod
    def capture(cls, run: _Run) -> _Before:
        path = run.paths.submission_receipt(run.project, run.run_id)
        try:
            receipt: bytes | None = path.read_bytes()
        except FileNotFoundError:
            receipt = None
        return cls(read_manifest(run.store, run.prefix), receipt)

    def restore(self, run: _Run, error: NpaError) -> None:
        """Put the records back (no job exists: no request left this machine); the error
        then says so, or says what could not be put back."""
        from npa.core.fsio import atomic_write_bytes

        try:
            current = read_manifest(run.store, run.prefix)
            if current is not None and (
                self.manifest is None or current.model_dump() != self.manifest.model_dump()
            ):
                with contextlib.ExitStack() as held:
                    # Under the manifest lock when it can be taken; a read-only locks folder
                    # (what may have stopped this submit) still lets the record be put back.
                    with contextlib.suppress(LocalStateUnavailable):
                        held.enter_context(exclusive_lock(run.lock, timeout=60))
                    if self.manifest is None:
                        delete_manifest(run.store, run.prefix)
                    else:
                        write_manifest(run.store, self.manifest)
            path = run.paths.submission_receipt(run.project, run.run_id)
            if self.receipt is None:
                path.unlink(missing_ok=True)
            elif not path.exists() or path.read_bytes() != self.receipt:
                atomic_write_bytes(path, self.receipt)
        except (NpaError, OSError) as undo:
            error.details["rolled_back"] = False
            error.message += (
                f"; no job was launched, but the run's records could not be put back ("
                f"{getattr(undo, 'message', undo)}): the run reads LAUNCH_INCOMPLETE until the "
                "same submit is run again"
            )
            return
        error.details["rolled_back"] = True
        error.message += "; no job was launched and the run's records are as they were"

    def unprepare(
        self, run: _Run, backend: PreparesLaunch | None, error: NpaError, generation: int
    ) -> None:
        """Remove what :meth:`PreparesLaunch.prepare_launch` put in place for this run (the
        run's Secret) when no job of the run can be using it: the run had never launched, or
        its last job had ended. A live run's (a rerun of its submit) stays."""
        ended = {s.value for s in TERMINAL_STATES}
        if backend is None or (self.manifest is not None and self.manifest.state not in ended):
            return
        try:
            backend.release_run(run.project, run.workflow.metadata.name, run.run_id, generation)
        except NpaError as undo:
            error.message += (
                f"; what this submit put in place for the run could not be removed "
                f"({undo.message}): {cancel_command(run.run_id, run.project)} removes it"
            )
