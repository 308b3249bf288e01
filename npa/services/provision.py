"""provision-if-absent: npa's infrastructure as Pulumi stacks (teardown, its reverse, is in
``services/teardown.py``; what a target consists of is in ``npa/targets``).

One order, every time: resolve the stacks of the target, recover what an interrupted run left
(stale locks, pending operations), run the quota gate, preview every stack, and only then, with
consent (``--yes`` or a yes on a terminal), apply. A second run with nothing changed previews
zero changes and applies nothing. Each step is recorded in the operation journal
(``operations/provision.<project>.<target>...jsonl``), whose first record holds the one command
that resumes the operation.
"""

from __future__ import annotations

import functools
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from npa.adapters.infra.runner import PROJECT, Backend, InfraRunner, plugin_installed
from npa.adapters.storage import configured_store_uri
from npa.core.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, NpaError, ToolMissing
from npa.core.fsio import exclusive_lock
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import clipped
from npa.plan.quota import ExistingCheck, QuotaAssessment
from npa.runs.journal import OperationJournal
from npa.services.configure import choose_context, redact, resolve_project
from npa.services.stackops import (
    Confirm,
    StackReport,
    count_text,
    counts,
    interrupted,
    quota_text,
    recover,
    stack_report,
    stack_step,
    stack_text,
    state_backend,
)
from npa.services.stackops import after_locks as _after_locks
from npa.services.teardown import TeardownRequest, TeardownResult, active_runs, teardown
from npa.spec.model import Infrastructure
from npa.targets import layout, target_for
from npa.targets.base import (
    ChecksReachability,
    CopiesKubeconfig,
    ExistingCluster,
    Layout,
    LayoutAsk,
    MeasuresLocalDisk,
    Progress,
    ProvesExistingDisks,
    ProvisionRequest,
    Target,
    namespace_for,
    request_options,
    stack_token,
)

Mode = Literal["preview", "blocked", "unreachable", "no-changes", "not-applied", "applied"]
# Outputs a report leaves out (a kubeconfig holds credentials) unless a later stack reads them.
SECRET_OUTPUTS = {"kubeconfig"}


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


def _resume_argv(
    req: ProvisionRequest, project: str, target: Target, lay: Layout, backend: Backend
) -> list[str]:
    argv = ["npa", "provision-if-absent", "--project", project, "--target", lay.target]
    argv += target.resume_args(lay)
    if backend.origin in ("--backend-url", "$PULUMI_BACKEND_URL"):
        # The same backend on a resume, whatever the shell then exports.
        argv += ["--backend-url", backend.url]
    return [*argv, *request_options(req), "--yes"]


def _export_line(path: Path) -> str:
    home = Path.home()
    try:
        # ~ stays outside the quotes so the shell expands it.
        shown = "~/" + shlex.quote(str(path.relative_to(home)))
    except ValueError:
        shown = shlex.quote(str(path))
    return f"export KUBECONFIG={shown}"


def quota_gate(
    req: ProvisionRequest,
    paths: NpaPaths,
    infra: Infrastructure,
    *,
    existing: Sequence[ExistingCheck] = (),
) -> QuotaAssessment:
    """The quota arithmetic of the target against its quota sources."""
    target = target_for(req.target, project=req.project)
    store = None
    if isinstance(target, MeasuresLocalDisk):
        settings = resolve_project(req.project, paths=paths)
        store = configured_store_uri(settings.value("store"), paths)
    return target.quota_gate(
        req, infra, store=store, local_jobs=paths.local_jobs, existing=existing
    )


