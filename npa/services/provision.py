"""provision-if-absent and teardown: npa's infrastructure as Pulumi stacks.

One order, every time: resolve the stacks of the target, recover what an interrupted run left
(stale locks, pending operations), run the quota gate, preview every stack, and only then, with
consent (``--yes`` or a yes on a terminal), apply. A second run with nothing changed previews
zero changes and applies nothing. Each step is recorded in the operation journal
(``operations/provision.<project>.<target>...jsonl``), whose first record holds the one command
that resumes the operation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from npa.adapters.infra.changes import MUTATING, ResourceChange
from npa.adapters.infra.progress import StepProgress
from npa.adapters.infra.runner import (
    PROJECT,
    Backend,
    InfraRunner,
    Outcome,
    StackLock,
    StackSpec,
    check_backend_url,
    is_service,
    plugin_installed,
    service_login_missing,
)
from npa.adapters.storage import normalize_store_uri
from npa.core.commands import kubectl_command, npa_command
from npa.core.errors import (
    EXIT_FAILURE,
    EXIT_UNAVAILABLE,
    InvalidInput,
    LockBusy,
    NpaError,
    ToolMissing,
    Unavailable,
    with_rerun,
)
from npa.core.fsio import ensure_private_dir, exclusive_lock
from npa.core.output import Result
from npa.core.paths import NpaPaths, check_context_name
from npa.core.targets import checked_target
from npa.core.text import clipped, gib_text, number, plural
from npa.plan.infra import (
    GIB,
    LOCAL_STORE_SIZE,
    QuotaRequirement,
    build_region,
    cluster_requirements,
    disk_needs,
    local_requirements,
)
from npa.plan.quota import (
    ExistingCheck,
    ExistingDisk,
    QuotaAssessment,
    QuotaScope,
    QuotaSource,
    assess,
)
from npa.runs.journal import OperationJournal
from npa.services.configure import ProjectSettings, load_config, redact, resolve_project
from npa.services.plan import existing_text
from npa.spec.model import Infrastructure

Mode = Literal["preview", "blocked", "unreachable", "no-changes", "not-applied", "applied"]

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
    previewed: bool = True  # False: nothing could be known (the API server was unusable)
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
    backend_origin: str = "default"
    mode: Mode
    quota: QuotaAssessment
    stacks: list[StackReport]
    kubeconfig: str | None = None
    export_line: str | None = None
    operation: str
    journal: str | None = None
    resume: str
    message: str
    notes: list[str] = Field(default_factory=list)
    fix: str | None = None  # what makes an unreachable target reachable again

    def exit_code(self) -> int:
        if self.mode == "blocked":
            return EXIT_UNAVAILABLE if self.quota.verdict == "blocked-unknown" else EXIT_FAILURE
        if self.mode == "unreachable":
            return EXIT_UNAVAILABLE
        return EXIT_FAILURE if self.mode == "not-applied" else 0

    def text_lines(self) -> list[str]:
        lines = [f"provision-if-absent: project {self.project}, target {self.target}"]
        lines.append(f"state backend: {self.backend_url} ({self.backend_origin})")
        lines += [f"note: {note}" for note in self.notes]
        lines += quota_text(self.quota)
        for report in self.stacks:
            lines += stack_text(report)
        lines.append(self.message)
        if self.export_line:
            lines.append(self.export_line)
        if self.fix:
            lines.append(f"fix: {self.fix}")
        if self.mode in ("blocked", "not-applied", "unreachable"):
            lines.append(f"resume: {self.resume}")
        return lines


class TeardownResult(Result):
    """``npa teardown``: what was (or would be) destroyed, stack by stack."""

    project: str
    target: str
    backend_url: str
    backend_origin: str = "default"
    mode: Literal["preview", "nothing", "not-applied", "destroyed"]
    stacks: list[StackReport]
    resume: str
    message: str

    def exit_code(self) -> int:
        return EXIT_FAILURE if self.mode == "not-applied" else 0

    def text_lines(self) -> list[str]:
        lines = [f"teardown: project {self.project}, target {self.target}"]
        lines.append(f"state backend: {self.backend_url} ({self.backend_origin})")
        for report in self.stacks:
            lines += stack_text(report, destroy=True)
        lines.append(self.message)
        return lines


def quota_text(quota: QuotaAssessment) -> list[str]:
    """The quota gate as text: one line per quota with every figure in bytes and GiB."""
    lines = [f"quota gate: {quota.verdict} (sources: {', '.join(quota.sources) or 'none'})"]
    for line in quota.lines:

        def fig(value: int | None, unit: str = line.unit) -> str:
            if value is None:
                return "unknown"
            return gib_text(value) if unit == "bytes" else f"{value:,}"

        available = "unlimited" if line.unlimited else fig(line.available)
        lines.append(
            f"  {line.name}: {line.verdict}: required {fig(line.required)}, existing "
            f"{fig(line.existing)}, new {fig(line.required_new)}, available {available}, "
            f"shortfall {fig(line.shortfall)}"
        )
    lines += existing_text(quota.existing)
    lines += [f"  unknown: {p}" for p in quota.problems]
    if quota.fix:
        lines.append(f"  fix: {quota.fix}")
    return lines


_SIGN = {"create": "+", "update": "~", "replace": "+-", "delete": "-"}


def stack_text(report: StackReport, *, destroy: bool = False) -> list[str]:
    changes = report.pending()
    what = "destroy" if destroy else "preview"
    counted = _count_text(changes) if report.previewed else "not known"
    lines = [f"stack {report.stack} ({report.kind}) {what}: {counted}"]
    lines += [f"  recovered: {r}" for r in report.recovery]
    if report.note:
        lines.append(f"  note: {report.note}")
    for change in changes:
        lines.append(f"  {_SIGN.get(change.op, change.op)} {change.op} {change.type} {change.name}")
        lines += [f"      {prop.text()}" for prop in change.properties]
    if report.applied:
        done = ", ".join(
            f"{number(n)} {op}d"
            for op, n in sorted(report.result_summary.items())
            if op in MUTATING
        )
        took = f" in {report.seconds:.1f}s" if report.seconds is not None else ""
        lines.append(f"  applied{took}: {done or 'nothing changed'}")
    return lines


def _count_text(changes: Sequence[ResourceChange]) -> str:
    counts = _counts(changes)
    return ", ".join(f"{number(n)} to {op}" for op, n in sorted(counts.items())) or "no changes"


def _stack_step(
    journal: OperationJournal,
    step: str,
    resume: str,
    progress: Progress | None,
    heading: str,
    run: Callable[..., Outcome],
) -> Outcome:
    """One ``up`` or ``destroy``: journaled before, streamed while it runs, and on failure
    journaled with what completed, the error's fix being the journal's resume command."""
    journal.append(step, "started")
    if progress is not None:
        progress(heading)
    try:
        return run(progress=_lines_to(progress))
    except NpaError as error:
        completed = error.details.get("completed", [])
        journal.append(step, "failed", completed=completed, message=clipped(error.message, 500))
        with_rerun(error, resume)  # a fix of its own (a passphrase, a plugin) comes first
        raise


def _lines_to(progress: Progress | None) -> Callable[[StepProgress], None] | None:
    """Engine step transitions as text lines for ``progress``."""
    if progress is None:
        return None
    sink = progress
    return lambda step: sink(step.text())


def _unreachable(lay: Layout) -> tuple[str, str] | None:
    """For an existing cluster (the kubernetes target): why its API server cannot be used, and
    the command that shows it; None when it answers ``/readyz`` with 200 and answers a read of
    the project's namespace itself (a server can be ready by ``/readyz`` and still answer every
    API request 503, and a preview against it would claim everything is to be created)."""
    from npa.adapters.kube.readyz import readyz_asker, serves

    if lay.target != "kubernetes" or lay.source is None or not lay.source.value:
        return None
    context, kubeconfig = str(lay.context), Path(lay.source.value)
    status, detail = readyz_asker(kubeconfig, context)()
    where = "/readyz"
    if status == 200:
        where = f"/api/v1/namespaces/{namespace_for(lay.project)}"
        status, detail = readyz_asker(kubeconfig, context, where)()
        if serves(status):
            return None
    said = f"answered HTTP {status}" if status is not None else "did not answer"
    fix = kubectl_command(lay.source.value, context, "get", "--raw", where)
    return f"the API server of context {context!r} {said} on {where} ({detail})", fix


def _after_locks(live: Sequence[StackLock], resume: str) -> str:
    """The resume command, run once the processes holding the stack's locks are gone: waited
    for with ``tail --pid`` when they run on this machine, else said in a comment."""
    import socket

    here = socket.gethostname()
    if all(lock.hostname == here and lock.pid for lock in live):
        waits = " && ".join(f"tail --pid={lock.pid} -f /dev/null" for lock in live)
        return f"{waits} && {resume}  # waits for the pulumi process holding the lock"
    return f"{resume}  # once the pulumi process holding the stack's lock has finished"


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
    progress: Progress | None = None  # gets a line per resource step while a stack applies


@dataclass
class TeardownRequest:
    """Everything ``teardown`` was asked to do."""

    project: str | None
    target: str
    context: str | None = None
    backend_url: str | None = None
    preview_only: bool = False
    yes: bool = False
    progress: Progress | None = None


Confirm = Callable[[list[StackReport]], bool]
Progress = Callable[[str], None]


# --- names -----------------------------------------------------------------------------------


def stack_token(value: str, limit: int = 64) -> str:
    """A name usable inside a Pulumi stack name (letters, digits, ``-_.``, at most ``limit``
    characters); a short hash is added when characters had to be replaced or cut, so two
    contexts never share a stack."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)
    if cleaned != value or len(cleaned) > limit:
        cleaned = cleaned[: limit - 7] + "-" + hashlib.sha256(value.encode()).hexdigest()[:6]
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
    source: KubeSource | None = None
    notes: list[str] = field(default_factory=list)


