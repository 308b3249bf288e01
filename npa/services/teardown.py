"""teardown: destroy a target's stacks in reverse order, after a preview, with consent, and
never from under a run that may still be active."""

from __future__ import annotations

import functools
import shlex
import time
from dataclasses import dataclass
from typing import Any, Literal

from npa.adapters.infra.changes import MUTATING
from npa.adapters.infra.runner import Backend, InfraRunner, StackSpec
from npa.core.commands import npa_command
from npa.core.errors import EXIT_FAILURE, NpaError
from npa.core.fsio import exclusive_lock
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.runs.journal import OperationJournal
from npa.services.configure import choose_context, redact, resolve_project
from npa.services.stackops import (
    Confirm,
    StackReport,
    count_text,
    recover,
    stack_step,
    stack_text,
    state_backend,
)
from npa.targets import layout, target_for
from npa.targets.base import ExistingCluster, Progress, Target


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
                [
                    *(
                        npa_command("workbench", "workflow", "cancel", r, "--project", project)
                        for r in runs
                    ),
                    resume,
                ]
            ),
            details={"runs": runs},
        )


def _destroy_all(
    target: Target,
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
        target.prepare_destroy(spec)
        report = reports[spec.name]
        report.recovery = recover(runner, spec, journal, resume)
        started = time.monotonic()
        outcome = stack_step(
            journal,
            f"destroy:{spec.name}",
            resume,
            progress,
            f"destroying stack {spec.name} ({count_text(report.pending())})",
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
    target = target_for(req.target, project=project)
    argv = ["teardown", "--project", project, "--target", req.target]
    context = req.context
    if isinstance(target, ExistingCluster):
        chosen = choose_context(context, project=project, paths=paths, use_current=False)
        if chosen is None:
            raise target.no_context(paths, argv)
        context = chosen.name
    lay = layout(paths, project, req.target, context=context, kubeconfig=None, need_source=False)
    argv += target.resume_args(lay)
    backend = state_backend(paths, req.backend_url, settings, create=False, argv=argv)
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
        _destroy_all(
            target, runner, present, {r.stack: r for r in reports}, journal, resume, req.progress
        )
        journal.append("done", "destroyed")
    return result(
        "destroyed", reports, f"destroyed {plural(len(present), 'stack')} of project {project}"
    )
