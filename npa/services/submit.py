"""``submit``: every gate first, then stage, render, record, and launch exactly once.

1. Gates, all of them, read-only: the spec, the run's identity, the store and its credentials,
   the plan and its quota, the kubeconfig of the context, the SkyPilot SDK, and image preflight.
   Everything that fails is reported in one error, each item with its fixing command, and
   nothing has been written anywhere.
2. Stage the source (content-addressed, idempotent), render each stage's task for the backend
   with the verified images, put the plan and tasks into the run prefix, write the manifest and
   the receipt.
3. Launch through the launch transaction, record the job id in the receipt and the manifest,
   return. The run is then followed with ``status`` from any shell.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from npa.adapters.storage import (
    BucketAbsent,
    ObjectStore,
    StoreUnavailable,
    normalize_store_uri,
    open_store,
)
from npa.backends import ExecutionBackend, JobSubmission, TaskContext, open_backend
from npa.backends.base import JobState
from npa.core.errors import EXIT_FAILURE, InvalidInput, NotFound, NpaError, Unavailable
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.launch.readyz import DEFAULT_COUNT, DEFAULT_WINDOW, ReadinessProbe, kube_readyz
from npa.launch.supervision import Policy
from npa.launch.transaction import LaunchStopped, Observer, Transaction
from npa.runs.journal import OperationJournal
from npa.runs.manifest import (
    ResumeRecord,
    RunManifest,
    read_manifest,
    update_manifest,
    write_manifest,
)
from npa.runs.receipts import JobIdentity, Receipt, write_receipt
from npa.services.configure import ProjectSettings, resolve_project
from npa.services.runs import run_prefix

GateStatus = Literal["ok", "failed", "unknown", "skipped", "not_applicable"]
# Environment overrides of the readiness window, so end-to-end tests need not wait 10 s each.
WINDOW_ENV = "NPA_READYZ_WINDOW_SECONDS"
INTERVAL_ENV = "NPA_READYZ_INTERVAL_SECONDS"


class Gate(BaseModel):
    name: str
    status: GateStatus
    detail: str
    fix: str | None = None


class GatesFailed(NpaError):
    """At least one gate did not pass; nothing was staged or launched."""

    exit_code = EXIT_FAILURE
    kind = "gates_failed"


class SubmitResult(Result):
    """What ``submit`` did: gates, staging, tasks, records, and the launch transaction."""

    project: str
    workflow: str
    run_id: str
    infra: str
    backend: str
    job_name: str
    job_id: int
    outcome: str  # launched | adopted
    gates: list[Gate]
    source_digest: str
    run_prefix: str
    manifest: str
    receipt: str
    tasks: dict[str, str]
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
        lines += [
            f"source {self.source_digest} staged; {len(self.tasks)} tasks rendered",
            f"run {self.run_id} {self.outcome} as {self.backend} job {self.job_id} "
            f"({self.job_name})",
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


@dataclass
class SubmitOptions:
    spec: Path
    project: str | None = None
    run_id: str | None = None
    resume_run: str | None = None
    infra: str = "local"
    image_overrides: tuple[str, ...] = ()
    image: str | None = None
    registry_auth: tuple[str, ...] = ()
    retries: int | None = None
    startup_failure_threshold: int = 3
    max_infrastructure_recoveries: int = 3
    resolve_accelerators: bool = True
    preflight_images: bool = True
    max_parallel: int = 4


def parse_infra(infra: str) -> tuple[str, str | None]:
    """``local`` -> (local, None); ``k8s/<context>`` -> (skypilot, context)."""
    if infra == "local":
        return "local", None
    kind, _, context = infra.partition("/")
    if kind in ("k8s", "kubernetes") and context:
        return "skypilot", context
    raise InvalidInput(
        f"--infra {infra!r} is neither 'local' nor 'k8s/<context>'",
        fix="--infra local  # or --infra k8s/<context>",
    )


def _cmd(*argv: str) -> str:
    return shlex.join(["npa", *argv])


class _Gates:
    def __init__(self) -> None:
        self.items: list[Gate] = []

    def add(self, name: str, status: GateStatus, detail: str, fix: str | None = None) -> None:
        self.items.append(Gate(name=name, status=status, detail=detail, fix=fix))

    @property
    def failed(self) -> list[Gate]:
        return [g for g in self.items if g.status in ("failed", "unknown")]


def _store_credentials(settings: ProjectSettings, store_uri: str) -> tuple[GateStatus, str]:
    """Whether boto3 can find credentials for an s3:// store (by source name, no value)."""
    if not store_uri.startswith("s3://"):
        return "not_applicable", "file store: no credentials needed"
    import boto3

    session = boto3.Session(profile_name=settings.value("profile"))
    creds = session.get_credentials()
    if creds is None:
        return "failed", "no S3 credentials found in the environment, profile or default chain"
    return "ok", f"credentials from {creds.method} (values never read by npa)"