def _kubeconfig_source(paths: NpaPaths, explicit: Path | None, context: str | None) -> KubeSource:
    """The files the context is copied from, as kubectl would read them, without npa's own
    placed kubeconfig for the context: copying that file onto itself would say nothing."""
    from npa.adapters.kube import kubeconfig

    if explicit is not None and os.pathsep in str(explicit):
        files = [p.absolute() for p in kubeconfig.split_list(str(explicit))]
    else:
        files = kubeconfig.source_files(explicit)
    placed = paths.cluster_kubeconfig(context).absolute() if context else None
    kept = [f for f in files if placed is None or f != placed]
    return KubeSource(kubeconfig.join_list(kept), explicit is not None, len(kept) < len(files))


@dataclass(frozen=True)
class KubeSource:
    """Where a kubernetes target copies its context from."""

    value: str  # a path or a KUBECONFIG list; empty when only the placed file was named
    explicit: bool  # from --kubeconfig (else $KUBECONFIG or ~/.kube/config)
    dropped_placed: bool  # the list named npa's own placed kubeconfig, which was left out


def _current_context(source: str) -> str | None:
    from npa.adapters.kube import kubeconfig

    # A kubeconfig that cannot be read is its own error, never "no current context".
    return kubeconfig.merge(kubeconfig.split_list(source)).current_context


