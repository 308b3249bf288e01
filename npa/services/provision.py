"""provision-if-absent and teardown: npa's infrastructure as Pulumi stacks.

One order, every time: resolve the stacks of the target, recover what an interrupted run left
(stale locks, pending operations), run the quota gate, preview every stack, and only then, with
consent (``--yes`` or a yes on a terminal), apply. A second run with nothing changed previews
zero changes and applies nothing. Each step is recorded in the operation journal
(``operations/provision.<project>.<target>...jsonl``), whose first record holds the one command
that resumes the operation.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from npa.adapters.infra.changes import MUTATING, ResourceChange
from npa.adapters.infra.runner import (
    PROJECT,
    Backend,
    InfraRunner,
    Outcome,
    StackSpec,
    plugin_installed,
)
from npa.core.errors import (
    EXIT_FAILURE,
    EXIT_UNAVAILABLE,
    InvalidInput,
    LockBusy,
    NpaError,
    ToolMissing,
)
from npa.core.fsio import ensure_private_dir, exclusive_lock
from npa.core.output import Result
from npa.core.paths import NpaPaths, safe_component
from npa.plan.infra import (
    GIB,
    LOCAL_STORE_SIZE,
    QuotaRequirement,
    cluster_requirements,
    disk_needs,
    local_requirements,
)
from npa.plan.quota import ExistingDisk, QuotaAssessment, QuotaSource, assess
from npa.runs.journal import OperationJournal
from npa.services.configure import resolve_project
from npa.spec.model import Infrastructure

Target = Literal["local", "kubernetes", "nebius"]
TARGETS: tuple[str, ...] = ("local", "kubernetes", "nebius")
Mode = Literal["preview", "blocked", "no-changes", "not-applied", "applied"]

K8S_PLUGIN = ("resource", "kubernetes", "4.25.0-alpha.1768448096")
# The Nebius SDK is bridged from the Nebius Terraform provider through this plugin.
NEBIUS_PLUGINS = (("resource", "terraform-provider", "1.5.0"), ("resource", "aws", "7.51.1"))


# --- results ---------------------------------------------------------------------------------


class StackReport(BaseModel):
    """One stack: what the preview showed and what the apply did."""

    model_config = ConfigDict(extra="forbid")

    stack: str
    kind: str
    preview: list[ResourceChange] = []
    preview_summary: dict[str, int] = {}
    note: str | None = None
    recovery: list[str] = []
    applied: bool = False
    result_summary: dict[str, int] = {}
    outputs: dict[str, Any] = {}
    seconds: float | None = None

    def pending(self) -> list[ResourceChange]:
        return [c for c in self.preview if c.op in MUTATING]


class ProvisionResult(Result):
    """``npa provision-if-absent``: the quota verdict, each stack's preview, and the outcome."""

    project: str
    target: str
    backend_url: str
    mode: Mode
    quota: QuotaAssessment
    stacks: list[StackReport]
    kubeconfig: str | None = None
    export_line: str | None = None
    operation: str
    journal: str | None = None
    resume: str
    message: str

    def exit_code(self) -> int:
        if self.mode == "blocked":
            return EXIT_UNAVAILABLE if self.quota.verdict == "blocked-unknown" else EXIT_FAILURE
        return EXIT_FAILURE if self.mode == "not-applied" else 0

    def text_lines(self) -> list[str]:
        lines = [f"provision-if-absent: project {self.project}, target {self.target}"]
        lines.append(f"state backend: {self.backend_url}")
        lines += quota_text(self.quota)
        for report in self.stacks:
            lines += stack_text(report)
        lines.append(self.message)
        if self.export_line:
            lines.append(self.export_line)
        if self.mode in ("blocked", "not-applied"):
            lines.append(f"resume: {self.resume}")
        return lines


class TeardownResult(Result):
    """``npa teardown``: what was (or would be) destroyed, stack by stack."""

    project: str
    target: str
    backend_url: str
    mode: Literal["preview", "nothing", "not-applied", "destroyed"]
    stacks: list[StackReport]
    resume: str
    message: str

    def exit_code(self) -> int:
        return EXIT_FAILURE if self.mode == "not-applied" else 0

    def text_lines(self) -> list[str]:
        lines = [f"teardown: project {self.project}, target {self.target}"]
        lines.append(f"state backend: {self.backend_url}")
        for report in self.stacks:
            lines += stack_text(report, destroy=True)
        lines.append(self.message)
        return lines


