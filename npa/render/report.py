"""A run's report page: one self-contained HTML file, drawn from what the readers read.

:class:`RunReport` is what the page shows, as plain data: the run's state and the sources that
answered, each stage (state, failure class, waves, outputs, the tail of a failed stage's log, the
commands to run next), the pods a waiting run waits on, and the supervisor's marks on the
timeline. ``npa.services.report`` fills it from ``status``, ``artifacts`` and ``logs``; this
module only turns it into HTML, through the Jinja template
``npa/templates/run-report.html.j2`` (autoescaped: nothing a stage printed can become markup),
with the DAG and the timeline drawn here as inline SVG. The page fetches nothing: no script, no
stylesheet, no image, no font from anywhere. It is pure: it reads nothing but the template and
writes nothing.
"""

from __future__ import annotations

import html
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, Field

from npa.backends.phases import PHASE_NAMES, SUCCEEDED, ShardPhases
from npa.core.templates import templates_dir
from npa.core.text import clipped

TEMPLATE = "run-report.html.j2"

# State -> (fill colour, the word shown beside it). Colour is never the only signal: every node,
# bar and row also carries its state in text.
_GREEN, _BLUE, _GREY, _RED, _ORANGE, _PURPLE = (
    "#2e7d32", "#1565c0", "#9e9e9e", "#c62828", "#ef6c00", "#6a1b9a",
)  # fmt: skip
_COLOURS = {
    "SUCCEEDED": _GREEN,
    "RUNNING": _BLUE,
    "STARTING": _BLUE,
    "RECOVERING": _BLUE,
    "LAUNCHING": _BLUE,
    "PENDING": _GREY,
    "MANIFEST_PENDING": _GREY,
    "NOT_SUBMITTED": _GREY,
    "PLAN_ONLY": _GREY,
    "CANCELLED": _ORANGE,
    "CANCELLING": _ORANGE,
}


def state_colour(state: str) -> str:
    """The colour a state is drawn in (failures red, unknowns purple)."""
    if state in _COLOURS:
        return _COLOURS[state]
    if state.startswith("FAILED") or state == "INFRASTRUCTURE_RECOVERY_EXHAUSTED":
        return _RED
    return _PURPLE  # VERIFICATION_UNAVAILABLE, CACHED, LAUNCH_INCOMPLETE, anything unknown


# --- what the page shows ---------------------------------------------------------------------


class ReportSource(BaseModel):
    """One source the report was built from and what it answered."""

    source: str
    where: str
    answer: str
    detail: str = ""
    error: str | None = None
    # How much the answer is worth: "live" (asked now), "record" (a stored record, final or as
    # written), "cached" (a record read instead of asking: not live-verified), "unavailable".
    standing: str = "live"


class ReportOutput(BaseModel):
    name: str
    path: str
    key: str
    status: str  # ok | missing | empty
    objects: int
    bytes: int


class ReportWave(BaseModel):
    wave: int
    state: str
    attempts: int = 0
    shards: list[int] = Field(default_factory=list)
    exit_codes: dict[str, int] = Field(default_factory=dict)
    launched_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    # Each shard attempt's phases, as the stage library recorded them (by shard, attempt).
    recorded: list[ShardPhases] = Field(default_factory=list)

    def shard_attempts(self) -> dict[int, list[ShardPhases]]:
        by_shard: dict[int, list[ShardPhases]] = {}
        for record in self.recorded:
            by_shard.setdefault(record.shard, []).append(record)
        return by_shard

    def launched(self, tries: list[ShardPhases]) -> tuple[int, datetime, datetime] | None:
        """The wave's launch as one shard lived it: from when the backend was asked to start the
        wave to when the shard's first attempt after that began (SkyPilot: the controller asked
        for the task's cluster, then the pod was scheduled, its image pulled and SkyPilot's own
        setup ran). The attempt's number and the span; None when either end is unknown."""
        asked = _when(self.launched_at)
        if asked is None:
            return None
        after = [r for r in tries if r.started_at >= asked]
        # The SkyPilot stage library writes whole seconds: an attempt that began within the
        # second of the ask can read up to 1 s before it.
        late = [r for r in tries if asked - timedelta(seconds=1) <= r.started_at < asked]
        first = after[0] if after else (late[-1] if late else None)
        if first is None:
            return None
        return first.attempt, asked, max(asked, first.started_at)