def _kubernetes_spec(
    paths: NpaPaths, project: str, context: str, *, source: str | None, document: str | None
) -> StackSpec:
    config = {
        "npa:context": context,
        "npa:kubeconfigPath": str(paths.cluster_kubeconfig(context)),
        "npa:namespace": namespace_for(project),
        "npa:serviceAccount": "sky-sa",
    }
    if source:
        config["npa:kubeconfigSource"] = source
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
    target = checked_target(target, ["provision-if-absent"], ["--project", project])
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
        ctx = context or configured_context
        if ctx is None and need_source:
            ctx = _current_context(_kubeconfig_source(paths, kubeconfig, None).value)
        if ctx is None:
            raise _no_context(paths, project, kubeconfig)
        check_context_name(ctx)
        source = _kubeconfig_source(paths, kubeconfig, ctx) if need_source else None
        if source is not None and source.value:
            _check_context(paths, source, ctx, project)
        spec = _kubernetes_spec(
            paths, project, ctx, source=source.value if source else None, document=None
        )
        op = f"provision.{project}.kubernetes.{stack_token(ctx)}"
        return Layout(project, target, ctx, [spec], op, source)
    infra = infra or Infrastructure()
    ctx = context or infra.context or f"nebius-{project}"
    check_context_name(ctx)
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
        "npa:region": build_region(infra, region),
        "npa:agentDiskGib": str(infra.agent.disk_gib),
        "npa:agentDiskType": infra.agent.disk_type.value,
        "npa:cpuNodeCount": str(infra.cpu_nodes.count),
        "npa:cpuDiskGib": str(infra.cpu_nodes.disk_gib),
        "npa:cpuDiskType": infra.cpu_nodes.disk_type.value,
        "npa:gpuNodeCount": str(infra.gpu_nodes.count),
        "npa:gpuDiskGib": str(infra.gpu_nodes.disk_gib),
        "npa:gpuDiskType": infra.gpu_nodes.disk_type.value,
    }


