"""``logs``: a stage's log lines, live from the backend or persisted in the store, with the
log-source contract.

An empty live tail and a store object nobody could read look the same on a terminal, so the
result names every source: whether it was tried, whether it answered, how many lines it gave,
and what an empty answer means. ``--cached`` reads the store only and never contacts the
backend (a post-mortem on a torn-down cluster); ``--follow`` streams the live log until the job
ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from npa.adapters.storage import BucketAbsent, StoreUnavailable
from npa.core.errors import EXIT_UNAVAILABLE, InvalidInput, NotFound, NpaError
from npa.core.layout import stage_logs_key
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.runs.manifest import job_stages
from npa.services.locate import Located, locate
from npa.services.status import open_located_backend

Outcome = Literal["read", "empty", "unavailable", "absent", "not_contacted", "not_applicable"]


class LogSource(BaseModel):
    source: str  # backend-live | store
    where: str
    tried: bool
    outcome: Outcome
    lines: int = 0
    scope: str = ""  # what the lines cover: the stage, or the whole job
    error: str | None = None
    fix: str | None = None


class LogsResult(Result):
    project: str
    run_id: str
    stage: str
    mode: str  # live | follow | cached
    answered_by: str | None  # the source whose lines are shown
    empty_means: str  # "no lines were written" | "unread: no source answered" | ...
    sources: list[LogSource]
    lines: list[str] = Field(default_factory=list)
    streamed: bool = False  # --follow printed the lines as they came

    def text_lines(self) -> list[str]:
        out = [] if self.streamed else list(self.lines)
        tried = ", ".join(f"{s.source}={s.outcome}" for s in self.sources)
        if not self.lines:
            out.append(f"(no log lines: {self.empty_means}; sources: {tried})")
        return out

    def exit_code(self) -> int:
        return EXIT_UNAVAILABLE if self.empty_means.startswith("unread") else 0


def _store_logs(located: Located, stage: str) -> tuple[list[str], LogSource]:
    store, prefix = located.store, located.prefix
    assert store is not None and prefix is not None
    base = f"{stage_logs_key(prefix, stage)}/"
    where = f"{store.uri}/{base}"
    lines: list[str] = []
    try:
        objects = list(store.list(base))
        for obj in objects:
            name = obj.key[len(base) :]
            text = store.get(obj.key).decode("utf-8", "replace")
            lines += [f"[{stage}/{name}] {line}" for line in text.splitlines()]
    except (StoreUnavailable, BucketAbsent) as error:
        return [], LogSource(
            source="store",
            where=where,
            tried=True,
            outcome="unavailable",
            error=error.message,
            fix=error.fix,
        )
    if not objects:
        outcome: Outcome = "absent"
    else:
        outcome = "read" if lines else "empty"
    return lines, LogSource(
        source="store", where=where, tried=True, outcome=outcome, lines=len(lines), scope="stage"
    )


def _live_logs(
    located: Located, stage: str, paths: NpaPaths, follow: bool, emit: Callable[[str], None] | None
) -> tuple[list[str], LogSource]:
    name = located.backend_name or "?"
    job_id = located.job_id
    if job_id is None:
        return [], LogSource(
            source="backend-live",
            where=f"{name} backend",
            tried=False,
            outcome="not_applicable",
            scope="no job id is recorded for the run",
        )
    lines: list[str] = []
    # Every backend answers for the one stage: the local backend reads that stage's log files,
    # SkyPilot tails the stage's own task of the run's pipeline job.
    m = located.manifest
    stages = job_stages(m) if m is not None else None
    where = f"{name} job {job_id}"
    try:
        backend = open_located_backend(located, paths)
        for line in backend.logs(job_id, follow=follow, stage=stage, stages=stages):
            lines.append(line)
            if emit is not None:
                emit(line)
    except NotFound as error:
        return lines, LogSource(
            source="backend-live",
            where=where,
            tried=True,
            outcome="absent",
            scope="stage",
            error=error.message,
        )
    except NpaError as error:
        return lines, LogSource(
            source="backend-live",
            where=where,
            tried=True,
            outcome="unavailable",
            lines=len(lines),
            scope="stage",
            error=f"{error.kind}: {error.message}",
            fix=error.fix,
        )
    return lines, LogSource(
        source="backend-live",
        where=where,
        tried=True,
        outcome="read" if lines else "empty",
        lines=len(lines),
        scope="stage",
    )


def _require_stage(located: Located, stage: str) -> None:
    """The run was submitted and has ``stage``; else the error that says so."""
    located.require_own_run()
    if located.manifest is None and located.receipt is None:
        for source in located.unavailable:
            raise NpaError(
                f"run {located.run_id}: {source.source} could not be read ({source.error})",
                fix=source.fix,
            )
        raise NotFound(
            f"run {located.run_id} was never submitted: it has no logs",
            fix=located.status_command(),
        )
    m = located.manifest
    known = list(m.tasks) if m is not None else []  # every stage has a task file
    if known and stage not in known:
        raise InvalidInput(
            f"run {located.run_id} has no stage {stage!r} (stages: {', '.join(known)})",
            fix=located.status_command(),
        )  # fmt: skip


def _empty_means(shown: list[str], answered: str | None, sources: list[LogSource]) -> str:
    """What no lines mean, given which sources answered."""
    if shown:
        return "not empty"
    if answered is not None:
        return f"empty: {answered} answered and holds no lines for this stage"
    if any(s.outcome == "unavailable" for s in sources):
        return "unread: no source answered (see sources); nothing is concluded"
    return "none written yet: every source answered that no log exists"


def logs(
    run: str,
    project: str | None,
    *,
    stage: str,
    follow: bool = False,
    cached: bool = False,
    workflow_uri: str | None = None,
    emit: Callable[[str], None] | None = None,
    paths: NpaPaths | None = None,
) -> LogsResult:
    """A stage's logs; ``emit`` receives live lines as they arrive (``--follow``)."""
    if follow and cached:
        raise InvalidInput("--follow reads the live job and --cached never contacts it: pick one")
    paths = paths or NpaPaths.from_env()
    located = locate(run, project, workflow_uri=workflow_uri, paths=paths)
    _require_stage(located, stage)
    sources: list[LogSource] = []
    shown: list[str] = []
    answered: str | None = None
    if cached:
        sources.append(
            LogSource(
                source="backend-live",
                where=f"{located.backend_name} backend",
                tried=False,
                outcome="not_contacted",
                scope="--cached never contacts the backend",
            )
        )
    else:
        live, tried = _live_logs(located, stage, paths, follow, emit if follow else None)
        sources.append(tried)
        if tried.outcome == "read":
            shown, answered = live, "backend-live"
    if not shown and located.store is not None and located.prefix is not None:
        stored, read = _store_logs(located, stage)
        sources.append(read)
        if read.outcome in ("read", "empty"):
            shown, answered = stored, "store"
    if answered is None and any(s.outcome == "empty" for s in sources):
        answered = next(s.source for s in sources if s.outcome == "empty")
    return LogsResult(
        project=located.project,
        run_id=located.run_id,
        stage=stage,
        mode="cached" if cached else ("follow" if follow else "live"),
        answered_by=answered,
        empty_means=_empty_means(shown, answered, sources),
        sources=sources,
        lines=shown,
        streamed=follow and emit is not None and answered == "backend-live",
    )
