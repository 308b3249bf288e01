"""Submit's gates: everything a launch needs, checked before anything is written.

Each gate is one function that checks one thing and adds its :class:`Gate` (name, status,
detail, the command that fixes it) to one list; what a gate establishes for the steps after it
(the workflow, the reserved run, the store, the plan, the verified images, the accelerator
names) is kept, typed, in :class:`Admission`. What a backend needs beyond npa's own gates comes
from its capabilities, never from its name. Every gate reads only (what the image gates
verified is written to the cache by :meth:`Admission.commit`, once all passed), and every gate
whose inputs can be read runs, whatever failed before it, so one list shows every failure.

    spec -> run -> store, store-credentials -> quota -> <backend prerequisites>
        -> image-overrides -> images (image:<tool> each) -> accelerators
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from npa.adapters.storage import (
    BucketAbsent,
    ObjectStore,
    StoreUnavailable,
    configured_store_uri,
    inspect_command,
    open_store,
)
from npa.backends.base import (
    ExecutionBackend,
    HasPrerequisites,
    PullsImagesHere,
    PullsPinnedImages,
    ResolvesAccelerators,
    RunsOnThisMachine,
)
from npa.core.commands import store_credentials_command
from npa.core.errors import GatesFailed, GatesUnknown, NpaError
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.services.configure import ProjectSettings

if TYPE_CHECKING:
    from npa.images.cache import VerificationCache
    from npa.plan.model import WorkflowPlan
    from npa.render.tasks import DigestFile
    from npa.runs.identity import RunEntry
    from npa.services.images import PreflightResult
    from npa.spec.model import Tool, Workflow

GateStatus = Literal["ok", "failed", "unknown", "skipped", "not_applicable"]


class Gate(BaseModel):
    """One gate's verdict."""

    name: str
    status: GateStatus
    detail: str
    fix: str | None = None


@dataclass
class Admission:
    """What the gates established, for the steps after them."""

    store_uri: str
    workflow: Workflow | None = None
    # The spec's tools, also when the spec as a whole is invalid but its tools are not: the
    # image gates still run then.
    tools: dict[str, Tool] | None = None
    spec_sha256: str | None = None
    entry: RunEntry | None = None
    store: ObjectStore | None = None
    plan: WorkflowPlan | None = None
    images: dict[str, str] = field(default_factory=dict)  # TOOL_REF -> image as recorded
    digests: DigestFile | None = None  # --digests, as read: what the tasks pin
    accelerators: dict[str, str] = field(default_factory=dict)  # spec name -> cluster name
    # What the image gates verified, written to the verification cache only once every gate
    # passed: a refused submit writes nothing.
    verifications: VerificationCache | None = None

    def commit(self) -> None:
        """Keep what the gates learned, now that the submit goes on."""
        if self.verifications is not None:
            self.verifications.commit()


@dataclass
class GateReport:
    """Every gate, in the order they ran, and what they established."""

    admission: Admission
    gates: list[Gate] = field(default_factory=list)

    def add(self, name: str, status: GateStatus, detail: str, fix: str | None = None) -> None:
        self.gates.append(Gate(name=name, status=status, detail=detail, fix=fix))

    @property
    def failed(self) -> list[Gate]:
        return [g for g in self.gates if g.status in ("failed", "unknown")]

    def raise_if_failed(self) -> None:
        """GatesFailed listing every gate that did not pass, each with its fix."""
        failed = self.failed
        if not failed:
            return
        lines = [
            f"  - {g.name}: {g.detail}" + (f"\n      fix: {g.fix}" if g.fix else "") for g in failed
        ]
        # Only sources that could not be asked: exit 4, as the same fault gives at any later step.
        error = GatesUnknown if all(g.status == "unknown" for g in failed) else GatesFailed
        raise error(
            f"submit stopped before staging anything: {plural(len(failed), 'gate')} did not "
            "pass\n" + "\n".join(lines),
            fix=failed[0].fix,
            details={"gates": [g.model_dump(mode="json") for g in self.gates]},
        )


