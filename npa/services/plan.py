"""plan-spec: the plan of a run and the quota gate, before anything is created."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npa.core.collector import collector_paused
from npa.core.commands import npa_command
from npa.core.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, InvalidInput
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.targets import Target
from npa.core.text import gib_text, number, plural
from npa.plan.evidence import StackState, StateReader
from npa.plan.infra import (
    GIB,
)
from npa.plan.model import WorkflowPlan, build_plan
from npa.plan.quota import (
    ExistingCheck,
    PulumiOutputRef,
    QuotaAssessment,
    QuotaLine,
    QuotaSource,
    assess,
)
from npa.spec.validate import load_workflow
from npa.targets import base as targets
from npa.targets import target_for
from npa.targets.base import AsksQuotaApi, ExistingCluster, MeasuresLocalDisk, QuotaApiAsk

PLAN_COMMAND = ("workbench", "workflow", "plan-spec")


class PlanResult(Result):
    """The plan of one run and its quota verdict."""

    spec: str
    target: Target
    store: str | None = None  # the local target's store, whose disk the quota measures
    plan: WorkflowPlan
    quota: QuotaAssessment
    store_source: str = "storage.uri"  # reservation | storage.uri | none: what names the prefix
    # Why the quota was not checked, when the target has none to check (kubernetes).
    quota_note: str | None = None

    def exit_code(self) -> int:
        return {"blocked": EXIT_FAILURE, "blocked-unknown": EXIT_UNAVAILABLE}.get(
            self.quota.verdict, 0
        )

    def text_lines(self) -> list[str]:
        p = self.plan
        lines = [
            f"plan: workflow {p.workflow}, run {p.run_id}, target {self.target}",
            f"run prefix: {p.run_prefix or '(not reserved, and no storage.uri in the spec)'}"
            + (f" ({self.store_source})" if p.run_prefix else ""),
            "",
            "stages (in order):",
        ]
        for s in p.stages:
            gpu = (
                f"{s.resources.accelerator}:{s.resources.accelerator_count}"
                if s.resources.accelerator
                else "no GPU"
            )
            res = [gpu]
            if s.resources.cpus is not None:
                res.append(f"{s.resources.cpus:g} CPU")
            if s.resources.memory_gib is not None:
                res.append(f"{s.resources.memory_gib:g} GiB RAM")
            if s.resources.disk_gib is not None:
                res.append(f"{s.resources.disk_gib} GiB disk")
            after = f" after {', '.join(s.depends_on)}" if s.depends_on else ""
            lines.append(
                f"  {s.level}. {s.name} [{s.tool}]{after}: {plural(s.waves.shards, 'shard')}, "
                f"{number(s.waves.parallel)} at once = {plural(s.waves.waves, 'wave')}; "
                f"{', '.join(res)}; retries {s.retries}"
            )
            for o in s.outputs:
                lines.append(f"       out {o.name}: {o.uri or o.path}")
        lines += ["", "infrastructure needed:"]
        if isinstance(target_for(self.target, PLAN_COMMAND), ExistingCluster):
            lines.append("  no disks: the cluster exists (provisioning adds a namespace and RBAC)")
        for d in p.disks:
            lines.append(
                f"  {d.role}: {number(d.count)} x {number(d.size_gib)} GiB {d.disk_type.value} "
                f"({plural(d.count * d.size_gib * GIB, 'byte')})"
            )
        return lines + self._quota_lines()

    def _quota_lines(self) -> list[str]:
        q = self.quota
        if self.quota_note:
            return ["", f"quota: {q.verdict.upper()}: {self.quota_note}"]
        scope = f"region {q.scope.region}" if q.scope.region else "the local store's disk"
        if q.scope.project:
            scope += f", project {q.scope.project}"
        if self.store:
            scope += f" ({self.store})"
        lines = [
            "",
            f"quota: {q.verdict.upper()} for {scope} (sources: {', '.join(q.sources) or 'none'})",
        ]
        for line in q.lines:
            lines.append("  " + _quota_text(line))
            lines += [f"      not counted: {why}" for why in line.not_counted]
        lines += existing_text(q.existing)
        for problem in q.problems:
            lines.append(f"  unknown: {problem}")
        if q.fix:
            lines.append(f"  fix: {q.fix}")
        return lines


def existing_text(checks: Sequence[ExistingCheck]) -> list[str]:
    """One line per existing-resource claim: what it claims and what its proof showed."""
    lines = []
    for check in checks:
        claim = check.disk
        lines.append(
            f"  existing {claim.role}: {claim.count} x {claim.size_gib} GiB "
            f"{claim.disk_type.value}: {check.status}: {check.detail}"
        )
    return lines


def _quota_text(line: QuotaLine) -> str:
    def fig(value: int | None, gib: int | None) -> str:
        if value is None or line.unit == "bytes":
            return gib_text(value, gib)
        return number(value)

    available = "unlimited" if line.unlimited else fig(line.available, line.available_gib)
    text = (
        f"{line.name}: {line.verdict}: required {fig(line.required, line.required_gib)}"
        f", existing {fig(line.existing, line.existing_gib)}"
        f", new {fig(line.required_new, line.required_new_gib)}"
        f", available {available}"
        f", shortfall {fig(line.shortfall, line.shortfall_gib)}"
    )
    return text


@dataclass
class QuotaOptions:
    """Where the quota evidence comes from for one plan-spec call."""

    quota_files: Sequence[Path] = ()
    existing_file: Path | None = None
    quota_api: QuotaApiAsk = field(default_factory=QuotaApiAsk)
    local: bool = False
    skip: bool = False
    project: str | None = None  # the npa project whose store the local target measures
    extra_sources: list[QuotaSource] = field(default_factory=list)


def pulumi_state(paths: NpaPaths) -> StateReader:
    """Reads the state of the stack a proof cites, from the backend the proof names or npa's
    own (``file://$NPA_HOME/pulumi``); a ``file://`` backend without starting pulumi."""

    def read(ref: PulumiOutputRef) -> StackState | None:
        from npa.adapters.infra.runner import Backend, read_stack_state
        from npa.plan.evidence import state_from_deployment

        url = ref.backend or f"file://{paths.pulumi_backend}"
        deployment = read_stack_state(Backend(url), ref.stack)
        return None if deployment is None else state_from_deployment(deployment)

    return read


def _refuse_cloud_quota(
    options: QuotaOptions, path: Path, run_id: str, target: ExistingCluster
) -> None:
    """A target that is a cluster that exists: cloud quota and disks proven to exist describe
    disks npa would create, which it does not there."""
    given = [
        flag
        for flag, value in (
            ("--quota-file", options.quota_files),
            ("--existing", options.existing_file),
            options.quota_api.flags()[0],  # the project: region and address alone ask nothing
        )
        if value
    ]
    if given:
        raise InvalidInput(
            target.cloud_evidence_refused(given),
            fix=plan_spec_command(path, run_id, target.name, options, evidence=False),
        )


def _quota_api(
    target: targets.Target, options: QuotaOptions, path: Path, run_id: str
) -> AsksQuotaApi | None:
    """The target as the quota API ``options`` ask, if it has one; a refusal when they name a
    project to ask and it has none."""
    if isinstance(target, AsksQuotaApi):
        return target
    if options.quota_api.project:
        from dataclasses import replace

        flag = options.quota_api.flags()[0][0]
        without = replace(options, quota_api=QuotaApiAsk())
        raise InvalidInput(
            f"{flag} names a cloud quota API; the {target.name} target has none to ask",
            fix=plan_spec_command(path, run_id, target.name, without),
        )
    return None


def _evidence_fix(path: Path, run_id: str, target: targets.Target, options: QuotaOptions) -> str:
    """The plan again with the target's quota API as evidence (the project of its cloud CLI's
    profile), or where that project is written when the profile names none."""
    from dataclasses import replace

    project = target.profile_project()
    if project is None:
        return f"{target.profile_hint} (offline: figures in a file, --quota-file)"
    again = replace(options, quota_api=replace(options.quota_api, project=project))
    return plan_spec_command(path, run_id, target.name, again)


def plan_spec_command(
    path: Path, run_id: str, target: str, options: QuotaOptions, *, evidence: bool = True
) -> str:
    """The plan-spec of ``path`` for ``target``, with the quota evidence ``options`` name (not
    with ``evidence`` False)."""
    argv = ["workbench", "workflow", "plan-spec", str(path), "--run-id", run_id]
    argv += ["--target", target]
    if evidence:
        argv += [a for f in options.quota_files for a in ("--quota-file", str(f))]
        argv += ["--existing", str(options.existing_file)] if options.existing_file else []
        for flag, value in options.quota_api.flags():
            argv += [flag, value] if value else []
        argv += ["--local-quota"] if options.local else []
    argv += ["--project", options.project] if options.project else []
    return npa_command(*argv)


@collector_paused()  # the validated workflow and its plan stay alive throughout
def plan_spec(
    path: Path,
    run_id: str,
    *,
    target: str,
    quota: QuotaOptions | None = None,
    project: str | None = None,
) -> PlanResult:
    """Plan a run and run the quota gate. Reads the spec and the evidence; writes nothing. The
    run prefix is the one ``prepare-run`` reserved the run under (what submit and status use),
    else the spec's ``storage.uri``."""
    from npa.adapters.storage import configured_store_uri
    from npa.plan.evidence import check_existing
    from npa.plan.quota_sources import load_existing, local_store_source, quota_sources
    from npa.services.configure import resolve_project
    from npa.services.runs import run_store

    options = quota or QuotaOptions()
    paths = NpaPaths.from_env()
    workflow = load_workflow(path)
    where = run_store(
        workflow.metadata.name,
        run_id,
        project=project,
        store_uri=None,
        spec_store=workflow.storage.uri if workflow.storage else None,
    )
    plan = build_plan(workflow, run_id, store_uri=where.store)
    chosen = target_for(target, PLAN_COMMAND)
    cluster = chosen if isinstance(chosen, ExistingCluster) else None
    if cluster is not None:
        _refuse_cloud_quota(options, path, run_id, cluster)
        # An existing cluster: npa creates no disks there, so no cloud quota applies.
        plan.disks = []
    needs = chosen.plan_needs(workflow.infrastructure)
    requirements = chosen.plan_requirements(needs, workflow)
    claims = load_existing(options.existing_file) if options.existing_file else []
    if claims and isinstance(chosen, MeasuresLocalDisk):
        raise InvalidInput(f"--existing describes cluster disks; the {target} target has none")
    infra = workflow.infrastructure
    asked = options.quota_api
    scope = chosen.plan_scope(infra, asked.region, asked.project)
    api = _quota_api(chosen, options, path, run_id)
    store: str | None = None
    local = None
    if isinstance(chosen, MeasuresLocalDisk) or options.local:
        settings = resolve_project(options.project, paths=paths)
        store = configured_store_uri(settings.value("store"), paths)
        local = local_store_source(store, paths.local_jobs)
    sources = quota_sources(
        options.quota_files,
        api=api.quota_api_source(asked, scope) if api else None,
        local=local,
        extra=options.extra_sources,
    )

    existing = check_existing(
        claims,
        scope,
        read_state=pulumi_state(paths),
        read_disk=api.disk_reader(asked) if api else None,
        origin=str(options.existing_file),
    )
    if options.skip or cluster is not None:
        assessment = QuotaAssessment(
            verdict="not-checked",
            lines=[],
            existing=existing,
            scope=scope,
            sources=[],
            problems=[],
        )
    else:
        assessment = assess(requirements, sources, needs=needs, existing=existing, scope=scope)
        if not sources:
            assessment.fix = _evidence_fix(path, run_id, chosen, options)
        else:
            # What raises a quota (a request to the cloud, space freed on a disk) is no npa
            # command: the fix is the plan that shows when it is enough.
            again = plan_spec_command(path, run_id, target, options)
            if assessment.verdict == "blocked":
                assessment.fix = f"{again}  # once the lines marked blocked have more quota"
            elif assessment.verdict == "blocked-unknown":
                assessment.fix = f"{again}  # once the unknown evidence listed above is resolved"
    note = cluster.plan_note(path, infra.context) if cluster is not None else None
    return PlanResult(
        spec=str(path),
        target=target,
        quota_note=note,
        store=store,
        plan=plan,
        quota=assessment,
        store_source=where.source,
    )