def _gib(value: int | None) -> str:
    if value is None:
        return "unknown"
    whole = value // GIB
    exact = "" if value % GIB == 0 else "+"
    return f"{whole:,}{exact} GiB ({value:,} bytes)"


def quota_text(quota: QuotaAssessment) -> list[str]:
    """The quota gate as text: one line per quota with every figure in bytes and GiB."""
    lines = [f"quota gate: {quota.verdict} (sources: {', '.join(quota.sources) or 'none'})"]
    for line in quota.lines:

        def fig(value: int | None, unit: str = line.unit) -> str:
            if value is None:
                return "unknown"
            return _gib(value) if unit == "bytes" else f"{value:,}"

        available = "unlimited" if line.unlimited else fig(line.available)
        lines.append(
            f"  {line.name}: {line.verdict}: required {fig(line.required)}, existing "
            f"{fig(line.existing)}, new {fig(line.required_new)}, available {available}, "
            f"shortfall {fig(line.shortfall)}"
        )
    for disk in quota.existing:
        lines.append(
            f"  existing: {disk.count} x {disk.size_gib} GiB {disk.disk_type.value} "
            f"{disk.role} ({disk.evidence})"
        )
    lines += [f"  unknown: {p}" for p in quota.problems]
    if quota.fix:
        lines.append(f"  fix: {quota.fix}")
    return lines


_SIGN = {"create": "+", "update": "~", "replace": "+-", "delete": "-"}


def stack_text(report: StackReport, *, destroy: bool = False) -> list[str]:
    changes = report.pending()
    what = "destroy" if destroy else "preview"
    counts = ", ".join(f"{n} to {op}" for op, n in sorted(_counts(changes).items())) or (
        "no changes"
    )
    lines = [f"stack {report.stack} ({report.kind}) {what}: {counts}"]
    lines += [f"  recovered: {r}" for r in report.recovery]
    if report.note:
        lines.append(f"  note: {report.note}")
    for change in changes:
        lines.append(f"  {_SIGN.get(change.op, change.op)} {change.op} {change.type} {change.name}")
        for prop in change.properties:
            if prop.kind.startswith("add"):
                lines.append(f"      {prop.path}: {prop.new!r}")
            elif prop.kind.startswith("delete"):
                lines.append(f"      {prop.path}: {prop.old!r} -> (removed)")
            else:
                lines.append(f"      {prop.path}: {prop.old!r} -> {prop.new!r}")
            if prop.kind.endswith("replace"):
                lines[-1] += "  (forces replacement)"
    if report.applied:
        done = ", ".join(
            f"{n} {op}d" for op, n in sorted(report.result_summary.items()) if op in MUTATING
        )
        took = f" in {report.seconds:.1f}s" if report.seconds is not None else ""
        lines.append(f"  applied{took}: {done or 'nothing changed'}")
    return lines


def _counts(changes: Sequence[ResourceChange]) -> dict[str, int]:
    out: dict[str, int] = {}
    for change in changes:
        out[change.op] = out.get(change.op, 0) + 1
    return out


# --- requests --------------------------------------------------------------------------------


@dataclass
class ProvisionRequest:
    """Everything ``provision-if-absent`` was asked to do."""

    project: str | None
    target: str
    context: str | None = None
    kubeconfig: Path | None = None
    backend_url: str | None = None
    preview_only: bool = False
    yes: bool = False
    spec: Path | None = None
    quota_files: Sequence[Path] = ()
    nebius_project: str | None = None
    nebius_region: str | None = None
    nebius_endpoint: str | None = None
    extra_sources: list[QuotaSource] = field(default_factory=list)


@dataclass
class TeardownRequest:
    """Everything ``teardown`` was asked to do."""

    project: str | None
    target: str
    context: str | None = None
    backend_url: str | None = None
    preview_only: bool = False
    yes: bool = False


Confirm = Callable[[list[StackReport]], bool]


# --- names -----------------------------------------------------------------------------------