def _run_gates(
    options: SubmitOptions,
    paths: NpaPaths,
    settings: ProjectSettings,
    backend_name: str,
    context: str | None,
) -> tuple[_Gates, dict[str, Any]]:
    """Run every gate; returns them with what later steps need (workflow, plan, images...)."""
    from npa.plan.infra import local_requirements
    from npa.plan.model import build_plan
    from npa.plan.quota import assess
    from npa.plan.quota_sources import LocalStoreSource
    from npa.runs.identity import load_record, read_spec_identity
    from npa.runs.selection import choose_run
    from npa.spec.validate import read_spec_text, validate_text

    gates = _Gates()
    facts: dict[str, Any] = {}
    spec = options.spec
    project = settings.project

    # --- the spec --------------------------------------------------------------------------
    workflow = None
    try:
        workflow, issues = validate_text(read_spec_text(spec))
    except NpaError as error:
        issues = []
        gates.add(
            "spec",
            "failed",
            error.message,
            _cmd("workbench", "workflow", "validate-spec", str(spec)),
        )
    if workflow is None and issues:
        first = "; ".join(f"{i.path or '<document>'}: {i.message}" for i in issues[:3])
        more = f" (+{len(issues) - 3} more)" if len(issues) > 3 else ""
        gates.add(
            "spec",
            "failed",
            f"{len(issues)} issues: {first}{more}",
            _cmd("workbench", "workflow", "validate-spec", str(spec)),
        )
    elif workflow is not None:
        gates.add("spec", "ok", f"workflow {workflow.metadata.name}, {len(workflow.stages)} stages")
    facts["workflow"] = workflow

    # --- the run's identity ----------------------------------------------------------------
    entry = None
    prepare = _cmd(
        "workbench", "workflow", "prepare-run", str(spec.resolve()), "--project", project
    )
    wanted = options.resume_run or options.run_id
    if wanted is None:
        gates.add(
            "run",
            "failed",
            "no run named: submit never picks a run; pass --run-id from prepare-run, or "
            "--resume-run to continue one",
            f'RUN_ID="$({prepare})"',
        )
    else:
        try:
            workflow_name, spec_sha256 = read_spec_identity(spec)
            record = load_record(paths, project, settings.identity, workflow_name)
            entry, warnings = choose_run(
                record,
                wanted,
                spec_sha256=spec_sha256,
                interactive=False,
                prepare_command=prepare,
            )
            facts["spec_sha256"] = spec_sha256
            gates.add(
                "run",
                "ok",
                f"run {entry.run_id} reserved {entry.reserved_at}"
                + (f"; {warnings[0]}" if warnings else ""),
            )
        except NpaError as error:
            gates.add("run", "failed", error.message, error.fix or f'RUN_ID="$({prepare})"')
    facts["entry"] = entry

    # --- the store -------------------------------------------------------------------------
    store_uri = normalize_store_uri(settings.value("store") or "local", paths)
    facts["store_uri"] = store_uri
    show = _cmd("configure", "--show", "--project", project)
    if entry is not None and entry.store != store_uri:
        gates.add(
            "store",
            "failed",
            f"run {entry.run_id} was reserved in {entry.store}, but project {project} now "
            f"resolves to {store_uri}",
            show,
        )
    status, detail = _store_credentials(settings, store_uri)
    if status == "failed":
        gates.add(
            "store-credentials",
            "failed",
            detail,
            f"npa configure --project {project} --profile PROFILE  # or export "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        )
    else:
        gates.add("store-credentials", status, detail)
    store: ObjectStore | None = None
    try:
        store = open_store(
            store_uri,
            endpoint_url=settings.value("endpoint_url"),
            region=settings.value("region"),
            profile=settings.value("profile"),
            fix_hint=show,
            paths=paths,
        )
        if status != "failed":
            name = workflow.metadata.name if workflow else "x"
            store.list_page(f"{name}/", page_size=1)
            gates.add("store", "ok", f"{store_uri} answered")
    except BucketAbsent as error:
        gates.add("store", "failed", error.message, error.fix)
    except StoreUnavailable as error:
        gates.add("store", "unknown", error.message, error.fix or show)
    except NpaError as error:
        gates.add("store", "failed", error.message, error.fix or show)
    facts["store"] = store

    # --- plan and quota --------------------------------------------------------------------
    if workflow is not None and entry is not None:
        plan = build_plan(workflow, entry.run_id, store_uri=store_uri)
        facts["plan"] = plan
        plan_cmd = _cmd("workbench", "workflow", "plan-spec", str(spec), "--run-id", entry.run_id)
        if backend_name == "local":
            quota = assess(local_requirements(workflow), [LocalStoreSource(paths.local_store)])
            if quota.verdict == "blocked":
                gates.add(
                    "quota",
                    "failed",
                    "the local disk cannot hold the run's outputs",
                    plan_cmd + " --target local",
                )
            elif quota.verdict == "blocked-unknown":
                gates.add(
                    "quota",
                    "unknown",
                    "; ".join(quota.problems) or "quota evidence unknown",
                    plan_cmd + " --target local",
                )
            else:
                gates.add("quota", "ok", f"{len(plan.stages)} stages planned; local disk ok")
        else:
            gates.add(
                "quota",
                "not_applicable",
                f"{len(plan.stages)} stages planned; the cluster exists already, so its disk "
                "quota was checked by provision-if-absent",
            )
    else:
        gates.add("quota", "skipped", "needs a valid spec and a reserved run")

    # --- the cluster -----------------------------------------------------------------------
    if backend_name == "skypilot":
        assert context is not None
        kubeconfig = paths.cluster_kubeconfig(context)
        facts["kubeconfig"] = kubeconfig
        if kubeconfig.is_file():
            gates.add("kubeconfig", "ok", f"{kubeconfig}")
        else:
            gates.add(
                "kubeconfig",
                "failed",
                f"no kubeconfig for context {context} at {kubeconfig}",
                _cmd(
                    "provision-if-absent",
                    "--project",
                    project,
                    "--target",
                    "kubernetes",
                    "--context",
                    context,
                    "--kubeconfig",
                    "PATH",
                ),
            )
        if kubeconfig.is_file():
            _namespace_gate(gates, kubeconfig, context, project)
        import importlib.util

        if importlib.util.find_spec("sky") is None:
            gates.add(
                "skypilot",
                "failed",
                "the SkyPilot SDK is not installed",
                "pip install 'skypilot[kubernetes]==0.14.1'",
            )
        else:
            gates.add("skypilot", "ok", "SkyPilot SDK importable")

    # --- images ----------------------------------------------------------------------------
    images: dict[str, str] = {}
    if workflow is not None:
        if backend_name == "local":
            images = {k: t.image for k, t in workflow.tools.items()}
            gates.add(
                "images",
                "not_applicable",
                "the local backend runs stages as host processes; no image is pulled",
            )
        elif not options.preflight_images:
            gates.add("images", "skipped", "--no-preflight-images: render needs pinned digests")
        else:
            from npa.services.images import preflight

            try:
                result = preflight(
                    spec,
                    project=project,
                    context=context,
                    image_overrides=list(options.image_overrides),
                    image=options.image,
                    registry_auth=list(options.registry_auth),
                    paths=paths,
                )
            except NpaError as error:
                gates.add("images", "failed", error.message, error.fix)
            else:
                for row in result.images:
                    if row.status == "ok":
                        continue
                    kind: GateStatus = (
                        "unknown" if row.status in ("unreachable", "unverified") else "failed"
                    )
                    gates.add(
                        f"image:{row.tool}",
                        kind,
                        f"{row.reference}: {row.status}: {row.detail}",
                        row.fix,
                    )
                if result.ok:
                    gates.add("images", "ok", f"{len(result.images)} images verified")
                images = dict(result.digests)
    facts["images"] = images
    return gates, facts