@dataclass
class GateInput:
    """What submit was asked to do, as far as the gates need it."""

    spec: Path
    run: str | None  # --resume-run or --run-id
    preflight_images: bool = True
    resolve_accelerators: bool = True
    image_overrides: tuple[str, ...] = ()
    image: str | None = None
    registry_auth: tuple[str, ...] = ()
    digests: Path | None = None
    # This submit again, with the image overrides given (None: it cannot be written out).
    rerun: Callable[[tuple[str, ...]], str] | None = None


def _cmd(*argv: str) -> str:
    return shlex.join(["npa", *argv])


def run_gates(
    asked: GateInput, paths: NpaPaths, settings: ProjectSettings, backend: ExecutionBackend
) -> GateReport:
    """Run every gate in order; returns them with what later steps need."""
    store_uri = configured_store_uri(settings.value("store"), paths, settings.project)
    report = GateReport(Admission(store_uri=store_uri))
    spec_gate(report, asked.spec)
    run_gate(report, asked, paths, settings)
    store_gates(report, paths, settings)
    quota_gate(report, asked.spec, settings.project, paths, backend)
    prerequisite_gates(report, settings.project, backend)
    image_gates(report, asked, paths, settings.project, backend)
    if asked.resolve_accelerators:
        accelerator_gate(report, backend)
    return report


def spec_gate(report: GateReport, spec: Path) -> None:
    from npa.spec.validate import read_spec_text, validate_text

    fix = _cmd("workbench", "workflow", "validate-spec", str(spec))
    try:
        text = read_spec_text(spec)
        workflow, issues = validate_text(text)
    except NpaError as error:
        report.add("spec", "failed", error.message, fix)
        return
    if workflow is None and issues:
        first = "; ".join(f"{i.path or '<document>'}: {i.message}" for i in issues[:3])
        more = f" (+{len(issues) - 3} more)" if len(issues) > 3 else ""
        report.add("spec", "failed", f"{plural(len(issues), 'issue')}: {first}{more}", fix)
        report.admission.tools = _readable_tools(text)
    elif workflow is not None:
        detail = f"workflow {workflow.metadata.name}, {plural(len(workflow.stages), 'stage')}"
        report.add("spec", "ok", detail)
        report.admission.tools = dict(workflow.tools)
    report.admission.workflow = workflow


def _readable_tools(text: str) -> dict[str, Tool] | None:
    """The ``tools`` of a spec that is invalid elsewhere, when that section alone is valid."""
    from pydantic import TypeAdapter, ValidationError

    from npa.spec.loader import load_text
    from npa.spec.model import ToolMap

    doc, _ = load_text(text)
    data = doc.data if doc is not None else None
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, dict) or not tools:
        return None
    try:  # the very type a whole spec's tools have: the same names and images are accepted
        return dict(TypeAdapter(ToolMap).validate_python(tools))
    except ValidationError:
        return None


def run_gate(
    report: GateReport, asked: GateInput, paths: NpaPaths, settings: ProjectSettings
) -> None:
    from npa.runs.identity import load_record, read_spec_identity
    from npa.runs.selection import choose_run

    project = settings.project
    spec = asked.spec
    prepare = _cmd(
        "workbench", "workflow", "prepare-run", str(spec.resolve()), "--project", project
    )
    if asked.run is None:
        report.add(
            "run",
            "failed",
            "no run named: submit never picks a run; pass --run-id from prepare-run, or "
            "--resume-run to continue one",
            f'RUN_ID="$({prepare})"',
        )
        return
    try:
        workflow_name, spec_sha256 = read_spec_identity(spec)
        record = load_record(paths, project, settings.identity, workflow_name)
        entry, warnings = choose_run(
            record, asked.run, spec_sha256=spec_sha256, interactive=False, prepare_command=prepare
        )
    except NpaError as error:
        report.add("run", "failed", error.message, error.fix or f'RUN_ID="$({prepare})"')
        return
    report.admission.spec_sha256 = spec_sha256
    report.admission.entry = entry
    report.add(
        "run",
        "ok",
        f"run {entry.run_id} reserved {entry.reserved_at}"
        + (f"; {warnings[0]}" if warnings else ""),
    )