def _no_context(paths: NpaPaths, project: str, explicit: Path | None) -> InvalidInput:
    """No --context, none configured, and the kubeconfig sets no current context."""
    from npa.adapters.kube import kubeconfig

    source = _kubeconfig_source(paths, explicit, None).value
    names = sorted(kubeconfig.merge(kubeconfig.split_list(source)).contexts)
    known = f" ({source} has: {', '.join(names)})" if names else f" ({source} has none)"
    if len(names) == 1:
        fix = _command(
            "provision-if-absent", "--project", project, "--target", "kubernetes",
            "--context", names[0],
        )  # fmt: skip
    else:
        fix = f"KUBECONFIG={shlex.quote(source)} kubectl config get-contexts -o name"
    return InvalidInput(
        "the kubernetes target needs a kube context: pass --context, or set a current "
        f"context{known}",
        fix=fix,
    )


def _command(*argv: str) -> str:
    return shlex.join(["npa", *argv])


def _check_context(paths: NpaPaths, source: KubeSource, context: str, project: str) -> None:
    from npa.adapters.kube import kubeconfig

    try:
        kubeconfig.minimal_from(source.value, context)
    except kubeconfig.KubeconfigError as exc:
        fallback = kubeconfig.default_kubeconfig()
        retry = [
            "provision-if-absent", "--project", project, "--target", "kubernetes",
            "--context", context, "--kubeconfig", str(fallback),
        ]  # fmt: skip
        usable = source.value != str(fallback) and _defines(fallback, context)
        raise InvalidInput(
            f"cannot use context {context!r}: {exc}",
            fix=_command(*retry)
            if usable
            else f"KUBECONFIG={shlex.quote(source.value)} kubectl config get-contexts -o name",
        ) from None


def _defines(path: Path, context: str) -> bool:
    from npa.adapters.kube import kubeconfig

    try:
        return context in kubeconfig.merge([path]).contexts
    except kubeconfig.KubeconfigError:
        return False


def _backend(
    paths: NpaPaths,
    flag: str | None,
    settings: ProjectSettings,
    *,
    create: bool,
    argv: list[str],
) -> Backend:
    """The state backend and where the choice came from: ``--backend-url``, then
    ``$PULUMI_BACKEND_URL``, then the project's recorded backend (``npa configure
    --backend-url``), then ``file://`` under NPA_HOME. ``argv`` is the command being run, for
    the fix line of a refused URL."""
    default = f"file://{paths.pulumi_backend}"
    recorded = settings.settings["backend_url"]
    if flag is not None:
        url, origin = flag, "--backend-url"
    elif recorded.value is not None:
        # The unredacted value: settings show a redacted one.
        url = os.environ["PULUMI_BACKEND_URL"] if recorded.source == "env" else recorded.value
        origin = "$PULUMI_BACKEND_URL" if recorded.source == "env" else "npa configure"
        if recorded.source == "file":
            url = str(load_config(paths)["projects"][settings.project]["backend_url"])
    else:
        url, origin = default, "default"
    check_backend_url(url, fix_argv=[*argv, "--backend-url", default])
    backend = Backend(url, origin)
    if is_service(url) and service_login_missing(url):
        raise Unavailable(
            f"the Pulumi service {url} (from {origin}) needs a login: neither "
            "PULUMI_ACCESS_TOKEN nor a stored `pulumi login` token for it was found",
            fix=f"pulumi login {shlex.quote(url)}",
        )
    if create and backend.local_dir is not None:
        ensure_private_dir(backend.local_dir)
    return backend