class ReportStage(BaseModel):
    name: str
    state: str
    level: int = 0
    depends_on: list[str] = Field(default_factory=list)
    failure_class: str | None = None
    detail: str | None = None
    failure_reason: str | None = None
    origin: str = "manifest"  # where the state came from (status' source or task)
    waves_text: str = ""
    started_at: str | None = None
    ended_at: str | None = None
    waves: list[ReportWave] = Field(default_factory=list)
    outputs: list[ReportOutput] = Field(default_factory=list)
    outputs_checked: bool = False  # False: the store listing of its outputs was not read
    undeclared: list[str] = Field(default_factory=list)
    log_tail: list[str] = Field(default_factory=list)
    log_lines: int = 0  # lines the log holds; the page shows only the tail
    log_note: str = ""  # which source answered, or why there is no log
    next: list[str] = Field(default_factory=list)
    # Whether its shard attempts' phase records were read, and what of them the page says
    # ("" when every wave has them).
    phases_note: str = ""

    @property
    def recorded(self) -> list[ShardPhases]:
        return [r for w in self.waves for r in w.recorded]

    @property
    def retried_attempts(self) -> list[ShardPhases]:
        """Every attempt of each shard that did not succeed at its first: what the page's
        table lists (a shard that succeeded at once is in the timeline alone)."""
        return [
            r
            for w in self.waves
            for tries in w.shard_attempts().values()
            if len(tries) > 1 or tries[0].outcome != SUCCEEDED
            for r in tries
        ]

    @property
    def failed(self) -> bool:
        return self.state.startswith("FAILED") or self.state == "INFRASTRUCTURE_RECOVERY_EXHAUSTED"

    @property
    def missing_outputs(self) -> list[ReportOutput]:
        return [o for o in self.outputs if o.status != "ok"]


class PendingPod(BaseModel):
    """Why a pod of a waiting run waits (as ``status`` read it from the pod or its events)."""

    pod: str
    reason: str
    message: str
    image: str | None = None
    fault: str | None = None  # the classification of an image fault, with why


class Marker(BaseModel):
    """A moment on the timeline: submitted, resumed, a supervisor's recovery or relaunch."""

    at: str
    kind: str  # submitted | resume | relaunch | infrastructure | payload | configuration | other
    label: str


class RunReport(BaseModel):
    project: str
    run_id: str
    workflow: str | None
    state: str
    trustworthy: bool
    final: bool
    reason: str
    backend: str | None = None
    job_id: int | None = None
    job_name: str | None = None
    failure_reason: str | None = None
    run_prefix: str | None = None
    checked_at: str  # when status answered
    built_at: str  # when the page was written
    stages: list[ReportStage] = Field(default_factory=list)
    sources: list[ReportSource] = Field(default_factory=list)
    next: list[str] = Field(default_factory=list)
    pending: list[PendingPod] = Field(default_factory=list)
    markers: list[Marker] = Field(default_factory=list)
    supervisor: str | None = None
    # Parts of the run that could not be read: the page says so at the top.
    incomplete: list[str] = Field(default_factory=list)
    refresh_seconds: float | None = None  # the page reloads itself (a watch rewrites it)


# --- drawing ---------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


_NODE_W, _NODE_H, _GAP_X, _GAP_Y, _PER_ROW = 180, 58, 24, 34, 6


def _dag_places(stages: list[ReportStage]) -> dict[str, tuple[int, int]]:
    """Each stage's top-left corner: one band per plan level, wrapped at ``_PER_ROW`` nodes."""
    levels: dict[int, list[str]] = {}
    for stage in stages:
        levels.setdefault(stage.level, []).append(stage.name)
    places: dict[str, tuple[int, int]] = {}
    row = 0
    for level in sorted(levels):
        for i, name in enumerate(levels[level]):
            r, c = divmod(i, _PER_ROW)
            places[name] = (10 + c * (_NODE_W + _GAP_X), 10 + (row + r) * (_NODE_H + _GAP_Y))
        row += (len(levels[level]) - 1) // _PER_ROW + 1
    return places