def stack_token(value: str) -> str:
    """A name usable inside a Pulumi stack name (letters, digits, ``-_.``); a short hash is
    added when characters had to be replaced, so two contexts never share a stack."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)
    if cleaned != value:
        cleaned += "-" + hashlib.sha256(value.encode()).hexdigest()[:6]
    return cleaned


def namespace_for(project: str) -> str:
    """The Kubernetes namespace of a project: ``npa-<project>`` as a DNS label."""
    from npa.adapters.kube.client import project_namespace

    return project_namespace(project)


@dataclass
class Layout:
    """The stacks of one project on one target, in apply order (teardown is the reverse)."""

    project: str
    target: str
    context: str | None
    stacks: list[StackSpec]
    operation: str


def _kubeconfig_source(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit.expanduser().resolve()
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0]).expanduser().resolve()
    return Path.home() / ".kube" / "config"


def _current_context(source: Path) -> str | None:
    import yaml

    try:
        data = yaml.safe_load(source.read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    current = data.get("current-context") if isinstance(data, dict) else None
    return str(current) if current else None


def _kubernetes_spec(
    paths: NpaPaths, project: str, context: str, *, source: Path | None, document: str | None
) -> StackSpec:
    config = {
        "npa:context": context,
        "npa:kubeconfigPath": str(paths.cluster_kubeconfig(context)),
        "npa:namespace": namespace_for(project),
        "npa:serviceAccount": "sky-sa",
    }
    if source is not None:
        config["npa:kubeconfigSource"] = str(source)
    if document is not None:
        config["npa:kubeconfigDocument"] = document
    return StackSpec(f"{project}.kubernetes.{stack_token(context)}", "kubernetes", config)


def _infrastructure(spec: Path | None) -> Infrastructure:
    if spec is None:
        return Infrastructure()
    from npa.spec.validate import load_workflow

    return load_workflow(spec).infrastructure


def layout(
    paths: NpaPaths,
    project: str,
    target: str,
    *,
    context: str | None,
    kubeconfig: Path | None,
    configured_context: str | None,
    infra: Infrastructure | None = None,
    nebius_project: str | None = None,
    nebius_region: str | None = None,
    need_source: bool = True,
) -> Layout:
    """The stacks a target consists of, and the operation id of provisioning it."""
    if target not in TARGETS:
        raise InvalidInput(
            f"--target {target!r} is not one of {', '.join(TARGETS)}",
            fix=f"npa provision-if-absent --project {project} --target local",
        )
    if target == "local":
        spec = StackSpec(
            f"{project}.local",
            "local",
            {
                "npa:storeDir": str(paths.local_store),
                "npa:executorDir": str(paths.local_jobs),
            },
        )
        return Layout(project, target, None, [spec], f"provision.{project}.local")
    if target == "kubernetes":
        source = _kubeconfig_source(kubeconfig) if need_source else None
        ctx = context or configured_context
        if ctx is None and source is not None:
            ctx = _current_context(source)
        if ctx is None:
            raise InvalidInput(
                "the kubernetes target needs a kube context",
                fix=f"npa provision-if-absent --project {project} --target kubernetes "
                "--context CONTEXT --kubeconfig PATH",
            )
        safe_component(ctx, "kube context")
        if source is not None:
            _check_context(source, ctx, project)
        spec = _kubernetes_spec(paths, project, ctx, source=source, document=None)
        op = f"provision.{project}.kubernetes.{stack_token(ctx)}"
        return Layout(project, target, ctx, [spec], op)
    infra = infra or Infrastructure()
    ctx = context or infra.context or f"nebius-{project}"
    safe_component(ctx, "kube context")
    cloud_config = nebius_config(infra, project, nebius_project, nebius_region)
    cloud = StackSpec(f"{project}.nebius", "nebius", {**cloud_config, "npa:context": ctx})
    cluster = _kubernetes_spec(paths, project, ctx, source=None, document="(from the nebius stack)")
    return Layout(project, target, ctx, [cloud, cluster], f"provision.{project}.nebius")


def nebius_config(
    infra: Infrastructure, project: str, parent_id: str | None, region: str | None
) -> dict[str, str]:
    """The nebius program's config: the cluster shape from the spec (or npa's defaults)."""
    return {
        "npa:project": project,
        "npa:parentId": parent_id or "",
        "npa:region": region or infra.region or "eu-north1",
        "npa:agentDiskGib": str(infra.agent.disk_gib),
        "npa:agentDiskType": infra.agent.disk_type.value,
        "npa:cpuNodeCount": str(infra.cpu_nodes.count),
        "npa:cpuDiskGib": str(infra.cpu_nodes.disk_gib),
        "npa:cpuDiskType": infra.cpu_nodes.disk_type.value,
        "npa:gpuNodeCount": str(infra.gpu_nodes.count),
        "npa:gpuDiskGib": str(infra.gpu_nodes.disk_gib),
        "npa:gpuDiskType": infra.gpu_nodes.disk_type.value,
    }


def _check_context(source: Path, context: str, project: str) -> None:
    from stacks.localfs import minimal_kubeconfig

    try:
        minimal_kubeconfig(str(source), context)
    except FileNotFoundError:
        raise InvalidInput(
            f"kubeconfig {source} does not exist",
            fix=f"npa provision-if-absent --project {project} --target kubernetes "
            f"--context {context} --kubeconfig PATH",
        ) from None
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise InvalidInput(
            f"cannot use context {context!r} of {source}: {exc}",
            fix=f"kubectl --kubeconfig {source} config get-contexts",
        ) from None


def _backend(paths: NpaPaths, url: str | None, *, create: bool) -> Backend:
    if url is None:
        if create:
            ensure_private_dir(paths.pulumi_backend)
        return Backend(f"file://{paths.pulumi_backend}")
    if not re.match(r"^(file|s3|gs|azblob)://", url):
        raise InvalidInput(
            f"--backend-url {url!r} is not a self-managed state backend (file://, s3://, gs://, "
            "azblob://); npa never uses a hosted service by default",
            fix="npa provision-if-absent ... --backend-url s3://BUCKET/pulumi",
        )
    backend = Backend(url)
    if create and backend.local_dir is not None:
        ensure_private_dir(backend.local_dir)
    return backend


def _resume_argv(req: ProvisionRequest, project: str, lay: Layout) -> list[str]:
    argv = ["npa", "provision-if-absent", "--project", project, "--target", lay.target]
    if lay.context and lay.target != "local":
        argv += ["--context", lay.context]
    if lay.target == "kubernetes":
        source = lay.stacks[0].config.get("npa:kubeconfigSource")
        if source:
            argv += ["--kubeconfig", source]
    if req.backend_url:
        argv += ["--backend-url", req.backend_url]
    if req.spec:
        argv += ["--spec", str(req.spec.resolve())]
    for quota_file in req.quota_files:
        argv += ["--quota-file", str(Path(quota_file).resolve())]
    if req.nebius_project:
        argv += ["--nebius-project", req.nebius_project]
    if req.nebius_region:
        argv += ["--nebius-region", req.nebius_region]
    if req.nebius_endpoint:
        argv += ["--nebius-endpoint", req.nebius_endpoint]
    return [*argv, "--yes"]


def _export_line(path: Path) -> str:
    home = Path.home()
    try:
        shown = "~/" + str(path.relative_to(home))
    except ValueError:
        shown = str(path)
    return f"export KUBECONFIG={shown}"


# --- quota -----------------------------------------------------------------------------------


def existing_disks(resources: Sequence[dict[str, Any]]) -> list[ExistingDisk]:
    """Disks the nebius stack's state proves exist: node-group boot disks and the agent disk."""
    from npa.spec.model import DiskType

    found: list[ExistingDisk] = []
    for resource in resources:
        outputs = resource.get("outputs") or {}
        urn = str(resource.get("urn", ""))
        name = urn.rsplit("::", 1)[-1]
        kind = str(resource.get("type", ""))
        if kind.endswith("mk8sV1NodeGroup:Mk8sV1NodeGroup") and name in ("cpu-nodes", "gpu-nodes"):
            disk = (outputs.get("template") or {}).get("bootDisk") or {}
            size = disk.get("sizeGibibytes")
            count = outputs.get("fixedNodeCount")
            if size and count:
                found.append(
                    ExistingDisk(
                        role="cpu_node" if name == "cpu-nodes" else "gpu_node",
                        disk_type=DiskType(disk.get("type", "NETWORK_SSD")),
                        size_gib=int(size),
                        count=int(count),
                        evidence=f"stack state {urn} (id {resource.get('id')})",
                    )
                )
        elif kind.endswith("computeV1Disk:ComputeV1Disk") and name == "agent-boot-disk":
            size = outputs.get("sizeGibibytes")
            if size:
                found.append(
                    ExistingDisk(
                        role="agent",
                        disk_type=DiskType(outputs.get("type", "NETWORK_SSD")),
                        size_gib=int(size),
                        evidence=f"stack state {urn} (id {resource.get('id')})",
                    )
                )
    return found