def _source_notes(lay: Layout, runner: InfraRunner) -> list[str]:
    """When ``$KUBECONFIG`` names only the kubeconfig npa placed for the context (as npa's
    own ``export KUBECONFIG=...`` advice leads to), copy the context from the source the
    stack recorded instead, and say so."""
    source = lay.source
    if source is None or not source.dropped_placed:
        return []
    [spec] = lay.stacks
    placed = spec.config["npa:kubeconfigPath"]
    if source.value:
        return [f"{placed} (npa's own placed kubeconfig) is left out of the kubeconfig list"]
    recorded = next(
        (
            str((r.get("inputs") or {}).get("source") or "")
            for r in runner.resources(spec.name)
            if str(r.get("urn", "")).endswith("::kubeconfig")
        ),
        "",
    )
    if not recorded or recorded == placed:
        retry = [
            "provision-if-absent", "--project", lay.project, "--target", "kubernetes",
            "--context", str(lay.context), "--kubeconfig", str(Path.home() / ".kube" / "config"),
        ]  # fmt: skip
        raise InvalidInput(
            f"$KUBECONFIG names only {placed}, the kubeconfig npa placed for context "
            f"{lay.context!r}; npa copies that context from the kubeconfig it came from",
            fix=_command(*retry),
        )
    lay.source = KubeSource(recorded, explicit=True, dropped_placed=True)
    spec.config["npa:kubeconfigSource"] = recorded
    return [
        f"$KUBECONFIG names npa's placed kubeconfig {placed}; the context is copied from "
        f"{recorded}, the source the last apply recorded"
    ]


def _resume_argv(req: ProvisionRequest, project: str, lay: Layout, backend: Backend) -> list[str]:
    argv = ["npa", "provision-if-absent", "--project", project, "--target", lay.target]
    if lay.context and lay.target != "local":
        argv += ["--context", lay.context]
    if lay.target == "kubernetes":
        source = lay.stacks[0].config.get("npa:kubeconfigSource")
        if source:
            argv += ["--kubeconfig", source]
    if backend.origin in ("--backend-url", "$PULUMI_BACKEND_URL"):
        # The same backend on a resume, whatever the shell then exports.
        argv += ["--backend-url", backend.url]
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
        # ~ stays outside the quotes so the shell expands it.
        shown = "~/" + shlex.quote(str(path.relative_to(home)))
    except ValueError:
        shown = shlex.quote(str(path))
    return f"export KUBECONFIG={shown}"


# --- quota -----------------------------------------------------------------------------------


def existing_disks(
    stack: str, resources: Sequence[dict[str, Any]], backend: str | None = None
) -> list[ExistingCheck]:
    """The disks the nebius stack's (refreshed) state records: the node groups' boot disks and
    the agent's disk, each a claim citing its resource and checked by the same rule as
    ``plan-spec --existing`` (:func:`npa.plan.evidence.check_existing`)."""
    from npa.plan.evidence import StackState, check_existing, resource_record
    from npa.plan.quota import PulumiOutputProof, PulumiOutputRef

    claims = []
    for resource in resources:
        record = resource_record(resource)
        if record is None:
            continue
        (disks,) = record.disks
        assert disks.role is not None
        ref = PulumiOutputRef(stack=stack, resource=str(resource["urn"]), backend=backend)
        claims.append(
            ExistingDisk.model_validate(
                {
                    "role": disks.role,
                    "disk_type": disks.disk_type,
                    "size_gib": disks.size_bytes // GIB,
                    "count": disks.count,
                    "evidence": PulumiOutputProof(pulumi=ref),
                }
            )
        )
    state = StackState(outputs={}, resources=list(resources))
    return check_existing(
        claims, QuotaScope(), read_state=lambda _ref: state, origin=f"the state of stack {stack}"
    )


def nebius_profile_project(home: Path | None = None) -> str | None:
    """The project (``parent-id``) of the Nebius CLI's default profile, if it has one."""
    import yaml

    path = (home or Path.home()) / ".nebius" / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    profiles = config.get("profiles") if isinstance(config, dict) else None
    profile = profiles.get(config.get("default")) if isinstance(profiles, dict) else None
    parent = profile.get("parent-id") if isinstance(profile, dict) else None
    return str(parent) if parent else None


def _nebius_quota_fix(req: ProvisionRequest, infra: Infrastructure) -> str:
    """The same provisioning with the Nebius quota API as evidence: the project of the Nebius
    CLI's profile, the spec's region (or npa's default)."""
    project = req.nebius_project or nebius_profile_project()
    if project is None:
        return "cat ~/.nebius/config.yaml  # the parent-id of a profile is --nebius-project"
    argv = ["provision-if-absent", "--project", str(req.project or "default"), "--target"]
    argv += ["nebius", "--nebius-project", project]
    argv += ["--nebius-region", req.nebius_region or infra.region or "eu-north1"]
    if req.spec is not None:
        argv += ["--spec", str(req.spec)]
    return npa_command(*argv)