def dag_svg(stages: list[ReportStage]) -> str:
    """The stages as boxes in plan levels, edges from each input's stage; each box names its
    stage, its state and its failure class in text, and is coloured by its state."""
    if not stages:
        return ""
    places = _dag_places(stages)
    width = max(x for x, _ in places.values()) + _NODE_W + _GAP_X + 10  # room for routing
    height = max(y for _, y in places.values()) + _NODE_H + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="stages of the run and their '
        'dependencies">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
    ]
    for stage in stages:
        x2, y2 = places[stage.name]
        for upstream in stage.depends_on:
            if upstream not in places:
                continue
            parts.append(_edge(places[upstream], (x2, y2)))
    for stage in stages:
        x, y = places[stage.name]
        colour = state_colour(stage.state)
        second = stage.state + (f" · {stage.failure_class}" if stage.failure_class else "")
        parts.append(
            f'<g class="node" data-stage="{_e(stage.name)}" data-state="{_e(stage.state)}">'
            f"<title>{_e(stage.name)}: {_e(second)}</title>"
            f'<rect x="{x}" y="{y}" width="{_NODE_W}" height="{_NODE_H}" rx="6" fill="#fff" '
            f'stroke="{colour}" stroke-width="3"/>'
            f'<rect x="{x}" y="{y}" width="10" height="{_NODE_H}" rx="3" fill="{colour}"/>'
            f'<text x="{x + 18}" y="{y + 22}" font-size="14" font-weight="bold">'
            f"{_e(_clip(stage.name, 20))}</text>"
            f'<text x="{x + 18}" y="{y + 42}" font-size="12" fill="{colour}">'
            f"{_e(_clip(second, 26))}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _edge(start: tuple[int, int], end: tuple[int, int]) -> str:
    """An arrow from the bottom of one box to the top of another, routed through the gaps
    between rows and columns so that it never runs under a box it does not connect."""
    sx, sy = start[0] + _NODE_W // 2, start[1] + _NODE_H
    ex, ey = end[0] + _NODE_W // 2, end[1]
    below, above = sy + _GAP_Y // 2, ey - _GAP_Y // 2
    if above <= below:  # the next row: down, across, down
        points = [(sx, sy), (sx, below), (ex, below), (ex, ey)]
    else:  # rows between: along the gap right of the upstream box's column
        side = start[0] + _NODE_W + _GAP_X // 2
        points = [(sx, sy), (sx, below), (side, below), (side, above), (ex, above), (ex, ey)]
    path = " ".join(f"{x},{y}" for x, y in points)
    return (
        f'<polyline points="{path}" fill="none" stroke="#555" stroke-width="1.2" '
        'marker-end="url(#arrow)"/>'
    )


def _clip(text: str, width: int) -> str:
    return clipped(text, width)


_LABEL_W, _PLOT_W, _ROW_H, _SHARD = 230, 600, 20, 7


class _Span:
    """The time range the timeline covers, and where a moment falls in it."""

    def __init__(self, moments: list[datetime]) -> None:
        self.start = min(moments)
        self.end = max(moments)
        self.seconds = max((self.end - self.start).total_seconds(), 1e-3)

    def x(self, moment: datetime) -> float:
        offset = (moment - self.start).total_seconds() / self.seconds
        return round(_LABEL_W + offset * _PLOT_W, 1)


# A row: a stage without waves, a wave, or one shard of a wave with its recorded attempts.
_Row = tuple[ReportStage, ReportWave | None, list[ShardPhases] | None]


def _timeline_rows(report: RunReport) -> list[_Row]:
    rows: list[_Row] = []
    for stage in report.stages:
        if not stage.waves:
            rows.append((stage, None, None))
        for wave in stage.waves:
            rows.append((stage, wave, None))
            rows += [(stage, wave, tries) for tries in wave.shard_attempts().values()]
    return rows


def _moments(report: RunReport) -> list[datetime]:
    """Every moment the timeline shows; when status answered, only while something runs (a bar
    that has not ended reaches up to it)."""
    found = [_when(m.at) for m in report.markers]
    running = False
    for stage in report.stages:
        found += [_when(stage.started_at), _when(stage.ended_at)]
        running = running or (stage.started_at is not None and stage.ended_at is None)
        for wave in stage.waves:
            found += [_when(wave.launched_at), _when(wave.started_at), _when(wave.ended_at)]
            running = running or (wave.started_at is not None and wave.ended_at is None)
            found += [m for r in wave.recorded for m in (r.started_at, r.ended_at)]
    if running or not report.final:
        found.append(_when(report.checked_at))
    return [m for m in found if m is not None]


def _bar(span: _Span, y: int, begin: str | None, end: str | None, state: str, title: str) -> str:
    start = _when(begin)
    if start is None:
        return ""
    stop = _when(end) or span.end  # still running: up to when status answered
    x1, x2 = span.x(start), span.x(stop)
    width = max(x2 - x1, 2.0)
    dashed = ' stroke-dasharray="3,2"' if _when(end) is None else ""
    return (
        f'<rect class="bar" x="{x1}" y="{y + 3}" width="{width:.1f}" height="{_ROW_H - 6}" '
        f'fill="{state_colour(state)}" stroke="#222" stroke-width="0.6"{dashed}>'
        f"<title>{_e(title)}</title></rect>"
    )


def _shard_cells(wave: ReportWave, y: int) -> str:
    """One small square per shard of the wave: green exit 0, red another exit, grey not ended."""
    x0 = _LABEL_W + _PLOT_W + 12
    cells = []
    for i, shard in enumerate(wave.shards):
        code = wave.exit_codes.get(str(shard))
        fill = _GREY if code is None else (_GREEN if code == 0 else _RED)
        said = "no exit recorded" if code is None else f"exit {code}"
        cells.append(
            f'<rect x="{x0 + i * (_SHARD + 1)}" y="{y + 6}" width="{_SHARD}" height="{_SHARD}" '
            f'fill="{fill}"><title>shard {shard}: {said}</title></rect>'
        )
    return "".join(cells)


# Phase -> fill; the outline of an attempt says its outcome (green succeeded, red not), and its
# label and title say it in words.
PHASE_COLOURS = {
    "launch": "#ce93d8",
    "setup": "#b0bec5",
    "start": "#ffe082",
    "run": "#64b5f6",
    "upload": "#81c784",
}


def short_outcome(record: ShardPhases) -> str:
    """An attempt's outcome in a few characters, for a row's label."""
    outcome = record.outcome
    if outcome == SUCCEEDED:
        return "ok"
    if record.exit_code not in (None, 0):
        return f"exit {record.exit_code}"
    return "no upload" if record.exit_code == 0 else "cut short"


def _attempt_bars(
    span: _Span, y: int, record: ShardPhases, launch: tuple[datetime, datetime] | None
) -> str:
    """One attempt: a rect per phase (filled by the page's ``ph-<phase>`` style), its launch
    before them when it is the attempt the wave's launch started, and an outline by its outcome
    whose title says it in words with each phase's length."""
    parts = []
    phases = record.phases()
    if launch is not None:
        phases.insert(0, ("launch", *launch))
    for name, begin, end in phases:
        x1, x2 = span.x(begin), span.x(end)
        parts.append(
            f'<rect class="phase ph-{name}" data-phase="{name}" x="{x1}" y="{y + 5}" '
            f'width="{max(x2 - x1, 1.0):.1f}" height="{_ROW_H - 10}"/>'
        )
    x1, x2 = span.x(record.started_at), span.x(record.ended_at)
    ok = record.outcome == SUCCEEDED
    took = ", ".join(f"{name} {(end - begin).total_seconds():.1f} s" for name, begin, end in phases)
    said = "; ".join(
        t
        for t in (
            f"stage {record.stage} wave {record.wave} shard {record.shard} "
            f"attempt {record.attempt}: {record.outcome}",
            record.note,
            took,
            f"from {record.started_at.isoformat()}",
        )
        if t
    )
    parts.append(
        f'<rect class="attempt" data-shard="{record.shard}" data-attempt="{record.attempt}" '
        f'data-outcome="{_e(record.outcome)}" x="{x1}" y="{y + 3}" '
        f'width="{max(x2 - x1, 2.0):.1f}" height="{_ROW_H - 6}" fill="none" '
        f'stroke="{_GREEN if ok else _RED}" stroke-width="{1.2 if ok else 2}">'
        f"<title>{_e(said)}</title></rect>"
    )
    return "".join(parts)


def _shard_row(span: _Span, y: int, wave: ReportWave, tries: list[ShardPhases]) -> str:
    first = tries[0]
    launched = wave.launched(tries)
    said = ", ".join(f"a{r.attempt} {short_outcome(r)}" for r in tries)
    text = _e(_clip(f"s{first.shard}: {said}", 40))
    label = (
        f'<text class="shard" data-shard="{first.shard}" x="16" y="{y + 14}" font-size="10">'
        f"{text}</text>"
    )
    return label + "".join(
        _attempt_bars(span, y, r, launched[1:] if launched and launched[0] == r.attempt else None)
        for r in tries
    )


def _row(span: _Span, y: int, stage: ReportStage, wave: ReportWave | None) -> str:
    if wave is None:
        label = f"{stage.name}: {stage.state}"
        title = f"stage {stage.name} {stage.state} ({stage.waves_text})"
        bar = _bar(span, y, stage.started_at, stage.ended_at, stage.state, title)
        return _label(y, label) + bar
    tries = f", {wave.attempts} attempts" if wave.attempts > 1 else ""
    label = f"{stage.name} w{wave.wave}: {wave.state}{tries}"
    bad = sum(1 for c in wave.exit_codes.values() if c != 0)
    title = (
        f"stage {stage.name} wave {wave.wave} {wave.state}; {len(wave.shards)} shards, "
        f"{bad} with a non-zero exit; attempts {wave.attempts}; "
        f"{wave.started_at or '?'} to {wave.ended_at or 'not ended'}"
    )
    bar = _bar(span, y, wave.started_at, wave.ended_at, wave.state, title)
    return _label(y, label) + bar + _shard_cells(wave, y)


def _label(y: int, text: str) -> str:
    return f'<text x="4" y="{y + 14}" font-size="11">{_e(_clip(text, 38))}</text>'


_MARK_COLOURS = {"submitted": "#333", "resume": _BLUE, "relaunch": _ORANGE,
                 "infrastructure": _PURPLE, "payload": _RED}  # fmt: skip


def timeline_svg(report: RunReport) -> str:
    """Per stage, one row per wave: a bar from its start to its end (dashed while it runs),
    coloured by its state, labelled with its state and attempts, and one cell per shard with its
    exit; under it, one row per shard whose attempts' phases were recorded: each attempt a bar
    split into its phases, outlined by its outcome and labelled with it in words. Vertical lines
    mark submission, resumes and each recovery the supervisor took."""
    moments = _moments(report)
    rows = _timeline_rows(report)
    started = any(s.started_at or any(w.started_at for w in s.waves) for s in report.stages)
    if not moments or not started:
        return ""
    span = _Span(moments)
    top = 24
    shards = max((len(w.shards) for _, w, _ in rows if w is not None), default=0)
    width = _LABEL_W + _PLOT_W + 16 + shards * (_SHARD + 1) + 8
    height = top + len(rows) * _ROW_H + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="timeline of the waves, shards and attempts of each stage">',
        f'<text x="{_LABEL_W}" y="14" font-size="11">{_e(span.start.isoformat())}</text>',
        f'<text x="{_LABEL_W + _PLOT_W}" y="14" font-size="11" text-anchor="end">'
        f"+{span.seconds:.1f} s</text>",
    ]
    for i, (stage, wave, tries) in enumerate(rows):
        y = top + i * _ROW_H
        if i % 2:
            parts.append(f'<rect x="0" y="{y}" width="{width}" height="{_ROW_H}" fill="#f4f4f4"/>')
        if tries is None or wave is None:
            parts.append(_row(span, y, stage, wave))
        else:
            parts.append(_shard_row(span, y, wave, tries))
    for marker in report.markers:
        moment = _when(marker.at)
        if moment is None:
            continue
        x = span.x(moment)
        colour = _MARK_COLOURS.get(marker.kind, "#555")
        parts.append(
            f'<line class="marker" x1="{x}" y1="{top - 4}" x2="{x}" y2="{height - 4}" '
            f'stroke="{colour}" stroke-width="1.5" stroke-dasharray="4,3">'
            f"<title>{_e(marker.kind)}: {_e(marker.label)} ({_e(marker.at)})</title></line>"
        )
    parts.append("</svg>")
    return "".join(parts)