def quota_gate(
    req: ProvisionRequest,
    paths: NpaPaths,
    infra: Infrastructure,
    *,
    existing: Sequence[ExistingDisk] = (),
) -> QuotaAssessment:
    """The quota arithmetic of the target against its quota sources."""
    from npa.plan.quota_sources import FileQuotaSource, LocalStoreSource, NebiusQuotaSource

    sources: list[QuotaSource] = [FileQuotaSource(f) for f in req.quota_files]
    sources += req.extra_sources
    if req.target == "kubernetes":
        # An existing cluster: npa creates only namespaced objects and RBAC, which use no
        # disk or node quota.
        return QuotaAssessment(
            verdict="not-checked",
            lines=[],
            existing=[],
            sources=[],
            problems=[],
        )
    if req.target == "local":
        if req.spec is not None:
            from npa.spec.validate import load_workflow

            requirements = local_requirements(load_workflow(req.spec))
        else:
            requirements = [QuotaRequirement(name=LOCAL_STORE_SIZE, unit="bytes", required=0)]
        sources.append(LocalStoreSource(paths.local_store))
        return assess(requirements, sources)
    needs = disk_needs(infra)
    if req.nebius_project:
        region = req.nebius_region or infra.region
        if not region:
            raise InvalidInput(
                "--nebius-project needs the region of its quotas",
                fix="add --nebius-region eu-north1 (or set infrastructure.region in the spec)",
            )
        sources.append(NebiusQuotaSource(req.nebius_project, region, endpoint=req.nebius_endpoint))
    if not sources:
        return QuotaAssessment(
            verdict="blocked-unknown",
            lines=[],
            existing=list(existing),
            sources=[],
            problems=["no quota evidence: unknown is never permission to create"],
            fix="add --nebius-project <project-id> --nebius-region <region> "
            "(or --quota-file <quota.yaml> to review offline)",
        )
    return assess(cluster_requirements(needs), sources, needs=needs, existing=existing)


