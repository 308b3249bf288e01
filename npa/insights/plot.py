"""Per-stage durations of two runs as one PNG (matplotlib, imported only when asked for).

matplotlib is not a core dependency: it comes with npa's ``plot`` extra (and the dev extra)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from npa.core.errors import ToolMissing
from npa.insights.compare import StagePair

PLOT_EXTRA_FIX = "pip install 'npa[plot]'"


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only Agg backend; ToolMissing naming the extra that
    installs it when matplotlib is absent."""
    try:
        import matplotlib
        from matplotlib import pyplot as plt
    except ImportError as exc:
        raise ToolMissing(
            f"--plot draws with matplotlib, which is not installed ({exc}); "
            "it comes with npa's `plot` extra",
            fix=PLOT_EXTRA_FIX,
        ) from exc
    matplotlib.use("Agg")
    return plt


def durations_png(pairs: list[StagePair], base: str, candidate: str, out: Path) -> int:
    """Draw grouped bars of each stage's duration in both runs; returns the file's size."""
    plt = pyplot()
    stages = [p.stage for p in pairs]
    b = [(p.base.duration_s or 0.0) if p.base else 0.0 for p in pairs]
    c = [(p.candidate.duration_s or 0.0) if p.candidate else 0.0 for p in pairs]
    positions = list(range(len(stages)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(stages) + 3), 4), dpi=100)
    try:
        ax.bar([x - 0.2 for x in positions], b, width=0.4, label=f"base {base}")
        bars = ax.bar([x + 0.2 for x in positions], c, width=0.4, label=f"candidate {candidate}")
        for bar, pair in zip(bars, pairs, strict=True):
            cand = pair.candidate
            if cand is not None and cand.state not in ("SUCCEEDED",):
                ax.annotate(cand.state, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8, color="firebrick")  # fmt: skip
        ax.set_xticks(positions, stages)
        ax.set_ylabel("seconds")
        ax.set_title("stage durations")
        ax.legend()
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
    return out.stat().st_size