def quota_gate(
    req: ProvisionRequest,
    paths: NpaPaths,
    infra: Infrastructure,
    *,
    existing: Sequence[ExistingCheck] = (),
) -> QuotaAssessment:
    """The quota arithmetic of the target against its quota sources."""
    from npa.plan.quota_sources import local_store_source, quota_sources

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
        settings = resolve_project(req.project, paths=paths)
        store = normalize_store_uri(settings.value("store") or "local", paths)
        sources = quota_sources(
            req.quota_files,
            local=local_store_source(store, paths.local_jobs),
            extra=req.extra_sources,
        )
        return assess(requirements, sources)
    needs = disk_needs(infra)
    scope = QuotaScope(region=build_region(infra, req.nebius_region), project=req.nebius_project)
    nebius = None
    if req.nebius_project:
        assert scope.region is not None
        nebius = (req.nebius_project, scope.region, req.nebius_endpoint)
    sources = quota_sources(req.quota_files, nebius=nebius, extra=req.extra_sources)
    if not sources:
        return QuotaAssessment(
            verdict="blocked-unknown",
            lines=[],
            existing=list(existing),
            sources=[],
            problems=["no quota evidence: unknown is never permission to create"],
            fix=_nebius_quota_fix(req, infra),
        )
    return assess(cluster_requirements(needs), sources, needs=needs, existing=existing, scope=scope)


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
            f"the {target} target needs pulumi plugins that are not installed: {names}",
            fix=install,
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
            fix=_after_locks(live, resume),
        )
    if locks:
        runner.clear_stale_locks(spec, locks)
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
        done.append(
            f"cleared {plural(len(pending), 'pending operation')} ({ops}) and refreshed the state"
        )
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
    read_only = req.preview_only
    argv = ["provision-if-absent", "--project", project, "--target", lay.target]
    backend = _backend(paths, req.backend_url, settings, create=not read_only, argv=argv)
    runner = InfraRunner(backend)
    lay.notes = _source_notes(lay, runner)
    resume = shlex.join(_resume_argv(req, project, lay, backend))

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
            journal.append("failed", "error", kind=error.kind, message=clipped(error.message, 500))
            if error.fix is None:
                error.fix = resume
            raise


def _recover_all(
    lay: Layout, runner: InfraRunner, journal: OperationJournal | None, resume: str
) -> dict[str, list[str]]:
    """What an interrupted run left, made safe before anything else (per stack)."""
    recovery: dict[str, list[str]] = {}
    if journal is None:
        return recovery
    interrupted = _interrupted(journal)
    torn = runner.mend()
    for spec in lay.stacks:
        # A stack whose first up was killed before its checkpoint exists may still hold a lock.
        if runner.exists(spec.name) or runner.locks(spec.name):
            recovery[spec.name] = _recover(runner, spec, journal, resume)
            mine = [m for m in torn if _of_stack(m, spec.name)]
            if mine:
                recovery[spec.name].append(
                    "removed metadata files a killed pulumi left half-written: " + ", ".join(mine)
                )
            if spec.name in interrupted and not recovery[spec.name]:
                recovery[spec.name].append(
                    "the previous run was interrupted; its state is read back before any change"
                )
    return recovery


def _of_stack(path: str, stack: str) -> bool:
    """Whether a file of a ``file://`` backend belongs to the stack (its checkpoint, or a lock,
    backup or history entry in the stack's folder)."""
    parts = path.split("/")
    return stack in parts[:-1] or parts[-1].startswith(f"{stack}.json")


def _existing_cloud_disks(
    lay: Layout, runner: InfraRunner, journal: OperationJournal | None
) -> list[ExistingCheck]:
    """The disks the (refreshed) cloud stack's state proves exist."""
    cloud = lay.stacks[0] if lay.target == "nebius" else None
    if cloud is None or not runner.exists(cloud.name):
        return []
    if journal is not None:
        runner.refresh(cloud)
    return existing_disks(cloud.name, runner.resources(cloud.name), runner.backend.url)


