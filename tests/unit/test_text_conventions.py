"""Text output conventions: counts agree with their nouns, numbers are grouped one way, a
missing value never prints as ``None``, and tables fit ``$COLUMNS``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.core.table import table
from npa.core.text import clipped, number, plural


@given(st.integers(min_value=0, max_value=10**15))
def test_numbers_are_grouped_by_thousands_and_read_back(value: int) -> None:
    text = number(value)
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", text)
    assert int(text.replace(",", "")) == value


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["shard", "object", "run"]))
def test_counts_agree_with_their_noun(count: int, noun: str) -> None:
    text = plural(count, noun)
    assert text.endswith(noun if count == 1 else noun + "s")
    assert text.startswith(number(count) + " ")
    assert plural(1, "retry", "retries") == "1 retry" and plural(2, "entry") == "2 entries"


@pytest.mark.parametrize("columns", [40, 60, 100])
def test_tables_fit_columns(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    rows = [
        ["gpu-node-a", "NVIDIA-H100-80GB-HBM3", 8, 74247069696, None],
        [
            "cpu-node-b",
            None,
            0,
            70458961920,
            "registry.example.com/team/curator@sha256:" + "a" * 64,
        ],
    ]
    lines = table(["NODE", "GPU", "COUNT", "BYTES", "IMAGE"], rows)
    assert all(len(line) <= columns for line in lines), lines
    text = "\n".join(lines)
    assert "None" not in text
    if columns >= 100:
        assert "74,247,069,696" in text and "70,458,961,920" in text


def test_a_pipe_gets_rows_that_never_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    long = "x" * 300
    lines = table(["A", "B"], [["one", long]])
    assert len(lines) == 2 and lines[1].endswith(long)


def test_results_render_without_none_and_with_plurals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    from npa.services.gpus import GpusResult, NodeRow
    from npa.services.status import RunList, RunRow, StatusResult

    status = StatusResult(
        project="p", run_id="r", workflow="w", state="RUNNING", trustworthy=True,
        last_known_state=None, reason="the backend answered", backend="local", job_id=1,
        job_name=None, job_state=None, run_prefix=None, sources=[], checked_at="now",
    )  # fmt: skip
    assert "  job: local 1: state not reported" in status.text_lines()
    runs = RunList(
        project="p",
        store="file:///s",
        runs=[
            RunRow(
                run_id="20260101-000000-abcdef",
                workflow="w",
                recorded_state="OK",
                run_prefix="file:///s/w/r",
            )
        ],
        truncated=False,
    )
    gpus = GpusResult(
        cluster="c",
        nodes=[
            NodeRow(
                node="n",
                gpu_label=None,
                label_key=None,
                allocatable=1,
                requestable=0,
                ready=True,
                schedulable=False,
            )
        ],
        labels=[],
    )
    for result in (status, runs, gpus):
        text = "\n".join(result.text_lines())
        assert not re.search(r"\bNone\b", text), text
        assert not re.search(r"\b1 (runs|nodes|objects|shards)\b", text), text
    assert runs.text_lines()[0].startswith("1 run of project p")
    assert gpus.text_lines()[0].startswith("cluster c: 1 node")


@pytest.mark.parametrize(
    ("value", "gib", "text"),
    [
        (None, None, "unknown"),
        (0, None, "0 GiB (0 bytes)"),
        (1, None, "0+ GiB (1 byte)"),
        (2**30, None, "1 GiB (1,073,741,824 bytes)"),
        (1251 * 2**30, None, "1,251 GiB (1,343,251,021,824 bytes)"),
        (2**30 + 1, 2, "2 GiB (1,073,741,825 bytes)"),  # a requirement rounded up on purpose
    ],
)
def test_one_form_for_a_size_in_bytes(value: int | None, gib: int | None, text: str) -> None:
    from npa.core.text import gib_text

    assert gib_text(value, gib) == text


# Messages were cut at 200 (or 300, 400, 500) characters wherever they were bounded, in the
# middle of a word and with nothing to say so ("...port=1): Failed to establish a new connection").
_WORDS = st.lists(
    st.text(st.characters(blacklist_categories=["Cs", "Zs", "Cc"]), min_size=1, max_size=12),
    max_size=40,
)


@given(_WORDS, st.sampled_from([" ", "\n", "  "]), st.integers(min_value=1, max_value=120))
def test_a_bounded_text_is_cut_where_a_word_ends_and_says_so(
    words: list[str], gap: str, limit: int
) -> None:
    text = gap.join(words)
    shown = clipped(text, limit)
    assert len(shown) <= limit
    if len(text) <= limit:
        assert shown == text
        return
    assert shown.endswith("…")
    kept = shown.removesuffix("…")
    assert text.startswith(kept)
    # Whole words only, unless the first word alone is longer than half the room.
    whole = [gap.join(words[:n]) for n in range(len(words) + 1)]
    first_too_long = len(words[0]) >= (limit - 1) // 2
    assert (
        kept in whole
        or first_too_long
        or not any(0 < len(w) <= limit - 1 and len(w) >= (limit - 1) // 2 for w in whole)
    ), (text, shown)


def test_no_text_is_cut_by_a_bare_slice() -> None:
    """Every bound on a message or an answer npa shows is clipped(): a slice of a hundred
    characters or more (``x[:200]``), or one that leaves room for a dot (``x[: width - 1]``),
    is how text was cut mid-word."""
    import ast
    from pathlib import Path

    import npa

    found = []
    for path in sorted(Path(npa.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Slice) or node.lower is not None or node.upper is None:
                continue
            upper = node.upper
            if isinstance(upper, ast.Constant) and isinstance(upper.value, int):
                if upper.value >= 100:
                    found.append(f"{path.name}:{node.lineno}")
            elif isinstance(upper, ast.BinOp) and isinstance(upper.op, ast.Sub):
                room = upper.right  # `width - 1`: room left for a "…" or "..."
                if isinstance(room, ast.Constant) and room.value in (1, 3):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == [], "cut with npa.core.text.clipped: " + ", ".join(found)