# --- provisioning ----------------------------------------------------------------------------


def _check_tools(target: str) -> None:
    missing = []
    if target in ("kubernetes", "nebius") and not plugin_installed(*K8S_PLUGIN):
        missing.append(K8S_PLUGIN)
    if target == "nebius":
        missing += [p for p in NEBIUS_PLUGINS if not plugin_installed(*p)]
    if missing:
        names = ", ".join(f"{k}-{n} v{v}" for k, n, v in missing)
        install = " && ".join(f"pulumi plugin install {k} {n} {v}" for k, n, v in missing)
        raise ToolMissing(
            f"the {target} target needs the pulumi plugin(s) {names}, which are not installed",
            fix="scripts/bootstrap-tools" if target == "kubernetes" else install,
        )


def _recover(
    runner: InfraRunner, spec: StackSpec, journal: OperationJournal | None, resume: str
) -> list[str]:
    """Make a stack safe to operate on after an interrupted run: remove locks whose process is
    gone, clear pending operations, and read every resource back. Live locks stop the run."""
    done: list[str] = []
    locks = runner.locks(spec.name)
    live = [lock for lock in locks if not lock.stale]
    if live:
        holder = ", ".join(f"pid {lock.pid} on {lock.hostname}" for lock in live)
        raise LockBusy(
            f"stack {spec.name} is being changed by another pulumi process ({holder})",
            fix=f"wait for it to finish, then rerun: {resume}",
        )
    if locks:
        runner.cancel(spec)
        done.append(
            "removed the stale lock of "
            + ", ".join(f"pid {lock.pid}" for lock in locks)
            + " (that process no longer runs)"
        )
    pending = runner.pending_operations(spec.name)
    if pending:
        runner.refresh(spec, clear_pending_creates=True)
        ops = ", ".join(
            f"{p.get('type')} {str(p.get('resource', {}).get('urn', '')).rsplit('::', 1)[-1]}"
            for p in pending
        )
        done.append(f"cleared {len(pending)} pending operation(s) ({ops}) and refreshed the state")
    if journal is not None and done:
        journal.append(f"recover:{spec.name}", "done", actions=done)
    return done