def _namespace_gate(gates: _Gates, kubeconfig: Path, context: str, project: str) -> None:
    """The project's namespace, where SkyPilot runs the job's pods, exists (read only)."""
    from npa.adapters.kube.client import REQUEST_TIMEOUT, core_api, project_namespace

    namespace = project_namespace(project)
    provision = _cmd(
        "provision-if-absent", "--project", project, "--target", "kubernetes", "--context", context
    )
    try:
        core_api(kubeconfig, context).read_namespace(namespace, _request_timeout=REQUEST_TIMEOUT)
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status == 404:
            gates.add("namespace", "failed", f"namespace {namespace} does not exist", provision)
        elif status == 403:
            gates.add(
                "namespace", "failed", f"not allowed to read namespace {namespace}", provision
            )
        else:
            gates.add(
                "namespace",
                "unknown",
                f"cannot read namespace {namespace}: {type(exc).__name__}",
                f"KUBECONFIG={kubeconfig} kubectl --context {context} get namespace {namespace}",
            )
        return
    gates.add("namespace", "ok", f"{namespace} (the job's pods run there)")


def _deliver_store_credentials(
    settings: ProjectSettings, store_uri: str, kubeconfig: Path, context: str
) -> None:
    """Put the store's credentials and endpoint into the project's store Secret, which every
    pod of the job takes as its environment; the values go from boto3 straight to the API."""
    from npa.adapters.kube.client import project_namespace
    from npa.adapters.kube.secrets import NoStoreCredentials, ensure_store_secret

    if not store_uri.startswith("s3://"):
        return
    namespace = project_namespace(settings.project)
    try:
        ensure_store_secret(
            kubeconfig,
            context,
            namespace,
            profile=settings.value("profile"),
            endpoint_url=settings.value("endpoint_url"),
            region=settings.value("region"),
        )
    except NoStoreCredentials as exc:
        raise NpaError(
            str(exc),
            fix=f"npa configure --project {settings.project} --profile PROFILE  # or export "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ) from None
    except Exception as exc:
        raise Unavailable(
            f"cannot write the store Secret in namespace {namespace}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            fix=f"KUBECONFIG={kubeconfig} kubectl --context {context} auth can-i create "
            f"secrets -n {namespace}  # then rerun the same submit",
        ) from None