def _store_credentials(
    settings: ProjectSettings, store_uri: str
) -> tuple[GateStatus, str, str | None]:
    """Whether boto3 can find credentials for an s3:// store (by source name, no value), and
    when it cannot, the command that gives the project some."""
    if not store_uri.startswith("s3://"):
        return "not_applicable", "file store: no credentials needed", None
    import boto3

    profile = settings.value("profile")
    session = boto3.Session(profile_name=profile)
    creds = session.get_credentials()
    if creds is not None:
        return "ok", f"credentials from {creds.method} (values never read by npa)", None
    detail = "no S3 credentials found in the environment, profile or default chain"
    fix = store_credentials_command(settings.project, profile, session.available_profiles)
    return "failed", detail, fix


def store_gates(report: GateReport, paths: NpaPaths, settings: ProjectSettings) -> None:
    facts = report.admission
    project = settings.project
    store_uri = facts.store_uri
    show = _cmd("configure", "--show", "--project", project)
    entry = facts.entry
    if entry is not None and entry.store != store_uri:
        report.add(
            "store",
            "failed",
            f"run {entry.run_id} was reserved in {entry.store}, but project {project} now "
            f"resolves to {store_uri}",
            show,
        )
    status, detail, credentials_fix = _store_credentials(settings, store_uri)
    if status == "failed":
        report.add("store-credentials", "failed", detail, credentials_fix)
    else:
        report.add("store-credentials", status, detail)
    name = facts.workflow.metadata.name if facts.workflow else "x"
    probe = show
    try:
        store = open_store(
            store_uri,
            endpoint_url=settings.value("endpoint_url"),
            region=settings.value("region"),
            profile=settings.value("profile"),
            fix_hint=show,
            paths=paths,
        )
        facts.store = store
        # What shows whether the store answers now: the same listing, run by hand.
        probe = inspect_command(store, f"{name}/", listing=True)
        if status != "failed":
            store.list_page(f"{name}/", page_size=1)
            report.add("store", "ok", f"{store_uri} answered")
    except BucketAbsent as error:
        report.add("store", "failed", error.message, error.fix)
    except StoreUnavailable as error:
        report.add("store", "unknown", error.message, probe)
    except NpaError as error:
        report.add("store", "failed", error.message, error.fix or show)


def quota_gate(
    report: GateReport, spec: Path, project: str, paths: NpaPaths, backend: ExecutionBackend
) -> None:
    from npa.plan.model import build_plan

    facts = report.admission
    workflow, entry = facts.workflow, facts.entry
    if workflow is None:
        report.add("quota", "skipped", "needs a valid spec")
        return
    # The plan names the run; the disk it needs does not, so an unreserved run is no reason
    # to leave the quota unchecked.
    run_id = entry.run_id if entry is not None else None
    if run_id is not None:
        facts.plan = build_plan(workflow, run_id, store_uri=facts.store_uri)
    stages = plural(len(workflow.stages), "stage")
    if not isinstance(backend, RunsOnThisMachine):
        report.add(
            "quota",
            "not_applicable",
            f"{stages}; the cluster exists already and a run adds no disk of its own there, "
            "so there is no disk quota to check (provision-if-absent says not-checked too)",
        )
        return
    from npa.core.targets import MACHINE_TARGET
    from npa.plan.infra import local_requirements
    from npa.plan.quota import assess
    from npa.plan.quota_sources import local_store_source, quota_sources

    # plan-spec only reads: any run id plans the same disk.
    fix = _cmd("workbench", "workflow", "plan-spec", str(spec), "--run-id", run_id or "preview")
    fix += f" --target {MACHINE_TARGET} --project {shlex.quote(project)}"
    # The disks the run's data goes to: the configured store's, and the executor's.
    local = local_store_source(facts.store_uri, paths.local_jobs)
    quota = assess(local_requirements(workflow), quota_sources(local=local))
    if quota.verdict == "blocked":
        short = [
            f"{line.name} needs {line.required_gib} GiB, {line.available_gib} GiB free"
            for line in quota.lines
            if line.verdict == "blocked"
        ]
        detail = "the disk of the store or the local executor cannot hold the run's outputs"
        report.add("quota", "failed", f"{detail} ({'; '.join(short)})", fix)
    elif quota.verdict == "blocked-unknown":
        detail = "; ".join(quota.problems) or "quota evidence unknown"
        report.add("quota", "unknown", detail, fix)
    else:
        report.add("quota", "ok", f"{stages}; local disk ok")