def _preview_all(
    lay: Layout, runner: InfraRunner, recovery: dict[str, list[str]]
) -> dict[str, StackReport]:
    """A preview of every stack; the cluster after a cloud stack is previewed once that
    exists (its kubeconfig comes from the new cluster)."""
    reports: dict[str, StackReport] = {}
    for index, spec in enumerate(lay.stacks):
        if lay.target == "nebius" and index == 1:
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
        lay.notes += [f"pulumi warned ({spec.name}): {w}" for w in outcome.warnings]
    return reports


def _declined(
    req: ProvisionRequest,
    reports: dict[str, StackReport],
    journal: OperationJournal | None,
    interactive: bool,
    confirm: Confirm | None,
) -> str | None:
    """Why nothing is applied (no --yes and no consent), or None to go ahead."""
    if req.yes:
        return None
    if interactive and confirm is not None and confirm(list(reports.values())):
        return None
    if journal is not None:
        journal.append("confirm", "declined" if interactive else "no-consent")
    return "not confirmed" if interactive else "no terminal to ask on and no --yes"


def _apply_all(
    lay: Layout,
    runner: InfraRunner,
    reports: dict[str, StackReport],
    journal: OperationJournal,
    resume: str,
    progress: Progress | None,
) -> None:
    """Apply, stack by stack, each step journaled before and after and streamed while it runs."""
    for index, spec in enumerate(lay.stacks):
        if lay.target == "nebius" and index == 1:
            document = reports[lay.stacks[0].name].outputs.get("kubeconfig")
            if not document:
                raise NpaError(
                    "the nebius stack gave no kubeconfig output; the cluster stack cannot run",
                    fix=resume,
                )
            spec.config["npa:kubeconfigDocument"] = str(document)
            reports[spec.name] = _report(spec, runner.preview(spec, read_only=True))
        report = reports[spec.name]
        started = time.monotonic()
        outcome = _stack_step(
            journal,
            f"up:{spec.name}",
            resume,
            progress,
            f"applying stack {spec.name} ({_count_text(report.pending())})",
            functools.partial(runner.up, spec),
        )
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
            backend_url=redact(runner.backend.url) or "",
            backend_origin=runner.backend.origin,
            mode=mode,
            quota=quota,
            stacks=[reports[s.name] for s in lay.stacks if s.name in reports],
            operation=lay.operation,
            journal=str(journal.path) if journal else None,
            resume=resume,
            message=message,
            notes=lay.notes,
            **extra,
        )

    # 1. Recovery: what an interrupted run left must be made safe before anything else.
    recovery = _recover_all(lay, runner, journal, resume)

    # 2. Quota gate, with what the (refreshed) state proves exists deducted.
    existing = _existing_cloud_disks(lay, runner, journal)
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
    # An unusable API server is said first, and nothing is previewed against it: the engine
    # previews a cluster it cannot read as "everything to create".
    unreachable = _unreachable(lay)
    if unreachable is None:
        reports.update(_preview_all(lay, runner, recovery))
    else:
        reports.update({
            spec.name: StackReport(stack=spec.name, kind=spec.kind, previewed=False,
                                   note=f"not previewed: {unreachable[0]}")
            for spec in lay.stacks
        })  # fmt: skip
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
    placed = {
        "kubeconfig": str(kubeconfig) if kubeconfig else None,
        "export_line": export,
    }

    if unreachable is not None:
        # The engine previews an unreachable cluster as "everything to create"; no apply may
        # start from such a preview, --yes or not.
        why, fix = unreachable
        if journal is not None:
            journal.append("reachability", "unreachable", detail=clipped(why, 500))
        return result(
            "unreachable",
            quota,
            f"{why}: the preview cannot be trusted and nothing was applied or changed",
            fix=fix,
        )
    if req.preview_only:
        return result("preview", quota, "preview only (--preview): nothing was changed")
    if not pending:
        if journal is not None:
            journal.append("done", "no-changes")
        message = "everything already exists: zero changes, nothing applied"
        return result("no-changes", quota, message, **placed)
    declined = _declined(req, reports, journal, interactive, confirm)
    if declined is not None:
        message = f"nothing applied ({declined}); to apply, rerun with --yes"
        return result("not-applied", quota, message)

    # 4. Apply, stack by stack, each step journaled before and after.
    assert journal is not None  # only --preview runs without one, and it returned above
    _apply_all(lay, runner, reports, journal, resume, req.progress)
    return result("applied", quota, "applied: the target's stacks are up to date", **placed)


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


