"""Two stored runs side by side, and the first point where the candidate left the base.

The divergence walks stages in the base's plan order and, within a stage, looks at what most
often explains a difference first: the stage's state (with its failure class), then its image
digest, then retries and recoveries, then output sizes, then metrics. Durations are shown but
never count as a divergence: they differ on every pair of runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from npa.core.text import number, plural
from npa.insights.scan import RunFacts, StageFacts


@dataclass(frozen=True)
class Divergence:
    stage: str | None
    facet: str
    base: str
    candidate: str
    sentence: str


def _state(s: StageFacts | None) -> str:
    if s is None:
        return "not in run"
    return f"{s.state} ({s.classification})" if s.classification else s.state


def _facets(stage: str, b: StageFacts | None, c: StageFacts | None) -> list[Divergence]:
    out: list[Divergence] = []
    if b is None or c is None or (b.state, b.classification) != (c.state, c.classification):
        detail = f": {c.detail}" if c is not None and c.detail else ""
        out.append(
            Divergence(
                stage, "state", _state(b), _state(c),
                f"stage {stage} {_state(c)} in the candidate, {_state(b)} in the base{detail}",
            )
        )  # fmt: skip
        if b is None or c is None:
            return out
    if b.image != c.image:
        out.append(
            Divergence(
                stage, "image", str(b.image_digest or b.image), str(c.image_digest or c.image),
                f"stage {stage} ran another image: {b.image} -> {c.image}",
            )
        )  # fmt: skip
    if (b.retries, b.recoveries) != (c.retries, c.recoveries):
        out.append(
            Divergence(
                stage,
                "retries",
                f"{plural(b.retries, 'retry', 'retries')}, "
                f"{plural(b.recoveries, 'recovery', 'recoveries')}",
                f"{plural(c.retries, 'retry', 'retries')}, "
                f"{plural(c.recoveries, 'recovery', 'recoveries')}",
                f"stage {stage} needed {plural(c.retries, 'retry', 'retries')} and "
                f"{plural(c.recoveries, 'recovery', 'recoveries')} "
                f"(base: {b.retries} and {b.recoveries})",
            )
        )  # fmt: skip
    if b.output_bytes != c.output_bytes:
        out.append(
            Divergence(
                stage, "outputs", str(b.output_bytes), str(c.output_bytes),
                f"stage {stage} stored {plural(c.output_bytes, 'output byte')} "
                f"(base: {number(b.output_bytes)})",
            )
        )  # fmt: skip
    changed = sorted(
        n for n in set(b.metrics) | set(c.metrics) if b.metrics.get(n) != c.metrics.get(n)
    )
    if changed:
        n = changed[0]
        out.append(
            Divergence(
                stage, "metrics", str(b.metrics.get(n)), str(c.metrics.get(n)),
                f"stage {stage} metric {n}: {b.metrics.get(n)} -> {c.metrics.get(n)}"
                + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""),
            )
        )  # fmt: skip
    return out


@dataclass
class StagePair:
    stage: str
    base: StageFacts | None
    candidate: StageFacts | None
    differences: list[Divergence]


def pair_stages(base: RunFacts, candidate: RunFacts) -> list[StagePair]:
    b = {s.stage: s for s in base.stages}
    c = {s.stage: s for s in candidate.stages}
    order = [s.stage for s in base.stages] + [s.stage for s in candidate.stages if s.stage not in b]
    return [StagePair(n, b.get(n), c.get(n), _facets(n, b.get(n), c.get(n))) for n in order]


_PRIORITY = ("state", "image", "retries", "outputs", "metrics")


def first_divergence(
    base: RunFacts, pairs: list[StagePair], candidate: RunFacts
) -> Divergence | None:
    """The earliest stage that differs, by facet priority; the run state if no stage does."""
    for facet in _PRIORITY:
        for pair in pairs:
            hit = next((d for d in pair.differences if d.facet == facet), None)
            if hit is not None:
                return hit
    if base.state != candidate.state:
        return Divergence(
            None, "run", base.state, candidate.state,
            f"the run ended {candidate.state} (base: {base.state}) with every stage alike",
        )  # fmt: skip
    return None