# --- the page --------------------------------------------------------------------------------


def size_text(size: int) -> str:
    """Bytes as a person reads them."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


@lru_cache(maxsize=4)
def _environment(root: str) -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        autoescape=True,  # every value is escaped; only the SVG built above is marked safe
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["colour"] = state_colour
    env.filters["size"] = size_text
    return env


def render_report(report: RunReport) -> str:
    """The page, as one HTML document that fetches nothing."""
    template = _environment(str(templates_dir())).get_template(TEMPLATE)
    return str(
        template.render(
            r=report,
            # Built above from escaped text: the template marks these two, and only these, safe.
            dag=dag_svg(report.stages),
            timeline=timeline_svg(report),
            failed=[s for s in report.stages if s.failed],
            phase_colours=PHASE_COLOURS,
            record_phases=PHASE_NAMES,
            attempts=[a for s in report.stages for a in s.retried_attempts],
            missing=[(s, o) for s in report.stages for o in s.missing_outputs],
        )
    )


# --- the comparison page ---------------------------------------------------------------------

COMPARE_TEMPLATE = "compare-report.html.j2"
_BASE_FILL, _CANDIDATE_FILL = "#90a4ae", "#1565c0"


def durations_svg(rows: list[dict[str, Any]], base: str, candidate: str) -> str:
    """Grouped bars of each stage's duration in both runs (``rows`` as ``insights compare
    --json`` gives its stages); a candidate stage that did not succeed is labelled with its
    state, and a stage one run lacks reads "not in run" instead of a bar."""
    if not rows:
        return ""
    seconds = [
        (side or {}).get("duration_s") or 0.0
        for row in rows
        for side in (row.get("base"), row.get("candidate"))
    ]
    top = max([*seconds, 1e-3])
    bar, gap, plot_h, left, foot = 16, 18, 220, 56, 90
    width = left + len(rows) * (2 * bar + gap) + 20
    height = plot_h + foot + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="durations" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="each stage\'s duration in the base and the candidate run">',
        f'<rect x="{left}" y="8" width="10" height="10" fill="{_BASE_FILL}"/>'
        f'<text x="{left + 14}" y="17" font-size="11">base {_e(base)}</text>'
        f'<rect x="{left + 260}" y="8" width="10" height="10" fill="{_CANDIDATE_FILL}"/>'
        f'<text x="{left + 274}" y="17" font-size="11">candidate {_e(candidate)}</text>',
        f'<line x1="{left}" y1="{30 + plot_h}" x2="{width - 10}" y2="{30 + plot_h}" '
        'stroke="#333"/>',
        f'<text x="4" y="40" font-size="11">{top:.1f} s</text>',
        f'<text x="4" y="{30 + plot_h}" font-size="11">0 s</text>',
    ]
    for i, row in enumerate(rows):
        x = left + 6 + i * (2 * bar + gap)
        for j, key in enumerate(("base", "candidate")):
            side = row.get(key)
            bx = x + j * bar
            if side is None:
                parts.append(
                    f'<text x="{bx + bar / 2}" y="{26 + plot_h}" font-size="9" '
                    f'text-anchor="middle" fill="{_RED}">not in run</text>'
                )
                continue
            value = side.get("duration_s") or 0.0
            h = max(round(value / top * plot_h, 1), 1.0)
            fill = _BASE_FILL if key == "base" else _CANDIDATE_FILL
            parts.append(
                f'<rect class="bar-{key}" data-stage="{_e(row["stage"])}" x="{bx}" '
                f'y="{30 + plot_h - h}" width="{bar - 2}" height="{h}" fill="{fill}">'
                f"<title>{_e(row['stage'])} {key}: {value:.2f} s, {_e(side['state'])}</title>"
                "</rect>"
            )
            if key == "candidate" and side["state"] != "SUCCEEDED":
                parts.append(
                    f'<text x="{bx + bar / 2}" y="{24 + plot_h - h}" font-size="10" '
                    f'text-anchor="middle" fill="{_RED}">{_e(side["state"])}</text>'
                )
        parts.append(
            f'<text x="{x + bar}" y="{44 + plot_h}" font-size="11" text-anchor="end" '
            f'transform="rotate(-35 {x + bar} {44 + plot_h})">{_e(_clip(row["stage"], 18))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_compare(comparison: dict[str, Any], built_at: str) -> str:
    """The comparison (``insights compare --json``'s fields) as one page that fetches nothing."""
    template = _environment(str(templates_dir())).get_template(COMPARE_TEMPLATE)
    base, candidate = comparison["base"]["run"], comparison["candidate"]["run"]
    return str(
        template.render(
            c=comparison,
            built_at=built_at,
            chart=durations_svg(comparison["stages"], base, candidate),
        )
    )
