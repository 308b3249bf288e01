"""``report``: one self-contained HTML page per run, built from what the readers read.

The page is made of the answers ``status`` (the run's state, its sources, each stage, why it
waits, what to run next), ``artifacts`` (declared outputs against the store) and ``logs`` (the
tail of each failed stage's log) give, through the same services, plus the run's recorded plan
and manifest as :func:`npa.services.locate.locate` reads them (the DAG's edges, each wave's
start, end, attempts and shard exits, the supervisor's recoveries). Nothing here reads a run
another way. It only reads the run; the one thing it writes is the page.

A run whose store cannot be read gets no page (exit 4, as ``status``): a page would have to
show a run npa knows nothing about. A run whose backend cannot be asked, or whose outputs or
logs could not be read, gets a page that says so at the top, and the exit code is 4.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from pydantic import Field

from npa.adapters.kube.pods import IMAGE_REASONS
from npa.backends.base import POD_REASONS_SOURCE
from npa.backends.phases import ShardPhases, read_phases
from npa.core.commands import logs_command, status_command
from npa.core.errors import EXIT_UNAVAILABLE, NotFound, NpaError, Unavailable
from npa.core.fsio import atomic_write_text
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.redaction import scrub
from npa.launch.supervision import classify_pull_failure
from npa.render.report import (
    Marker,
    PendingPod,
    ReportOutput,
    ReportSource,
    ReportStage,
    ReportWave,
    RunReport,
    render_report,
    size_text,
)
from npa.runs.manifest import RunManifest, SupervisorAttempt
from npa.services import status as status_service
from npa.services.locate import Located, SourceAnswer, locate

LOG_TAIL = 40  # lines of a failed stage's log the page shows
LINE_WIDTH = 2000  # characters kept of one log line
PAGE_MODE = 0o644  # a page is for reading, as any file a person writes


class ReportResult(Result):
    """``report``: where the page is and what it shows."""

    run_id: str
    project: str
    path: str
    bytes: int
    state: str
    final: bool
    trustworthy: bool
    incomplete: list[str] = Field(default_factory=list)
    pages_written: int = 1
    status_exit: int = 0  # the exit code status gives for the same answer

    def text_lines(self) -> list[str]:
        lines = [
            f"wrote the report of run {self.run_id} ({self.state}) to {self.path} "
            f"({size_text(self.bytes)})"
        ]
        if not self.trustworthy:
            lines.append(f"  {self.state}: the page says it is not live-verified")
        lines += [f"  incomplete: {part}" for part in self.incomplete]
        return lines

    def exit_code(self) -> int:
        if self.incomplete:
            return max(self.status_exit, EXIT_UNAVAILABLE)
        return self.status_exit


def default_path(run_id: str) -> Path:
    return Path(f"npa-report-{run_id}.html")


class ReadArgs:
    """How the run is read: ``--cached`` (never ask the backend), its prefix, the home."""

    def __init__(self, *, cached: bool, workflow_uri: str | None, paths: NpaPaths) -> None:
        self.cached = cached
        self.workflow_uri = workflow_uri
        self.paths = paths


# --- from the readers' answers to the page's model --------------------------------------------


def _standing(source: SourceAnswer, cached: bool) -> str:
    if source.answer == "unavailable":
        return "unavailable"
    if cached:
        return "cached"
    if source.source in ("backend-job", POD_REASONS_SOURCE, "launch-attempts"):
        return "record" if source.answer in ("skipped", "not_applicable") else "live"
    return "record"


def _sources(st: status_service.StatusResult, cached: bool) -> list[ReportSource]:
    return [
        ReportSource(
            source=s.source,
            where=s.where,
            answer=s.answer,
            detail=s.detail,
            error=s.error,
            standing=_standing(s, cached),
        )
        for s in st.sources
    ]


def _pending(st: status_service.StatusResult) -> list[PendingPod]:
    pods = []
    for p in st.pending:
        fault = None
        if p.reason in IMAGE_REASONS:
            read = classify_pull_failure(p.message, image=p.image, reason=p.reason)
            fault = f"{read.classification.value}: {read.why}"
        pods.append(
            PendingPod(
                pod=f"{p.namespace}/{p.pod}", reason=p.reason, message=p.message, image=p.image,
                fault=fault,
            )
        )  # fmt: skip
    return pods


def _marker_kind(attempt: SupervisorAttempt) -> str:
    if attempt.startup or attempt.what == "launch":
        return "relaunch"
    return {
        "transient_infrastructure": "infrastructure",
        "payload": "payload",
        "actionable_configuration": "configuration",
    }.get(attempt.classification, "other")


def _markers(m: RunManifest | None) -> list[Marker]:
    if m is None:
        return []
    marks = [Marker(at=m.submitted_at, kind="submitted", label=f"submitted as {m.job_name}")]
    marks += [
        Marker(
            at=r.at,
            kind="resume",
            label=f"resume {r.attempt} as {r.job_name}; adopted "
            + (", ".join(r.adopted_stages) or "-"),
        )
        for r in m.resumes
    ]
    marks += [
        Marker(
            at=a.at,
            kind=_marker_kind(a),
            label=f"{a.what}: {a.classification} -> {a.recovery}: {a.detail}",
        )
        for a in m.supervisor.attempts
    ]
    return marks


def _supervisor_line(m: RunManifest | None) -> str | None:
    if m is None or not m.supervisor.classification:
        return None
    sup = m.supervisor
    return (
        f"{sup.classification} -> {sup.recovery}; {sup.payload_retries} payload retries, "
        f"{sup.infrastructure_recoveries} infrastructure recoveries, {sup.relaunches} relaunches"
    )


def _stage(
    name: str,
    view: status_service.StageView,
    m: RunManifest | None,
    deps: dict[str, tuple[int, list[str]]],
) -> ReportStage:
    rec = m.stages.get(name) if m is not None else None
    level, depends_on = deps.get(name, (0, []))
    return ReportStage(
        name=name,
        state=view.state,
        level=level,
        depends_on=depends_on,
        failure_class=view.classification,
        detail=view.detail,
        failure_reason=view.failure_reason,
        origin=view.task or view.source,
        waves_text=view.waves,
        started_at=rec.started_at if rec else None,
        ended_at=rec.ended_at if rec else None,
        waves=[
            ReportWave(
                wave=w.wave,
                state=w.state,
                attempts=w.attempts,
                shards=w.shards,
                exit_codes=w.exit_codes,
                launched_at=w.launched_at,
                started_at=w.started_at,
                ended_at=w.ended_at,
            )
            for w in (rec.waves if rec else [])
        ],
    )


NOT_RECORDED = (
    "phases were not recorded for its shard attempts (a run from before npa recorded them, or "
    "an attempt that ended before writing its record); its bars show each wave only"
)


PHASE_READERS = 16  # stages whose phase records are read at once


def _add_phases(report: RunReport, located: Located) -> None:
    """Each shard attempt's phases, from the records the stage library wrote beside its start
    count (npa.backends.phases), the stages read in parallel. Evidence only: a stage without
    them is drawn as before."""
    store, prefix = located.store, located.prefix
    if store is None or prefix is None:
        return
    stages = [s for s in report.stages if s.waves]

    def read(stage: ReportStage) -> tuple[list[ShardPhases], int] | NpaError:
        assert store is not None and prefix is not None
        try:
            return read_phases(store, prefix, stage.name)
        except NpaError as error:
            return error

    with ThreadPoolExecutor(max_workers=PHASE_READERS, thread_name_prefix="npa-phases") as pool:
        answers = list(pool.map(read, stages))
    found = unreadable = 0
    for stage, answer in zip(stages, answers, strict=True):
        if isinstance(answer, NpaError):
            stage.phases_note = f"its phase records could not be read: {answer.message}"
            report.incomplete.append(f"the phase records of stage {stage.name}: {answer.message}")
            continue
        records, bad = answer
        waves = {w.wave: w for w in stage.waves}
        for record in records:
            if record.wave in waves:
                waves[record.wave].recorded.append(record)
        found += len(records)
        unreadable += bad
        if not records:
            stage.phases_note = NOT_RECORDED
        elif bad:
            stage.phases_note = f"{bad} of its phase records could not be read as one"
    report.sources.append(
        ReportSource(
            source="store-phases",
            where=f"{store.uri}/{prefix}/stages/*/attempts/",
            answer="read",
            detail=f"{found} shard attempt records; {unreadable} unreadable",
            standing="record",
        )
    )


def _add_outputs(report: RunReport, run: str, project: str | None, read: ReadArgs) -> None:
    """Each stage's declared outputs against the store, as ``artifacts`` checks them."""
    from npa.services.artifacts import artifacts

    try:
        arts = artifacts(run, project, workflow_uri=read.workflow_uri, paths=read.paths)
    except NpaError as error:
        report.incomplete.append(f"the stages' outputs could not be listed: {error.message}")
        report.sources.append(
            ReportSource(source="store-outputs", where=report.run_prefix or "-",
                         answer="unavailable", error=error.message, standing="unavailable")
        )  # fmt: skip
        return
    by_name = {s.name: s for s in report.stages}
    for checked in arts.stages:
        stage = by_name.get(checked.stage)
        if stage is None:
            continue
        stage.outputs_checked = True
        stage.undeclared = checked.undeclared
        stage.outputs = [
            ReportOutput(name=o.name, path=o.path, key=o.key, status=o.status,
                         objects=o.objects, bytes=o.bytes)
            for o in checked.outputs
        ]  # fmt: skip
    report.next += [n for n in arts.next if n not in report.next]
    report.sources.append(
        ReportSource(
            source="store-outputs",
            where=arts.run_prefix,
            answer="read",
            detail=f"{len(arts.stages)} stages listed; {len(arts.failures)} output failures",
            standing="live",
        )
    )