def _check_tools(target: Target) -> None:
    missing = [p for p in target.plugins if not plugin_installed(*p)]
    if missing:
        names = ", ".join(f"{k}-{n} v{v}" for k, n, v in missing)
        install = " && ".join(f"pulumi plugin install {k} {n} {v}" for k, n, v in missing)
        raise ToolMissing(
            f"the {target.name} target needs pulumi plugins that are not installed: {names}",
            fix=install,
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
    target = target_for(req.target, project=project)
    infra = target.infrastructure(req.spec)
    context = req.context
    if isinstance(target, ExistingCluster):
        chosen = choose_context(context, project=project, kubeconfig=req.kubeconfig, paths=paths)
        context = chosen.name if chosen else None
    ask = LayoutAsk(
        context=context,
        kubeconfig=req.kubeconfig,
        infra=infra,
        quota_api=req.quota_api,
    )
    lay = target.layout(paths, project, ask)
    read_only = req.preview_only
    argv = ["provision-if-absent", "--project", project, "--target", lay.target]
    backend = state_backend(paths, req.backend_url, settings, create=not read_only, argv=argv)
    runner = InfraRunner(backend)
    if isinstance(target, CopiesKubeconfig):
        lay.notes = target.source_notes(lay, runner)
    resume = shlex.join(_resume_argv(req, project, target, lay, backend))
    run = functools.partial(_provision, req, paths, target, lay, runner, infra)

    if read_only:
        return run(resume, None, interactive, confirm)
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
            return run(resume, journal, interactive, confirm)
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
    cut_short = interrupted(journal)
    torn = runner.mend()
    for spec in lay.stacks:
        # A stack whose first up was killed before its checkpoint exists may still hold a lock.
        if runner.exists(spec.name) or runner.locks(spec.name):
            recovery[spec.name] = recover(runner, spec, journal, resume)
            mine = [m for m in torn if _of_stack(m, spec.name)]
            if mine:
                recovery[spec.name].append(
                    "removed metadata files a killed pulumi left half-written: " + ", ".join(mine)
                )
            if spec.name in cut_short and not recovery[spec.name]:
                recovery[spec.name].append(
                    "the previous run was interrupted; its state is read back before any change"
                )
    return recovery


def _of_stack(path: str, stack: str) -> bool:
    """Whether a file of a ``file://`` backend belongs to the stack (its checkpoint, or a lock,
    backup or history entry in the stack's folder)."""
    parts = path.split("/")
    return stack in parts[:-1] or parts[-1].startswith(f"{stack}.json")


def _unreachable(target: Target, lay: Layout) -> tuple[str, str] | None:
    """Why the target's API server cannot be used (and the command that shows it), when the
    target checks that before a preview."""
    return target.unreachable(lay) if isinstance(target, ChecksReachability) else None


def _existing_disks(
    target: Target, lay: Layout, runner: InfraRunner, journal: OperationJournal | None
) -> list[ExistingCheck]:
    """The disks the target's (refreshed) state proves exist."""
    if not isinstance(target, ProvesExistingDisks):
        return []
    return target.existing(lay, runner, refresh=journal is not None)


def _preview_all(
    lay: Layout, runner: InfraRunner, recovery: dict[str, list[str]]
) -> dict[str, StackReport]:
    """A preview of every stack; a stack that reads an earlier one's output (a cluster's
    kubeconfig from the cloud stack that makes it) is previewed once that one exists."""
    reports: dict[str, StackReport] = {}
    for spec in lay.stacks:
        needs = lay.input_of(spec.name)
        if needs is not None:
            reports[spec.name] = StackReport(stack=spec.name, kind=spec.kind, note=needs.wait_note)
            continue
        outcome = runner.preview(spec, read_only=runner.backend.local_dir is not None)
        reports[spec.name] = stack_report(spec, outcome)
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
    for spec in lay.stacks:
        needs = lay.input_of(spec.name)
        if needs is not None:
            value = reports[needs.source].outputs.get(needs.output)
            if not value:
                raise NpaError(needs.missing, fix=resume)
            spec.config[needs.config_key] = str(value)
            reports[spec.name] = stack_report(spec, runner.preview(spec, read_only=True))
        report = reports[spec.name]
        started = time.monotonic()
        outcome = stack_step(
            journal,
            f"up:{spec.name}",
            resume,
            progress,
            f"applying stack {spec.name} ({count_text(report.pending())})",
            functools.partial(runner.up, spec),
        )
        report.applied = True
        report.seconds = round(time.monotonic() - started, 2)
        report.result_summary = {
            k: v for k, v in outcome.summary.items() if k not in ("refresh", "read")
        }
        report.outputs = {k: v for k, v in outcome.outputs.items() if k not in SECRET_OUTPUTS}
        for read in (i for i in lay.inputs if i.source == spec.name):
            report.outputs[read.output] = outcome.outputs.get(read.output)
        journal.append(f"up:{spec.name}", "done", summary=report.result_summary)
    journal.append("done", "applied")


def _provision(
    req: ProvisionRequest,
    paths: NpaPaths,
    target: Target,
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
    existing = _existing_disks(target, lay, runner, journal)
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
    _check_tools(target)
    # An unusable API server is said first, and nothing is previewed against it: the engine
    # previews a cluster it cannot read as "everything to create".
    unreachable = _unreachable(target, lay)
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
            changes={r.stack: counts(r.pending()) for r in reports.values()},
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


__all__ = [
    "PROJECT",
    "Progress",
    "ProvisionRequest",
    "ProvisionResult",
    "StackReport",
    "TeardownRequest",
    "TeardownResult",
    "_after_locks",
    "active_runs",
    "layout",
    "namespace_for",
    "provision_if_absent",
    "quota_text",
    "stack_text",
    "stack_token",
    "teardown",
]