def prerequisite_gates(report: GateReport, project: str, backend: ExecutionBackend) -> None:
    if not isinstance(backend, HasPrerequisites):
        return
    for need in backend.prerequisites(project):
        if need.ok:
            report.add(need.name, "ok", need.detail)
        else:
            report.add(need.name, "failed", need.detail, need.fix)


def _image_choice_gate(report: GateReport, asked: GateInput, tools: dict[str, Tool]) -> bool:
    """Whether --image-override/--image/--digests can be used with this spec. Checked on every
    backend: a choice the run cannot use is a mistake in the command line, whether or not this
    backend pulls images. Keeps the digests file as read."""
    if not (asked.image_overrides or asked.image or asked.digests):
        return True
    from npa.images.overrides import choose_images, parse_overrides
    from npa.render.tasks import chosen_workflow, load_digests

    facts = report.admission
    try:
        picked = parse_overrides(list(asked.image_overrides), tools, asked.rerun)
        choose_images({k: t.image for k, t in tools.items()}, picked, asked.image)
        facts.digests = load_digests(asked.digests) if asked.digests else None
        if facts.workflow is not None:
            chosen_workflow(facts.workflow, asked.image_overrides, asked.image, facts.digests)
    except NpaError as error:
        report.add("image-overrides", "failed", error.message, error.fix)
        return False
    return True


def image_gates(
    report: GateReport,
    asked: GateInput,
    paths: NpaPaths,
    project: str,
    backend: ExecutionBackend,
) -> None:
    tools = report.admission.tools
    if tools is None:
        report.add("images", "skipped", "needs a spec whose tools section is valid")
        return
    if not _image_choice_gate(report, asked, tools):
        report.add("images", "skipped", "needs a valid --image-override/--image/--digests")
        return
    if not isinstance(backend, PullsPinnedImages):
        # The record keeps the images as declared; nothing pulls them.
        report.admission.images = {k: t.image for k, t in tools.items()}
        report.add(
            "images",
            "not_applicable",
            f"the {backend.name} backend runs stages as host processes; no image is pulled",
        )
        return
    facts = report.admission
    if facts.workflow is not None:
        from npa.render.tasks import chosen_workflow

        # The images the tasks run, whether or not preflight verifies them: render's rule.
        facts.workflow = chosen_workflow(
            facts.workflow, asked.image_overrides, asked.image, facts.digests
        )
    if facts.digests is not None:
        _digest_pins_gate(report, asked, paths, project, backend)
        return
    if not asked.preflight_images:
        # Nothing is verified: the tasks pin the chosen images themselves, as render does with
        # the same flags, so each chosen image must carry its digest.
        report.add("images", "skipped", "--no-preflight-images: render needs pinned digests")
        return
    result = _preflight_gate(report, asked, paths, project, backend, tools, choose=True)
    if result is not None:
        report.admission.images = dict(result.digests)