def _teardown_needs_context(paths: NpaPaths, argv: list[str]) -> InvalidInput:
    """The kubernetes teardown names no context: offer the contexts npa placed a kubeconfig
    for (their folder names reverse to the context names)."""
    from npa.core.paths import context_from_folder

    placed = sorted(
        name
        for folder in (paths.clusters_dir.iterdir() if paths.clusters_dir.is_dir() else [])
        if (name := context_from_folder(folder.name)) is not None
    )
    fixes = [npa_command(*argv, "--context", name) for name in placed]
    return InvalidInput(
        "teardown of the kubernetes target needs --context"
        + (f" (npa placed kubeconfigs for: {', '.join(placed)})" if placed else ""),
        fix="  or  ".join(fixes) if fixes else "kubectl config get-contexts -o name",
    )


def _teardown_resume(argv: list[str], backend: Backend) -> str:
    """The one command that resumes (or reruns) this teardown, on the same backend whatever
    the shell then exports."""
    if backend.origin in ("--backend-url", "$PULUMI_BACKEND_URL"):
        argv = [*argv, "--backend-url", backend.url]
    return npa_command(*argv, "--yes")


def _refuse_active_runs(paths: NpaPaths, project: str, resume: str) -> None:
    """Teardown never pulls infrastructure from under a run that may still be active."""
    runs = active_runs(paths, project)
    if runs:
        raise NpaError(
            f"project {project} has submitted runs that may still be active: {', '.join(runs)}; "
            "teardown would pull their infrastructure away",
            fix="; ".join(
                npa_command("workbench", "workflow", "cancel", r, "--project", project)
                for r in runs
            )
            + f"; then: {resume}",
            details={"runs": runs},
        )


def _destroy_all(
    runner: InfraRunner,
    present: list[StackSpec],
    reports: dict[str, StackReport],
    journal: OperationJournal,
    resume: str,
    progress: Progress | None,
) -> None:
    """Destroy each present stack (in the order given), each step journaled before and after
    and streamed while it runs."""
    for spec in present:
        if spec.kind == "kubernetes" and "npa:kubeconfigSource" not in spec.config:
            # Destroy runs from state; the program's config only has to be well formed.
            spec.config["npa:kubeconfigDocument"] = "(unused by destroy)"
        report = reports[spec.name]
        report.recovery = _recover(runner, spec, journal, resume)
        started = time.monotonic()
        outcome = _stack_step(
            journal,
            f"destroy:{spec.name}",
            resume,
            progress,
            f"destroying stack {spec.name} ({_count_text(report.pending())})",
            functools.partial(runner.destroy, spec),
        )
        report.applied = True
        report.seconds = round(time.monotonic() - started, 2)
        report.result_summary = {k: v for k, v in outcome.summary.items() if k in MUTATING}
        journal.append(f"destroy:{spec.name}", "done", summary=report.result_summary)


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
    argv = ["teardown", "--project", project, "--target", req.target]
    if req.target == "kubernetes" and not (req.context or settings.value("context")):
        raise _teardown_needs_context(paths, argv)
    lay = layout(
        paths,
        project,
        req.target,
        context=req.context,
        kubeconfig=None,
        configured_context=settings.value("context"),
        need_source=False,
    )
    if lay.context and req.target != "local":
        argv += ["--context", lay.context]
    backend = _backend(paths, req.backend_url, settings, create=False, argv=argv)
    resume = _teardown_resume(argv, backend)
    runner = InfraRunner(backend)
    order = list(reversed(lay.stacks))

    def result(mode: Any, reports: list[StackReport], message: str) -> TeardownResult:
        return TeardownResult(
            project=project,
            target=req.target,
            backend_url=redact(backend.url) or "",
            backend_origin=backend.origin,
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

    _refuse_active_runs(paths, project, resume)
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
        _destroy_all(runner, present, {r.stack: r for r in reports}, journal, resume, req.progress)
        journal.append("done", "destroyed")
    return result(
        "destroyed", reports, f"destroyed {plural(len(present), 'stack')} of project {project}"
    )


__all__ = [
    "PROJECT",
    "ProvisionRequest",
    "ProvisionResult",
    "TeardownRequest",
    "TeardownResult",
    "provision_if_absent",
    "teardown",
]