def _interrupted(journal: OperationJournal) -> set[str]:
    """Stacks whose last ``up`` or ``destroy`` began and never finished."""
    state: dict[str, str] = {}
    for record in journal.records():
        step = str(record.get("step", ""))
        if step.startswith(("up:", "destroy:")):
            state[step.split(":", 1)[1]] = str(record.get("status"))
    return {stack for stack, status in state.items() if status == "started"}


def _report(spec: StackSpec, outcome: Outcome) -> StackReport:
    return StackReport(
        stack=spec.name,
        kind=spec.kind,
        # Sorted so the same preview always reads the same (the engine works in parallel).
        preview=sorted(
            (c for c in outcome.changes if c.op not in ("refresh", "read")), key=lambda c: c.urn
        ),
        preview_summary={k: v for k, v in outcome.summary.items() if k not in ("refresh", "read")},
    )


def provision_if_absent(
    req: ProvisionRequest,
    *,
    interactive: bool = False,
    confirm: Confirm | None = None,
    paths: NpaPaths | None = None,
) -> ProvisionResult:
    """Quota gate, preview, and (with consent) apply every stack of the target."""
    paths = paths or NpaPaths.from_env()
    settings = resolve_project(req.project, paths=paths)
    project = settings.project
    infra = _infrastructure(req.spec) if req.target == "nebius" else Infrastructure()
    lay = layout(
        paths,
        project,
        req.target,
        context=req.context,
        kubeconfig=req.kubeconfig,
        configured_context=settings.value("context"),
        infra=infra,
        nebius_project=req.nebius_project,
        nebius_region=req.nebius_region,
    )
    resume = shlex.join(_resume_argv(req, project, lay))
    read_only = req.preview_only
    backend = _backend(paths, req.backend_url, create=not read_only)
    runner = InfraRunner(backend)

    if read_only:
        return _provision(req, paths, lay, runner, infra, resume, None, interactive, confirm)
    with exclusive_lock(
        paths.lock(f"provision.{project}"), timeout=0, purpose=f"provisioning project {project}"
    ):
        journal = OperationJournal(paths, lay.operation)
        resume = journal.begin(
            "provision-if-absent",
            shlex.split(resume),
            target=lay.target,
            backend=backend.url,
            stacks=[s.name for s in lay.stacks],
        )
        try:
            return _provision(req, paths, lay, runner, infra, resume, journal, interactive, confirm)
        except NpaError as error:
            journal.append("failed", "error", kind=error.kind, message=error.message[:500])
            if error.fix is None:
                error.fix = resume
            raise