def _digest_pins_gate(
    report: GateReport, asked: GateInput, paths: NpaPaths, project: str, backend: PullsPinnedImages
) -> None:
    """--digests: the tasks pin exactly what the file says (render's rule); preflight, unless
    turned off, verifies those pinned images and never replaces them by what a tag says now."""
    from npa.render.tasks import pinned_images

    facts = report.admission
    if facts.workflow is None:
        report.add("images", "skipped", "--digests needs a valid spec")
        return
    try:
        pins = pinned_images(facts.workflow, facts.digests)
    except NpaError as error:
        # Refused at rendering, with render's own words and exit code, before anything is written.
        report.add("images", "skipped", f"the tasks cannot be pinned: {error.message}")
        return
    facts.images = pins
    if not asked.preflight_images:
        report.add("images", "skipped", "--no-preflight-images: pinned as --digests says")
        return
    pinned_tools = {
        ref: tool.model_copy(update={"image": pins[ref]})
        for ref, tool in facts.workflow.tools.items()
        if ref in pins
    }
    _preflight_gate(report, asked, paths, project, backend, pinned_tools, choose=False)


def _preflight_gate(
    report: GateReport,
    asked: GateInput,
    paths: NpaPaths,
    project: str,
    backend: PullsPinnedImages,
    tools: dict[str, Tool],
    *,
    choose: bool,
) -> PreflightResult | None:
    """Verify ``tools``' images (after --image-override/--image when ``choose``); one gate per
    image that fails. The result, or None when preflight itself failed."""
    from npa.images.cache import VerificationCache
    from npa.services.images import preflight

    verifications = VerificationCache(paths, defer=True)
    report.admission.verifications = verifications
    try:
        result = preflight(
            asked.spec,
            project=project,
            context=backend.pull_context(),
            image_overrides=list(asked.image_overrides) if choose else [],
            image=asked.image if choose else None,
            registry_auth=list(asked.registry_auth),
            paths=paths,
            tools=tools,
            cache=verifications,
            contract=backend.verifies_contract,
        )
    except NpaError as error:
        report.add("images", "failed", error.message, error.fix)
        return None
    # A machine that runs the stages itself can also run them as host processes instead.
    here = (
        "; or run the stages as host processes: --runtime process"
        if isinstance(backend, PullsImagesHere)
        else ""
    )
    for row in result.images:
        if row.status == "ok":
            continue
        kind: GateStatus = "unknown" if row.status in ("unreachable", "unverified") else "failed"
        report.add(
            f"image:{row.tool}", kind, f"{row.reference}: {row.status}: {row.detail}{here}", row.fix
        )
    if result.ok:
        report.add("images", "ok", f"{plural(len(result.images), 'image')} verified")
    return result


def accelerator_gate(report: GateReport, backend: ExecutionBackend) -> None:
    """Rename the spec's accelerators to the names the cluster's nodes carry."""
    from npa.launch.accelerators import resolve
    from npa.spec.model import parse_accelerators

    workflow = report.admission.workflow
    if not isinstance(backend, ResolvesAccelerators) or workflow is None:
        return
    wanted = sorted(
        {
            parsed[0]
            for s in workflow.stages
            if s.resources.accelerators and (parsed := parse_accelerators(s.resources.accelerators))
        }
    )
    if not wanted or not backend.can_resolve_accelerators():
        return
    try:
        names = backend.accelerator_names()
    except Exception as exc:
        detail = f"cannot read node labels: {type(exc).__name__}"
        report.add("accelerators", "unknown", detail, backend.node_labels_fix())
        return
    for name in wanted:
        answer = resolve(name, names)
        if answer.resolved and answer.resolved != name:
            report.admission.accelerators[name] = answer.resolved
        elif answer.resolved is None:
            report.add(
                "accelerators",
                "failed",
                f"{name}: {answer.detail} (cluster GPU labels: {', '.join(names) or 'none'})",
                backend.gpus_fix(),
            )
