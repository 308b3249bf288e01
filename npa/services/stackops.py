"""What provisioning and teardown share: a stack's report and its text, the state backend,
recovery of what an interrupted run left, and one journaled, streamed ``up`` or ``destroy``."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from npa.adapters.infra.changes import MUTATING, ResourceChange
from npa.adapters.infra.progress import StepProgress
from npa.adapters.infra.runner import (
    Backend,
    InfraRunner,
    Outcome,
    StackLock,
    StackSpec,
    check_backend_url,
    is_service,
    service_login_missing,
)
from npa.core.errors import LockBusy, NpaError, Unavailable, with_rerun
from npa.core.fsio import ensure_private_dir
from npa.core.paths import NpaPaths
from npa.core.text import clipped, gib_text, number, plural
from npa.plan.quota import QuotaAssessment
from npa.runs.journal import OperationJournal
from npa.services.configure import ProjectSettings, load_config
from npa.services.plan import existing_text
from npa.targets.base import Progress

Confirm = Callable[[list["StackReport"]], bool]


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
    counted = count_text(changes) if report.previewed else "not known"
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


def count_text(changes: Sequence[ResourceChange]) -> str:
    found = counts(changes)
    return ", ".join(f"{number(n)} to {op}" for op, n in sorted(found.items())) or "no changes"


def stack_step(
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


def after_locks(live: Sequence[StackLock], resume: str) -> str:
    """The resume command, run once the processes holding the stack's locks are gone: waited
    for with ``tail --pid`` when they run on this machine, else said in a comment."""
    import socket

    here = socket.gethostname()
    if all(lock.hostname == here and lock.pid for lock in live):
        waits = " && ".join(f"tail --pid={lock.pid} -f /dev/null" for lock in live)
        return f"{waits} && {resume}  # waits for the pulumi process holding the lock"
    return f"{resume}  # once the pulumi process holding the stack's lock has finished"


def counts(changes: Sequence[ResourceChange]) -> dict[str, int]:
    out: dict[str, int] = {}
    for change in changes:
        out[change.op] = out.get(change.op, 0) + 1
    return out


def state_backend(
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


def recover(
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
            fix=after_locks(live, resume),
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


def interrupted(journal: OperationJournal) -> set[str]:
    """Stacks whose last ``up`` or ``destroy`` began and never finished."""
    state: dict[str, str] = {}
    for record in journal.records():
        step = str(record.get("step", ""))
        if step.startswith(("up:", "destroy:")):
            state[step.split(":", 1)[1]] = str(record.get("status"))
    return {stack for stack, status in state.items() if status == "started"}


def stack_report(spec: StackSpec, outcome: Outcome) -> StackReport:
    return StackReport(
        stack=spec.name,
        kind=spec.kind,
        # Sorted so the same preview always reads the same (the engine works in parallel).
        preview=sorted(
            (c for c in outcome.changes if c.op not in ("refresh", "read")), key=lambda c: c.urn
        ),
        preview_summary={k: v for k, v in outcome.summary.items() if k not in ("refresh", "read")},
    )