def _add_log(
    report: RunReport, stage: ReportStage, run: str, project: str | None, read: ReadArgs
) -> None:
    """The tail of a failed stage's log, from ``logs`` (live, else the store)."""
    from npa.services.logs import logs

    try:
        got = logs(run, project, stage=stage.name, cached=read.cached,
                   workflow_uri=read.workflow_uri, paths=read.paths)  # fmt: skip
    except NpaError as error:
        stage.log_note = f"its log could not be read: {error.message}"
        report.incomplete.append(f"the log of stage {stage.name}: {error.message}")
        return
    stage.log_lines = len(got.lines)
    # A page is a file others may read: a credential the stage printed is not copied into it
    # (redacted as one text, so a key block across lines goes whole).
    tail = scrub("\n".join(got.lines[-LOG_TAIL:]), npa_home=read.paths.root).split("\n")
    stage.log_tail = [line[:LINE_WIDTH] for line in tail] if got.lines else []
    shown = f"the last {len(stage.log_tail)} of {len(got.lines)} lines" if got.lines else "no lines"
    stage.log_note = f"{shown}, from {got.answered_by or 'no source'} ({got.empty_means})"
    if got.exit_code():
        report.incomplete.append(f"the log of stage {stage.name}: {got.empty_means}")
    for s in got.sources:
        standing = {"read": "live", "empty": "live", "unavailable": "unavailable",
                    "not_contacted": "cached"}.get(s.outcome, "record")  # fmt: skip
        if s.source == "store" and standing == "live":
            standing = "record"
        report.sources.append(
            ReportSource(source=f"log of {stage.name}: {s.source}", where=s.where,
                         answer=s.outcome, detail=f"{s.lines} lines", error=s.error,
                         standing=standing)
        )  # fmt: skip
    logs_cmd = logs_command(report.run_id, report.project, stage.name)
    again = [c for c in report.next if "--resume-run" in c or " submit " in f" {c} "]
    stage.next = list(dict.fromkeys([logs_cmd, *again]))


