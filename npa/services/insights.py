"""``npa workbench insights ingest-run / compare``: compare a failure, don't re-investigate it."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict

from npa.core.errors import InvalidInput
from npa.core.output import Result
from npa.core.text import plural
from npa.insights import store as db
from npa.insights.compare import Divergence, first_divergence, pair_stages
from npa.insights.scan import RunFacts, StageFacts, redact_facts, scan


class IngestResult(Result):
    run: str
    state: str
    input_path: str
    output_path: str
    change: str  # added / updated / unchanged
    stages: int
    metrics: int
    logs: int
    store_rows: dict[str, int]

    def text_lines(self) -> list[str]:
        return [
            f"{self.change} run {self.run} ({self.state}) from {self.input_path}",
            f"  {plural(self.stages, 'stage')}, {plural(self.metrics, 'metric')}, "
            f"{plural(self.logs, 'log tail')}",
            f"  store {self.output_path}: "
            + ", ".join(f"{k} {v}" for k, v in self.store_rows.items()),
        ]


def _open(input_path: str, endpoint_url: str | None) -> tuple[Any, str]:
    from npa.adapters.storage import ObjectAbsent, open_store
    from npa.core.layout import PREFIX_LEAF, manifest_key

    uri = input_path.rstrip("/")
    if "://" not in uri:
        uri = Path(uri).expanduser().absolute().as_uri()
    if urlparse(uri).scheme not in ("file", "s3"):
        raise InvalidInput(
            f"--input-path {input_path!r} is neither file:// nor s3:// nor a local path",
            fix="npa workbench workflow list --json  # each run's run_prefix is an --input-path",
        )
    store = open_store(uri, endpoint_url=endpoint_url)
    if uri.endswith(f"/{PREFIX_LEAF}"):
        return store, uri
    try:  # a run root given without its run prefix's last component
        store.head(manifest_key(PREFIX_LEAF))
    except ObjectAbsent:
        return store, uri
    prefix = f"{uri}/{PREFIX_LEAF}"
    return open_store(prefix, endpoint_url=endpoint_url), prefix


def ingest_run(
    input_path: str, output_path: Path, *, endpoint_url: str | None = None
) -> IngestResult:
    """Scan a run prefix and add (or refresh) it in the SQLite store at ``output_path``."""
    from npa.core.paths import NpaPaths
    from npa.runs.secrets import known_secrets

    store, where = _open(input_path, endpoint_url)
    # A stage may have echoed a credential into its log: none is ever stored.
    facts = redact_facts(scan(store, where), known_secrets(npa_home=NpaPaths.from_env().root))
    with db.connect(output_path, create=True) as conn:
        change = db.ingest(conn, facts)
        rows = db.counts(conn)
    return IngestResult(
        run=db.run_key(facts),
        state=facts.state,
        input_path=where,
        output_path=str(db.resolve(output_path)),
        change=change,
        stages=len(facts.stages),
        metrics=sum(len(s.metrics) for s in facts.stages),
        logs=sum(len(s.log_tails) for s in facts.stages) + len(facts.run_logs),
        store_rows=rows,
    )


# --- compare ---------------------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageSide(_Model):
    state: str
    classification: str | None
    detail: str | None
    duration_s: float | None
    waves: int
    retries: int
    recoveries: int
    image: str | None
    image_digest: str | None
    output_bytes: int
    metrics: dict[str, float]
    last_log_line: str | None


class DivergenceModel(_Model):
    stage: str | None
    facet: str
    base: str
    candidate: str
    sentence: str


class StageRow(_Model):
    stage: str
    base: StageSide | None
    candidate: StageSide | None
    differs: list[str]


class RunSide(_Model):
    run: str
    state: str
    classification: str | None
    recovery: str | None
    prefix: str


class CompareResult(Result):
    first_divergence: DivergenceModel | None
    base: RunSide
    candidate: RunSide
    stages: list[StageRow]
    plot: str | None = None
    plot_bytes: int | None = None
    html: str | None = None
    html_bytes: int | None = None

    def exit_code(self) -> int:
        return 0

    def text_lines(self) -> list[str]:
        head = (
            f"first divergence: {self.first_divergence.sentence}"
            if self.first_divergence
            else "no divergence: the candidate matches the base stage by stage"
        )
        lines = [
            head,
            f"base {self.base.run}: {self.base.state}   candidate {self.candidate.run}: "
            f"{self.candidate.state}",
        ]
        lines += _table(self.stages)
        if self.plot:
            lines.append(f"plot: {self.plot} ({plural(self.plot_bytes or 0, 'byte')})")
        if self.html:
            lines.append(f"page: {self.html} ({plural(self.html_bytes or 0, 'byte')})")
        return lines


def _cell(b: Any, c: Any) -> str:
    return str(b) if b == c else f"{b} → {c}"


_COLUMNS = ("state", "seconds", "waves", "rr", "image", "output_bytes", "metrics")


def _table(rows: list[StageRow]) -> list[str]:
    from npa.core.table import table
    from npa.core.text import number

    def get(side: StageSide | None, what: str) -> str:
        if side is None:
            return "-"
        if what == "state":
            return f"{side.state} ({side.classification})" if side.classification else side.state
        if what == "seconds":
            return "-" if side.duration_s is None else f"{side.duration_s:.2f}"
        if what == "rr":
            return f"{side.retries}/{side.recoveries}"
        if what == "image":
            return (side.image_digest or side.image or "-")[:19]
        if what == "metrics":
            return ", ".join(f"{k}={v:g}" for k, v in sorted(side.metrics.items())) or "-"
        value = getattr(side, what)
        return number(value) if isinstance(value, int | float) else str(value)

    headers = ["STAGE", "STATE (CLASS)", "SECONDS", "WAVES", "RETRIES/RECOV", "IMAGE"]
    headers += ["OUT BYTES", "METRICS"]
    return table(
        headers,
        [
            [("✗ " if r.differs else "") + r.stage]
            + [_cell(get(r.base, w), get(r.candidate, w)) for w in _COLUMNS]
            for r in rows
        ],
        indent=0,
    )


def _side(s: StageFacts | None) -> StageSide | None:
    if s is None:
        return None
    last = None
    for _key, tail in sorted(s.log_tails.items()):
        if tail.strip():
            last = tail.strip().splitlines()[-1]
    return StageSide(
        state=s.state,
        classification=s.classification,
        detail=s.detail,
        duration_s=s.duration_s,
        waves=s.waves,
        retries=s.retries,
        recoveries=s.recoveries,
        image=s.image,
        image_digest=s.image_digest,
        output_bytes=s.output_bytes,
        metrics=s.metrics,
        last_log_line=last,
    )


def _run(f: RunFacts) -> RunSide:
    return RunSide(
        run=f"{f.workflow}/{f.run_id}",
        state=f.state,
        classification=f.supervisor.get("classification"),
        recovery=f.supervisor.get("recovery"),
        prefix=f.prefix_uri,
    )


def _divergence(d: Divergence | None) -> DivergenceModel | None:
    if d is None:
        return None
    return DivergenceModel(
        stage=d.stage, facet=d.facet, base=d.base, candidate=d.candidate, sentence=d.sentence
    )


def compare(
    input_path: Path,
    base_run: str,
    candidate_run: str,
    *,
    plot: Path | None = None,
    html: Path | None = None,
) -> CompareResult:
    """Compare two stored runs; optionally draw their per-stage durations to ``plot`` (PNG),
    and write the comparison as one self-contained page to ``html``."""
    if plot is not None:
        from npa.insights.plot import pyplot

        if plot.suffix.lower() != ".png":
            raise InvalidInput(f"--plot {plot} must name a .png file")
        pyplot()  # a missing `plot` extra is reported before any work is done
    with db.connect(input_path, create=False) as conn:
        base = db.load(conn, base_run)
        candidate = db.load(conn, candidate_run)
    pairs = pair_stages(base, candidate)
    result = CompareResult(
        first_divergence=_divergence(first_divergence(base, pairs, candidate)),
        base=_run(base),
        candidate=_run(candidate),
        stages=[
            StageRow(
                stage=p.stage,
                base=_side(p.base),
                candidate=_side(p.candidate),
                differs=[d.facet for d in p.differences],
            )
            for p in pairs
        ],
    )
    if plot is not None:
        from npa.insights.plot import durations_png

        result.plot_bytes = durations_png(pairs, base.run_id, candidate.run_id, plot)
        result.plot = str(plot)
    if html is not None:
        result.html_bytes = _write_page(result, html)
        result.html = str(html.resolve())
    return result


def _write_page(result: CompareResult, out: Path) -> int:
    """The comparison as one HTML page that fetches nothing (its chart inline SVG)."""
    from datetime import UTC, datetime

    from npa.core.fsio import atomic_write_text
    from npa.render.report import render_compare

    text = render_compare(
        result.model_dump(mode="json"), datetime.now(UTC).isoformat(timespec="seconds")
    )
    atomic_write_text(out, text, mode=0o644)
    return len(text.encode("utf-8"))


__all__ = ["CompareResult", "IngestResult", "compare", "ingest_run"]