def _accelerator_remap(
    workflow: Any, kubeconfig: Path, context: str, gates: _Gates
) -> dict[str, str]:
    from npa.launch.accelerators import cluster_names, node_labels, resolve
    from npa.spec.model import parse_accelerators

    wanted = sorted(
        {
            parsed[0]
            for s in workflow.stages
            if s.resources.accelerators and (parsed := parse_accelerators(s.resources.accelerators))
        }
    )
    if not wanted:
        return {}
    try:
        names = cluster_names(node_labels(kubeconfig, context))
    except Exception as exc:
        gates.add(
            "accelerators",
            "unknown",
            f"cannot read node labels: {type(exc).__name__}",
            f"KUBECONFIG={kubeconfig} kubectl --context {context} get nodes --show-labels",
        )
        return {}
    remap: dict[str, str] = {}
    for name in wanted:
        answer = resolve(name, names)
        if answer.resolved and answer.resolved != name:
            remap[name] = answer.resolved
        elif answer.resolved is None:
            gates.add(
                "accelerators",
                "failed",
                f"{name}: {answer.detail} (cluster GPU labels: {', '.join(names) or 'none'})",
                _cmd("workbench", "workflow", "gpus", "--cluster", context),
            )
    return remap


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _plan_resume(
    existing: RunManifest,
    backend: ExecutionBackend,
    store: ObjectStore,
    prefix: str,
    plan_json: dict[str, Any],
) -> ResumeRecord | None:
    """What ``--resume-run`` adopts from a run whose job ended without success; None when the
    job is still live or succeeded (then the launch transaction adopts that job as it is).

    A stage is adopted whole when all its waves succeeded and every declared output validates
    non-empty in the store; in the first stage that is not, the waves that succeeded are adopted
    under the same check; nothing after it is adopted (its inputs may change). The backend is
    asked by job id; if it cannot answer, nothing is relaunched.
    """
    from npa.services.artifacts import check_stage

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
    else:
        if not record.state.terminal or record.state is JobState.SUCCEEDED:
            return None
        previous = record.state.value
    adopted: list[str] = []
    waves: dict[str, list[int]] = {}
    for planned in plan_json["stages"]:
        name = planned["name"]
        rec = existing.stages.get(name)
        done = sorted(w.wave for w in (rec.waves if rec else []) if w.state == "SUCCEEDED")
        if not done:
            break
        valid = check_stage(store, prefix, planned, rec.state if rec else "PENDING").ok
        if not valid:
            break
        if len(done) == planned["waves"]["waves"] and rec is not None and rec.state == "SUCCEEDED":
            adopted.append(name)
            continue
        if backend.name == "local":  # SkyPilot runs a stage's task whole: no partial adoption
            waves[name] = done
        break
    attempt = len(existing.resumes) + 1
    return ResumeRecord(
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        attempt=attempt,
        previous_job_id=existing.job_id,
        previous_state=previous,
        adopted_stages=adopted,
        adopted_waves=waves,
        job_name=f"npa-{existing.workflow}-{existing.run_id}-r{attempt}",
    )