def _store_unread(st: status_service.StatusResult) -> bool:
    """No record of the run could be read: its store did not answer (or another run's manifest
    sits under its key)."""
    return st.state == status_service.VERIFICATION_UNAVAILABLE and st.last_known_state is None


def refuse_unread(st: status_service.StatusResult) -> NpaError:
    """The error of a run that has no page: not found, or its store not read."""
    if st.state == status_service.NOT_FOUND:
        return NotFound(f"run {st.run_id}: {st.reason}; there is nothing to report",
                        fix=st.next[-1] if st.next else None)  # fmt: skip
    failing = [s for s in st.sources if s.answer == "unavailable"]
    why = "; ".join(f"{s.source} ({s.error or s.detail})" for s in failing) or st.reason
    return Unavailable(
        f"run {st.run_id}: its records could not be read: {why}. No page was written: it "
        "would show a run npa knows nothing about",
        fix=next((s.fix for s in failing if s.fix), None) or status_command(st.run_id, st.project),
    )


def build(
    st: status_service.StatusResult, run: str, project: str | None, read: ReadArgs
) -> RunReport:
    """The page's model from one ``status`` answer and what artifacts and logs read now."""
    located = locate(run, project, workflow_uri=read.workflow_uri, paths=read.paths)
    m = located.manifest if located.mismatch is None else None
    plan = status_service.read_run_plan(located) if m is not None else None
    deps = {p.name: (p.level, list(p.depends_on)) for p in plan.stages} if plan else {}
    report = RunReport(
        project=st.project, run_id=st.run_id, workflow=st.workflow, state=st.state,
        trustworthy=st.trustworthy, final=st.state in status_service.TERMINAL, reason=st.reason,
        backend=st.backend, job_id=st.job_id, job_name=st.job_name,
        failure_reason=st.failure_reason, run_prefix=st.run_prefix, checked_at=st.checked_at,
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
        stages=[_stage(n, v, m, deps) for n, v in st.stages.items()],
        sources=_sources(st, read.cached), next=list(st.next), pending=_pending(st),
        markers=_markers(m), supervisor=_supervisor_line(m),
    )  # fmt: skip
    if st.state == status_service.VERIFICATION_UNAVAILABLE:
        report.incomplete.append(f"the run's state could not be verified: {st.reason}")
    if m is not None:
        _add_phases(report, located)
        _add_outputs(report, run, project, read)
        for stage in report.stages:
            if stage.failed:
                _add_log(report, stage, run, project, read)
    return report