def _provision(
    req: ProvisionRequest,
    paths: NpaPaths,
    lay: Layout,
    runner: InfraRunner,
    infra: Infrastructure,
    resume: str,
    journal: OperationJournal | None,
    interactive: bool,
    confirm: Confirm | None,
) -> ProvisionResult:
    project = lay.project
    reports: dict[str, StackReport] = {}

    def result(mode: Mode, quota: QuotaAssessment, message: str, **extra: Any) -> ProvisionResult:
        return ProvisionResult(
            project=project,
            target=lay.target,
            backend_url=runner.backend.url,
            mode=mode,
            quota=quota,
            stacks=[reports[s.name] for s in lay.stacks if s.name in reports],
            operation=lay.operation,
            journal=str(journal.path) if journal else None,
            resume=resume,
            message=message,
            **extra,
        )

    # 1. Recovery: what an interrupted run left must be made safe before anything else.
    recovery: dict[str, list[str]] = {}
    if journal is not None:
        interrupted = _interrupted(journal)
        for spec in lay.stacks:
            if runner.exists(spec.name):
                recovery[spec.name] = _recover(runner, spec, journal, resume)
                if spec.name in interrupted and not recovery[spec.name]:
                    recovery[spec.name].append(
                        "the previous run was interrupted; its state is read back before any change"
                    )

    # 2. Quota gate, with what the (refreshed) state proves exists deducted.
    existing: list[ExistingDisk] = []
    cloud = lay.stacks[0] if lay.target == "nebius" else None
    if cloud is not None and runner.exists(cloud.name):
        if journal is not None:
            runner.refresh(cloud)
        existing = existing_disks(runner.resources(cloud.name))
    quota = quota_gate(req, paths, infra, existing=existing)
    if journal is not None:
        journal.append("quota", quota.verdict, problems=quota.problems[:10])
    if quota.verdict in ("blocked", "blocked-unknown"):
        return result(
            "blocked",
            quota,
            f"quota gate {quota.verdict}: nothing was created or changed",
        )

    # 3. Tools, then a preview of every stack.
    _check_tools(lay.target)
    cluster_after_cloud = lay.target == "nebius"
    for index, spec in enumerate(lay.stacks):
        if cluster_after_cloud and index == 1:
            reports[spec.name] = StackReport(
                stack=spec.name,
                kind=spec.kind,
                note="previewed after the nebius stack exists: its kubeconfig comes from the "
                "new cluster",
            )
            continue
        outcome = runner.preview(spec, read_only=runner.backend.local_dir is not None)
        reports[spec.name] = _report(spec, outcome)
        reports[spec.name].recovery = recovery.get(spec.name, [])
    pending = [r for r in reports.values() if r.pending() or r.note]
    if journal is not None:
        journal.append(
            "preview",
            "done",
            changes={r.stack: _counts(r.pending()) for r in reports.values()},
        )

    kubeconfig = None
    if lay.context is not None:
        kubeconfig = paths.cluster_kubeconfig(lay.context)
    export = _export_line(kubeconfig) if kubeconfig is not None else None

    if req.preview_only:
        return result("preview", quota, "preview only (--preview): nothing was changed")
    if not pending:
        if journal is not None:
            journal.append("done", "no-changes")
        return result(
            "no-changes",
            quota,
            "everything already exists: zero changes, nothing applied",
            kubeconfig=str(kubeconfig) if kubeconfig else None,
            export_line=export,
        )
    if not req.yes:
        consent = interactive and confirm is not None and confirm(list(reports.values()))
        if not consent:
            if journal is not None:
                journal.append("confirm", "declined" if interactive else "no-consent")
            why = "not confirmed" if interactive else "no terminal to ask on and no --yes"
            return result(
                "not-applied", quota, f"nothing applied ({why}); to apply, rerun with --yes"
            )

    # 4. Apply, stack by stack, each step journaled before and after.
    assert journal is not None  # only --preview runs without one, and it returned above
    for index, spec in enumerate(lay.stacks):
        if cluster_after_cloud and index == 1:
            document = reports[lay.stacks[0].name].outputs.get("kubeconfig")
            if not document:
                raise NpaError(
                    "the nebius stack gave no kubeconfig output; the cluster stack cannot run",
                    fix=resume,
                )
            spec.config["npa:kubeconfigDocument"] = str(document)
            reports[spec.name] = _report(spec, runner.preview(spec, read_only=True))
        report = reports[spec.name]
        journal.append(f"up:{spec.name}", "started")
        started = time.monotonic()
        outcome = runner.up(spec)
        report.applied = True
        report.seconds = round(time.monotonic() - started, 2)
        report.result_summary = {
            k: v for k, v in outcome.summary.items() if k not in ("refresh", "read")
        }
        report.outputs = {k: v for k, v in outcome.outputs.items() if k != "kubeconfig"}
        if spec.kind == "nebius":
            report.outputs["kubeconfig"] = outcome.outputs.get("kubeconfig")
        journal.append(f"up:{spec.name}", "done", summary=report.result_summary)
    journal.append("done", "applied")
    return result(
        "applied",
        quota,
        "applied: the target's stacks are up to date",
        kubeconfig=str(kubeconfig) if kubeconfig else None,
        export_line=export,
    )


# --- teardown --------------------------------------------------------------------------------


def active_runs(paths: NpaPaths, project: str) -> list[str]:
    """Runs of the project that were submitted and are not proven finished.

    Each submitted run (a receipt with a job identity) is asked with ``status``; it counts as
    finished only on a trustworthy final state. A run whose state cannot be verified counts as
    active: teardown never gambles on an unknown.
    """
    from npa.runs.receipts import Receipt
    from npa.services.status import TERMINAL
    from npa.services.status import status as run_status

    directory = paths.submissions_dir / project
    if not directory.is_dir():
        return []
    runs = []
    for path in sorted(directory.glob("*.json")):
        try:
            receipt = Receipt.model_validate_json(path.read_text("utf-8"))
        except (OSError, ValueError):
            runs.append(path.stem)
            continue
        if receipt.job is None:
            continue
        try:
            answer = run_status(receipt.run_id, project, paths=paths)
        except NpaError:
            runs.append(receipt.run_id)
            continue
        if not (answer.trustworthy and answer.state in TERMINAL):
            runs.append(receipt.run_id)
    return runs