def submit(
    options: SubmitOptions,
    *,
    paths: NpaPaths | None = None,
    backend: ExecutionBackend | None = None,
    readiness: ReadinessProbe | None = None,
    observe: Observer | None = None,
) -> SubmitResult:
    """Gate, stage, render, record and launch one run."""
    from npa.services.runs import stage_run_source

    paths = paths or NpaPaths.from_env()
    if options.run_id and options.resume_run and options.run_id != options.resume_run:
        raise InvalidInput(
            "--run-id and --resume-run name different runs", fix="pass only one of them"
        )
    backend_name, context = parse_infra(options.infra)
    settings = resolve_project(options.project, paths=paths)
    project = settings.project
    gates, facts = _run_gates(options, paths, settings, backend_name, context)

    workflow = facts["workflow"]
    remap: dict[str, str] = {}
    kubeconfig: Path | None = facts.get("kubeconfig")
    if (
        backend_name == "skypilot"
        and options.resolve_accelerators
        and workflow is not None
        and kubeconfig is not None
        and kubeconfig.is_file()
        and context is not None
    ):
        remap = _accelerator_remap(workflow, kubeconfig, context, gates)
    if gates.failed:
        lines = [
            f"  - {g.name}: {g.detail}" + (f"\n      fix: {g.fix}" if g.fix else "")
            for g in gates.failed
        ]
        raise GatesFailed(
            f"submit stopped before staging anything: {len(gates.failed)} gate(s) did not "
            "pass\n" + "\n".join(lines),
            fix=gates.failed[0].fix,
            details={"gates": [g.model_dump(mode="json") for g in gates.items]},
        )

    entry = facts["entry"]
    plan = facts["plan"]
    store: ObjectStore = facts["store"]
    store_uri: str = facts["store_uri"]
    run_id: str = entry.run_id
    if backend is None:
        backend = open_backend(
            backend_name,
            paths,
            kubeconfig=str(kubeconfig) if kubeconfig else None,
            start_server=True,
        )

    # --- stage and render ------------------------------------------------------------------
    staged = stage_run_source(options.spec, project, run_id, None, interactive=False, paths=paths)
    context_model = TaskContext(
        workflow=workflow,
        plan=plan,
        images=facts["images"] if backend_name == "skypilot" else {},
        store=store_uri,
        kube_context=context,
        accelerators=remap,
    )
    task_texts = backend.render_tasks(context_model)
    if backend_name == "local":
        # The record keeps the images as declared; nothing pulls them locally.
        facts["images"] = {k: t.image for k, t in workflow.tools.items()}
    prefix = run_prefix(workflow.metadata.name, run_id)
    task_digests = {
        stage: hashlib.sha256(text.encode()).hexdigest() for stage, text in task_texts.items()
    }
    existing = read_manifest(store, prefix)
    if existing is not None and existing.job_id is not None and existing.tasks != task_digests:
        raise InvalidInput(
            f"run {run_id} was already launched (job {existing.job_id}) with different tasks; "
            "a launched run never changes",
            fix=f'RUN_ID="$(npa workbench workflow prepare-run {options.spec} --project '
            f'{project})"  # a new run for the changed spec',
        )
    plan_json = plan.model_dump(mode="json")
    store.put(
        f"{prefix}/plan.json", (json.dumps(plan_json, indent=2, sort_keys=True) + "\n").encode()
    )
    for stage, text in task_texts.items():
        store.put(f"{prefix}/tasks/{stage}{backend.task_suffix}", text.encode())

    resume: ResumeRecord | None = None
    if existing is not None and existing.job_id is not None and options.resume_run:
        resume = _plan_resume(existing, backend, store, prefix, plan_json)

    policy = Policy(
        startup_failure_threshold=options.startup_failure_threshold,
        max_infrastructure_recoveries=options.max_infrastructure_recoveries,
        retries=options.retries,
    )
    job_name = (
        existing.job_name if existing is not None else f"npa-{workflow.metadata.name}-{run_id}"
    )
    manifest_lock = paths.lock(f"manifest.{project}.{run_id}")
    if resume is not None:
        assert existing is not None
        job_name = resume.job_name
        adopted_stages, adopted_waves = resume.adopted_stages, resume.adopted_waves

        def resumed(m: RunManifest) -> None:
            m.resumes.append(resume)
            m.state, m.job_id, m.job_name = "LAUNCHING", None, resume.job_name
            for stage, rec in m.stages.items():
                if stage in adopted_stages:
                    continue
                keep = set(adopted_waves.get(stage, []))
                rec.waves = [w for w in rec.waves if w.wave in keep]
                rec.state, rec.ended_at, rec.classification, rec.detail = (
                    "PENDING",
                    None,
                    None,
                    None,
                )

        existing = update_manifest(store, prefix, manifest_lock, resumed)
    # Each resume is its own launch (its own job name and journal), so rerunning the same
    # resume adopts its job rather than launching another.
    attempt = len(existing.resumes) if existing is not None else 0
    launch_name = f"launch.{project}.{run_id}" + (f".r{attempt}" if attempt else "")
    if backend_name == "skypilot":  # a supervisor's relaunch (-a<N>) has its own journal
        from npa.backends.skypilot.supervisor import attempt_suffix

        launch_name += attempt_suffix(job_name)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    if existing is None:
        manifest = RunManifest(
            project=project,
            workflow=workflow.metadata.name,
            run_id=run_id,
            backend=backend.name,
            infra=options.infra,
            state="LAUNCHING",
            submitted_at=now,
            updated_at=now,
            store=store_uri,
            prefix=prefix,
            spec_sha256=facts["spec_sha256"],
            source_digest=staged.source_digest,
            plan_digest=_digest(plan_json),
            tasks=task_digests,
            images=facts["images"],
            accelerator_remap=remap,
            policy={
                "retries": options.retries,
                "startup_failure_threshold": options.startup_failure_threshold,
                "max_infrastructure_recoveries": options.max_infrastructure_recoveries,
                "resolve_accelerators": options.resolve_accelerators,
            },
            job_name=job_name,
        )
        write_manifest(store, manifest)
    else:
        manifest = existing
    receipt = Receipt(
        project=project,
        project_identity=settings.identity,
        workflow=workflow.metadata.name,
        run_id=run_id,
        submitted_at=now,
        store=store_uri,
        workflow_prefix=f"{store_uri}/{prefix}",
        endpoint_url=settings.value("endpoint_url"),
        region=settings.value("region"),
        profile=settings.value("profile"),
        credentials_source=settings.credentials,
        source_digest=staged.source_digest,
        plan_digest=manifest.plan_digest,
        job=JobIdentity(
            backend=backend.name, job_id=manifest.job_id and str(manifest.job_id), job_name=job_name
        ),
    )
    receipt_path = write_receipt(paths, receipt)

    # --- launch ----------------------------------------------------------------------------
    # The run's current job runs what its last resume left: also when this submit only adopts
    # that job, or completes a resume whose launch was interrupted (its journal decides).
    last_resume = manifest.resumes[-1] if manifest.resumes else None
    submission = JobSubmission(
        job_name=job_name,
        project=project,
        workflow=workflow.metadata.name,
        run_id=run_id,
        store=store_uri,
        endpoint_url=settings.value("endpoint_url"),
        region=settings.value("region"),
        profile=settings.value("profile"),
        prefix=prefix,
        order=plan.order,
        tasks=task_texts,
        retries=options.retries,
        startup_failure_threshold=options.startup_failure_threshold,
        max_infrastructure_recoveries=options.max_infrastructure_recoveries,
        max_parallel=options.max_parallel,
        kubeconfig=str(kubeconfig) if kubeconfig else None,
        kube_context=context,
        adopted_stages=last_resume.adopted_stages if last_resume else [],
        adopted_waves=last_resume.adopted_waves if last_resume else {},
    )
    if readiness is None and backend_name == "skypilot" and kubeconfig is not None:
        assert context is not None
        window = float(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW))
        interval = float(os.environ.get(INTERVAL_ENV, window / (DEFAULT_COUNT - 1)))
        readiness = ReadinessProbe(
            context=context,
            kubeconfig=kubeconfig,
            ask=kube_readyz(kubeconfig, context),
            window=window,
            interval=interval,
        )
    if backend_name == "skypilot" and kubeconfig is not None and context is not None:
        _deliver_store_credentials(settings, store_uri, kubeconfig, context)
    if observe is None and hasattr(getattr(backend, "service", None), "observe"):
        observe = backend.service.observe  # type: ignore[attr-defined]
    supervisor = manifest.supervisor.model_copy(deep=True)
    transaction = Transaction(
        backend,
        submission,
        journal=OperationJournal(paths, launch_name),
        lock_path=paths.lock(launch_name),
        readiness=readiness,
        policy=policy,
        supervisor=supervisor,
        observe=observe,
    )
    try:
        record = transaction.run()
    except LaunchStopped as stopped:
        final_state = stopped.state.value

        def stop(m: RunManifest) -> None:
            m.state = final_state
            m.supervisor = supervisor
            m.launch_transaction = transaction.record.model_dump(mode="json")

        update_manifest(store, prefix, manifest_lock, stop)
        stopped.details["launch_transaction"] = transaction.record.model_dump(mode="json")
        raise
    job_id = record.job_id
    assert job_id is not None
    receipt.job = JobIdentity(backend=backend.name, job_id=str(job_id), job_name=job_name)
    write_receipt(paths, receipt)

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

    update_manifest(store, prefix, manifest_lock, launched)
    if backend_name == "skypilot":  # watch the job from now on (or keep the live watcher)
        from npa.backends.skypilot.supervisor import ensure_supervisor

        ensure_supervisor(paths, submission, launch_name=launch_name, readiness=readiness)
    status = _cmd("workbench", "workflow", "status", run_id, "--project", project)
    return SubmitResult(
        project=project,
        workflow=workflow.metadata.name,
        run_id=run_id,
        infra=options.infra,
        backend=backend.name,
        job_name=job_name,
        job_id=job_id,
        outcome=record.outcome or "launched",
        gates=gates.items,
        source_digest=staged.source_digest,
        run_prefix=f"{store_uri}/{prefix}",
        manifest=f"{store_uri}/{prefix}/manifest.json",
        receipt=str(receipt_path),
        tasks={s: f"{store_uri}/{prefix}/tasks/{s}{backend.task_suffix}" for s in task_texts},
        images=facts["images"],
        accelerator_remap=remap,
        launch_transaction=record.model_dump(mode="json"),
        resume=resume,
        next=[status + " --watch"],
    )