def write_page(report: RunReport, out: Path) -> int:
    """Write the page whole (a reader never sees half of it); its size in bytes."""
    text = render_report(report)
    atomic_write_text(out, text, mode=PAGE_MODE)
    return len(text.encode("utf-8"))


def _result(report: RunReport, out: Path, size: int, st_exit: int, pages: int) -> ReportResult:
    return ReportResult(
        run_id=report.run_id, project=report.project, path=str(out.resolve()), bytes=size,
        state=report.state, final=report.final, trustworthy=report.trustworthy,
        incomplete=report.incomplete, pages_written=pages, status_exit=st_exit,
    )  # fmt: skip


def report(
    run: str,
    project: str | None,
    *,
    out: Path | None = None,
    cached: bool = False,
    workflow_uri: str | None = None,
    paths: NpaPaths | None = None,
) -> ReportResult:
    """Read the run once and write its page."""
    paths = paths or NpaPaths.from_env()
    st = status_service.status(run, project, cached=cached, workflow_uri=workflow_uri, paths=paths)
    if st.state == status_service.NOT_FOUND or _store_unread(st):
        raise refuse_unread(st)
    read = ReadArgs(cached=cached, workflow_uri=workflow_uri, paths=paths)
    page = build(st, run, project, read)
    target = out or default_path(st.run_id)
    size = write_page(page, target)
    return _result(page, target, size, st.exit_code(), 1)


def watch_report(
    run: str,
    project: str | None,
    *,
    out: Path | None = None,
    interval: float = 10.0,
    timeout: float | None = None,
    workflow_uri: str | None = None,
    on_write: Callable[[ReportResult], None] | None = None,
    say: Callable[[str], None] | None = None,
    paths: NpaPaths | None = None,
) -> ReportResult:
    """Follow the run with ``status``'s watch and rewrite the page at every answer; while the
    run is not final the page reloads itself every ``interval`` seconds (at least 2). An answer
    that cannot read the store keeps the last page as it was (and says so through ``say``)."""
    paths = paths or NpaPaths.from_env()
    read = ReadArgs(cached=False, workflow_uri=workflow_uri, paths=paths)
    last: list[ReportResult] = []
    pages: list[RunReport] = []
    unread: list[NpaError] = []

    def on_poll(st: status_service.StatusResult) -> None:
        if st.state == status_service.NOT_FOUND or _store_unread(st):
            unread.append(refuse_unread(st))
            if say is not None:
                say(f"{time.strftime('%H:%M:%S')} {unread[-1].message}; the page is unchanged")
            return
        unread.clear()
        page = build(st, run, project, read)
        page.refresh_seconds = None if page.final else max(interval, 2.0)
        target = out or default_path(st.run_id)
        size = write_page(page, target)
        pages[:] = [page]
        last.append(_result(page, target, size, st.exit_code(), len(last) + 1))
        if on_write is not None:
            on_write(last[-1])

    status_service.watch(
        run, project, interval=interval, timeout=timeout, workflow_uri=workflow_uri,
        on_poll=on_poll, paths=paths,
    )  # fmt: skip
    if unread or not last:
        raise unread[-1] if unread else Unavailable(f"run {run}: no answer was read")
    if pages and pages[0].refresh_seconds is not None:
        # The watch stopped before the run ended (--timeout): nothing rewrites the page now, so
        # it stops reloading itself and says it is not final.
        pages[0].refresh_seconds = None
        write_page(pages[0], Path(last[-1].path))
    return last[-1]