def teardown(
    req: TeardownRequest,
    *,
    interactive: bool = False,
    confirm: Confirm | None = None,
    paths: NpaPaths | None = None,
) -> TeardownResult:
    """Destroy the target's stacks in reverse order, after a preview and with consent."""
    paths = paths or NpaPaths.from_env()
    settings = resolve_project(req.project, paths=paths)
    project = settings.project
    lay = layout(
        paths,
        project,
        req.target,
        context=req.context,
        kubeconfig=None,
        configured_context=settings.value("context"),
        need_source=False,
    )
    if req.target == "kubernetes" and lay.context is None:
        raise InvalidInput("teardown of the kubernetes target needs --context")
    argv = ["npa", "teardown", "--project", project, "--target", req.target]
    if lay.context and req.target != "local":
        argv += ["--context", lay.context]
    if req.backend_url:
        argv += ["--backend-url", req.backend_url]
    resume = shlex.join([*argv, "--yes"])
    backend = _backend(paths, req.backend_url, create=False)
    runner = InfraRunner(backend)
    order = list(reversed(lay.stacks))

    def result(mode: Any, reports: list[StackReport], message: str) -> TeardownResult:
        return TeardownResult(
            project=project,
            target=req.target,
            backend_url=backend.url,
            mode=mode,
            stacks=reports,
            resume=resume,
            message=message,
        )

    present = [s for s in order if runner.exists(s.name)]
    reports = []
    for spec in present:
        outcome = runner.preview_destroy(spec)
        reports.append(StackReport(stack=spec.name, kind=spec.kind, preview=outcome.changes))
    if not present:
        return result("nothing", [], "no stack of this target exists: nothing to tear down")
    if req.preview_only:
        return result("preview", reports, "preview only (--preview): nothing was destroyed")

    runs = active_runs(paths, project)
    if runs:
        raise NpaError(
            f"project {project} has submitted runs that may still be active: {', '.join(runs)}; "
            "teardown would pull their infrastructure away",
            fix="; ".join(f"npa workbench workflow cancel {r} --project {project}" for r in runs)
            + f"; then: {resume}",
            details={"runs": runs},
        )
    if not req.yes:
        consent = interactive and confirm is not None and confirm(reports)
        if not consent:
            why = "not confirmed" if interactive else "no terminal to ask on and no --yes"
            return result("not-applied", reports, f"nothing destroyed ({why}); rerun with --yes")

    operation = f"teardown.{lay.operation.split('.', 1)[1]}"
    with exclusive_lock(
        paths.lock(f"provision.{project}"), timeout=0, purpose=f"tearing down project {project}"
    ):
        journal = OperationJournal(paths, operation)
        resume = journal.begin("teardown", shlex.split(resume), stacks=[s.name for s in present])
        by_name = {r.stack: r for r in reports}
        for spec in present:
            if spec.kind == "kubernetes" and "npa:kubeconfigSource" not in spec.config:
                # Destroy runs from state; the program's config only has to be well formed.
                spec.config["npa:kubeconfigDocument"] = "(unused by destroy)"
            report = by_name[spec.name]
            report.recovery = _recover(runner, spec, journal, resume)
            journal.append(f"destroy:{spec.name}", "started")
            started = time.monotonic()
            outcome = runner.destroy(spec)
            report.applied = True
            report.seconds = round(time.monotonic() - started, 2)
            report.result_summary = {k: v for k, v in outcome.summary.items() if k in MUTATING}
            journal.append(f"destroy:{spec.name}", "done", summary=report.result_summary)
        journal.append("done", "destroyed")
    return result("destroyed", reports, f"destroyed {len(present)} stack(s) of project {project}")


__all__ = [
    "PROJECT",
    "ProvisionRequest",
    "ProvisionResult",
    "TeardownRequest",
    "TeardownResult",
    "provision_if_absent",
    "teardown",
]
