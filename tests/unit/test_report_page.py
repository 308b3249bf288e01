"""The run report page from its model: what a reader sees of states, failure classes, next
commands, missing outputs, sources and a hostile log, read back through an HTML parser."""

from __future__ import annotations

import itertools
from html.parser import HTMLParser

from npa.backends.phases import ShardPhases
from npa.render.report import (
    Marker,
    PendingPod,
    ReportOutput,
    ReportSource,
    ReportStage,
    ReportWave,
    RunReport,
    dag_svg,
    render_compare,
    render_report,
    state_colour,
    timeline_svg,
)

HOSTILE = '<script>fetch("https://evil.example/x")</script><img src="https://evil.example/p.png">'
RESUME = "npa workbench workflow submit spec.yaml --project p --resume-run R1"


class Page(HTMLParser):
    """Tags, attributes and the text inside chosen elements of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[tuple[list[tuple[str, dict[str, str | None]]], str]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in ("meta", "br", "img", "link", "input", "line", "rect", "path"):
            self.stack.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.texts.append((list(self.stack), data))

    def text_in(self, tag: str, **attrs: str) -> list[str]:
        """The text of every ``tag`` element whose attributes include ``attrs``."""
        out = []
        for stack, data in self.texts:
            if any(t == tag and all(a.get(k) == v for k, v in attrs.items()) for t, a in stack):
                out.append(data)
        return out


def _report(**changes: object) -> RunReport:
    failed = ReportStage(
        name="square",
        state="FAILED",
        level=1,
        depends_on=["generate"],
        failure_class="payload",
        detail="stage square wave 0 shard 1: exit 4",
        waves_text="0/1 waves succeeded",
        started_at="2026-01-01T12:00:10+00:00",
        ended_at="2026-01-01T12:00:20+00:00",
        waves=[
            ReportWave(
                wave=0,
                state="FAILED",
                attempts=2,
                shards=[0, 1],
                exit_codes={"0": 0, "1": 4},
                started_at="2026-01-01T12:00:10+00:00",
                ended_at="2026-01-01T12:00:20+00:00",
            ),
        ],
        outputs=[
            ReportOutput(
                name="squares",
                path="squares/",
                key="wf/R1/npa-workflow/stages/square/outputs/squares",
                status="missing",
                objects=0,
                bytes=0,
            )
        ],
        outputs_checked=True,
        log_tail=["computing", HOSTILE],
        log_lines=2,
        log_note="the last 2 of 2 lines, from store",
        next=["npa workbench workflow logs R1 --project p --stage square", RESUME],
    )
    values: dict[str, object] = {
        "project": "p",
        "run_id": "R1",
        "workflow": "wf",
        "state": "FAILED",
        "trustworthy": True,
        "final": True,
        "reason": "the manifest records a final state",
        "checked_at": "2026-01-01T12:01:00+00:00",
        "built_at": "2026-01-01T12:01:01+00:00",
        "stages": [
            ReportStage(
                name="generate",
                state="SUCCEEDED",
                waves_text="1/1 waves succeeded",
                started_at="2026-01-01T12:00:01+00:00",
                ended_at="2026-01-01T12:00:09+00:00",
                outputs=[
                    ReportOutput(
                        name="numbers", path="numbers/", key="k", status="ok", objects=1, bytes=2048
                    )
                ],
                outputs_checked=True,
            ),
            failed,
        ],
        "sources": [
            ReportSource(
                source="manifest", where="file:///s/m.json", answer="found", standing="record"
            ),
            ReportSource(
                source="backend-job",
                where="local backend",
                answer="skipped",
                detail="final state recorded",
                standing="record",
            ),
        ],
        "next": ["npa workbench workflow artifacts R1 --project p --json"],
        "markers": [
            Marker(at="2026-01-01T12:00:00+00:00", kind="submitted", label="submitted"),
            Marker(at="2026-01-01T12:00:15+00:00", kind="payload", label="wave 0 retried"),
        ],
    }
    values.update(changes)
    return RunReport.model_validate(values)


def test_each_stage_shows_its_state_and_failure_class_in_text_not_colour_alone() -> None:
    page = Page(render_report(_report()))
    rows = {
        a["data-stage"]: a["data-state"] for t, a in page.tags if t == "tr" and a.get("data-stage")
    }
    assert rows == {"generate": "SUCCEEDED", "square": "FAILED"}
    assert page.text_in("td", **{"class": "failure-class"}) == ["payload"]
    # The DAG names each stage with its state (and class) as text, beside its colour.
    nodes = {
        a["data-stage"]: a["data-state"] for t, a in page.tags if t == "g" and "data-stage" in a
    }
    assert nodes == rows
    assert "FAILED · payload" in page.text_in("g", **{"data-stage": "square"})
    assert state_colour("FAILED") != state_colour("SUCCEEDED") != state_colour("CACHED")
    assert page.text_in("span", id="run-state") == ["FAILED"]


def test_a_failed_stage_shows_its_log_tail_and_the_exact_next_commands() -> None:
    page = Page(render_report(_report()))
    section = {"data-stage": "square"}
    commands = [c for c in page.text_in("code") if c.startswith("npa ")]
    assert "npa workbench workflow logs R1 --project p --stage square" in commands
    assert RESUME in commands
    log = "".join(page.text_in("pre", **{"class": "log"}))
    assert "computing" in log and HOSTILE in log  # shown as text, exactly as printed
    assert "the last 2 of 2 lines" in "".join(page.text_in("section", **section))
    # A stage that succeeded carries no log and no command of its own.
    assert not [c for c in commands if "--stage generate" in c]


def test_hostile_output_is_escaped_never_markup() -> None:
    hostile_pod = PendingPod(pod="ns/p-0", reason="ErrImagePull", message=HOSTILE)
    text = render_report(
        _report(reason=HOSTILE, failure_reason=HOSTILE, pending=[hostile_pod], next=[HOSTILE])
    )
    page = Page(text)
    assert not [t for t, _ in page.tags if t in ("script", "img", "iframe", "object")]
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "ErrImagePull" in page.text_in("table", id="pending")


def test_a_waiting_stage_names_why_its_pods_wait() -> None:
    pods = [
        PendingPod(pod="ns/a-0", reason="ImagePullBackOff", message="not found", image="r/x:1",
                   fault="actionable_configuration: the image does not exist"),
        PendingPod(pod="ns/a-1", reason="ImagePullBackOff", message="not found"),
    ]  # fmt: skip
    waiting = ReportStage(name="train", state="PENDING", waves_text="0/1 waves succeeded")
    page = Page(render_report(_report(state="PENDING", final=False, stages=[waiting],
                                      pending=pods)))  # fmt: skip
    said = "".join(page.text_in("p", **{"class": "waits"}))
    assert "ImagePullBackOff" in said and said.count("ImagePullBackOff") == 1
    cells = page.text_in("table", id="pending")
    assert "ns/a-0" in cells and "actionable_configuration: the image does not exist" in cells


def test_nothing_on_the_page_is_fetched() -> None:
    text = render_report(_report(pending=[PendingPod(pod="ns/p", reason="Unschedulable",
                                                     message="0/1 nodes")]))  # fmt: skip
    page = Page(text)
    assert not [t for t, _ in page.tags if t in ("script", "link", "img", "iframe")]
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action", "data"):
            value = attrs.get(name)
            assert value is None or value.startswith("#"), (tag, name, value)
    assert "@import" not in text and "url(http" not in text


def test_missing_outputs_are_flagged_with_their_key() -> None:
    page = Page(render_report(_report()))
    statuses = {
        a["data-output"]: a["data-status"] for t, a in page.tags if t == "tr" and "data-output" in a
    }
    assert statuses == {"numbers": "ok", "squares": "missing"}
    flagged = " ".join(page.text_in("ul", id="missing-outputs"))
    assert "squares" in flagged and "missing" in flagged
    assert "stages/square/outputs/squares" in flagged
    assert "2.0 KiB" in page.text_in("td")


def test_cached_and_unavailable_sources_are_never_shown_as_live() -> None:
    sources = [
        ReportSource(source="manifest", where="m", answer="found", standing="cached"),
        ReportSource(source="backend-job", where="b", answer="skipped", standing="cached",
                     detail="--cached: not contacted"),
        ReportSource(source="store-outputs", where="s", answer="unavailable",
                     standing="unavailable", error="timed out"),
    ]  # fmt: skip
    page = Page(
        render_report(_report(state="CACHED", trustworthy=False, sources=sources,
                              incomplete=["the stages' outputs could not be listed"]))
    )  # fmt: skip
    standing = {
        a["data-source"]: a["data-standing"]
        for t, a in page.tags
        if t == "tr" and "data-source" in a
    }
    assert standing == {
        "manifest": "cached",
        "backend-job": "cached",
        "store-outputs": "unavailable",
    }
    cells = page.text_in("table", id="sources")
    assert cells.count("CACHED") == 2 and "UNAVAILABLE" in cells and "live" not in cells
    assert "NOT LIVE-VERIFIED" in "".join(page.text_in("div", id="not-live"))
    assert "could not be listed" in "".join(page.text_in("div", id="incomplete"))


def test_the_page_reloads_itself_only_while_a_watch_rewrites_it() -> None:
    live = Page(render_report(_report(state="RUNNING", final=False, refresh_seconds=5.0)))
    refresh = [a for t, a in live.tags if t == "meta" and a.get("http-equiv") == "refresh"]
    assert [a["content"] for a in refresh] == ["5"]
    assert live.text_in("p", id="watching")
    for report in (_report(), _report(state="RUNNING", final=False)):
        page = Page(render_report(report))
        assert not [a for t, a in page.tags if t == "meta" and a.get("http-equiv") == "refresh"]
    assert Page(render_report(_report(state="RUNNING", final=False))).text_in("p", id="not-final")


def test_the_timeline_draws_each_wave_its_shards_and_the_supervisors_marks() -> None:
    svg = timeline_svg(_report())
    page = Page(svg)
    labels = page.text_in("text")
    assert "square w0: FAILED, 2 attempts" in labels
    assert "generate: SUCCEEDED" in labels
    titles = page.text_in("title")
    assert "shard 0: exit 0" in titles and "shard 1: exit 4" in titles
    assert any(t.startswith("payload: wave 0 retried") for t in titles)
    assert sum(1 for t, a in page.tags if t == "line" and a.get("class") == "marker") == 2
    # The bars sit in time order: generate ended before square began.
    bars = [a for t, a in page.tags if t == "rect" and a.get("class") == "bar"]
    assert float(bars[0]["x"] or 0) < float(bars[1]["x"] or 0)
    # Nothing recorded yet: no timeline, and the page says so.
    empty = _report(stages=[ReportStage(name="a", state="PENDING")], markers=[], final=False)
    assert timeline_svg(empty) == ""
    assert "No stage has recorded a start yet." in render_report(empty)


def test_the_dag_places_each_level_below_the_one_it_depends_on() -> None:
    stages = [
        ReportStage(name="a", state="SUCCEEDED", level=0),
        ReportStage(name="b", state="RUNNING", level=1, depends_on=["a"]),
        ReportStage(name="c", state="PENDING", level=1, depends_on=["a"]),
    ]
    page = Page(dag_svg(stages))
    ys = {}
    for i, (tag, attrs) in enumerate(page.tags):
        if tag == "g":
            rect = page.tags[i + 2][1]  # title comes first, then the frame
            ys[attrs["data-stage"]] = float(rect.get("y") or 0)
    assert ys["a"] < ys["b"] == ys["c"]
    assert sum(1 for t, _ in page.tags if t == "polyline") == 2


def _side(state: str, seconds: float, classification: str | None = None) -> dict[str, object]:
    return {"state": state, "classification": classification, "duration_s": seconds,
            "output_bytes": 10, "retries": 0, "recoveries": 0}  # fmt: skip


def test_the_comparison_page_draws_both_runs_and_names_the_divergence() -> None:
    comparison = {
        "first_divergence": {"stage": "b", "facet": "state", "base": "SUCCEEDED",
                             "candidate": "FAILED (payload)", "sentence": f"stage b {HOSTILE}"},
        "base": {"run": "wf/R1", "state": "SUCCEEDED", "prefix": "file:///s/R1"},
        "candidate": {"run": "wf/R2", "state": "FAILED", "prefix": "file:///s/R2"},
        "stages": [
            {"stage": "a", "base": _side("SUCCEEDED", 2.0), "candidate": _side("SUCCEEDED", 4.0),
             "differs": []},
            {"stage": "b", "base": _side("SUCCEEDED", 1.0),
             "candidate": _side("FAILED", 0.5, "payload"), "differs": ["state"]},
            {"stage": "c", "base": _side("SUCCEEDED", 1.0), "candidate": None,
             "differs": ["state"]},
        ],
    }  # fmt: skip
    text = render_compare(comparison, "2026-01-01T00:00:00+00:00")
    page = Page(text)
    assert not [t for t, _ in page.tags if t in ("script", "img", "link")]
    assert HOSTILE in "".join(page.text_in("p", id="first-divergence"))
    bars = {(a["class"], a["data-stage"]): float(a["height"] or 0) for t, a in page.tags
            if t == "rect" and a.get("class", "").startswith("bar-")}  # fmt: skip
    assert set(bars) == {("bar-base", "a"), ("bar-candidate", "a"), ("bar-base", "b"),
                         ("bar-candidate", "b"), ("bar-base", "c")}  # fmt: skip
    assert bars[("bar-candidate", "a")] == 2 * bars[("bar-base", "a")]  # drawn to scale
    labels = page.text_in("text")
    assert "FAILED" in labels and "not in run" in labels
    rows = {
        a["data-stage"]: a["data-differs"] for t, a in page.tags if t == "tr" and "data-stage" in a
    }
    assert rows == {"a": "", "b": "state", "c": "state"}


def test_no_edge_of_the_dag_runs_under_a_box() -> None:
    # 40 stages in levels of 10 (wrapped rows), each fed by the stage 10 before and, for some,
    # by one two levels up: edges that span several rows.
    stages = [
        ReportStage(
            name=f"s{i}",
            state="SUCCEEDED",
            level=i // 10,
            depends_on=[f"s{j}" for j in (i - 10, i - 19) if j >= 0 and j // 10 < i // 10],
        )
        for i in range(40)
    ]
    page = Page(dag_svg(stages))
    boxes = [
        (float(a["x"] or 0), float(a["y"] or 0), float(a["width"] or 0), float(a["height"] or 0))
        for t, a in page.tags
        if t == "rect" and a.get("rx") == "6"
    ]
    assert len(boxes) == 40
    edges = [a["points"] or "" for t, a in page.tags if t == "polyline"]
    assert len(edges) == sum(len(s.depends_on) for s in stages) > 40
    for points in edges:
        xy = [tuple(float(v) for v in p.split(",")) for p in points.split()]
        for (x1, y1), (x2, y2) in itertools.pairwise(xy):
            for bx, by, bw, bh in boxes:
                inside_x = max(x1, x2) > bx and min(x1, x2) < bx + bw
                inside_y = max(y1, y2) > by and min(y1, y2) < by + bh
                assert not (inside_x and inside_y), (points, (bx, by))


def _attempt(shard: int, attempt: int, start: int, **fields: object) -> ShardPhases:
    def at(seconds: int) -> str:
        return f"2026-01-01T12:00:{seconds:02d}+00:00"

    values: dict[str, object] = {
        "stage": "square", "wave": 0, "shard": shard, "attempt": attempt, "backend": "local",
        "started_at": at(start), "inputs_at": at(start + 1), "command_started_at": at(start + 1),
        "command_ended_at": at(start + 3), "exit_code": 0, "uploaded_at": at(start + 4),
        "ended_at": at(start + 4),
    }  # fmt: skip
    values.update(fields)
    return ShardPhases.model_validate(values)


def test_each_shard_attempt_is_drawn_in_its_phases_with_its_outcome_in_words() -> None:
    report = _report()
    square = report.stages[1]
    square.waves[0].recorded = [
        _attempt(0, 1, 10, uploaded_at=None, note="the wave failed: its outputs were not uploaded"),
        _attempt(1, 1, 10, exit_code=4, uploaded_at=None),
        _attempt(0, 2, 15),
        _attempt(1, 2, 15, exit_code=4, uploaded_at=None),
    ]
    square.waves[0].recorded.sort(key=lambda r: (r.shard, r.attempt))
    report.stages[0].phases_note = "phases were not recorded for its shard attempts"
    page = Page(timeline_svg(report))
    labels = page.text_in("text")
    assert "s0: a1 no upload, a2 ok" in labels and "s1: a1 exit 4, a2 exit 4" in labels
    attempts = [a for t, a in page.tags if t == "rect" and a.get("class") == "attempt"]
    assert [(a["data-shard"], a["data-attempt"], a["data-outcome"]) for a in attempts] == [
        ("0", "1", "exit 0, outputs not uploaded"), ("0", "2", "succeeded"),
        ("1", "1", "failed (exit 4)"), ("1", "2", "failed (exit 4)"),
    ]  # fmt: skip
    phases = [a["data-phase"] for t, a in page.tags if t == "rect" and "data-phase" in a]
    assert all(
        a["class"] == f"phase ph-{a['data-phase']}" for t, a in page.tags if "data-phase" in a
    )
    assert phases.count("run") == 4 and phases.count("upload") == 1
    titles = page.text_in("title")
    assert any("attempt 1: exit 0, outputs not uploaded; the wave failed" in t for t in titles)
    assert any("attempt 2: succeeded; setup 1.0 s, start 0.0 s, run 2.0 s, upload 1.0 s" in t
               for t in titles)  # fmt: skip
    # The wave's own bar is still there, and the supervisor's marks.
    assert sum(1 for t, a in page.tags if t == "rect" and a.get("class") == "bar") == 2
    assert sum(1 for t, a in page.tags if t == "line" and a.get("class") == "marker") == 2
    # The page lists every attempt in a table, and says which stage has no phases recorded.
    html = Page(render_report(report))
    rows = [a for t, a in html.tags if t == "tr" and "data-attempt" in a]
    assert [(r["data-shard"], r["data-attempt"], r["data-phases"]) for r in rows] == [
        ("0", "1", "setup start run"), ("0", "2", "setup start run upload"),
        ("1", "1", "setup start run"), ("1", "2", "setup start run"),
    ]  # fmt: skip
    assert "failed (exit 4)" in html.text_in("td") and "2.0 s" in html.text_in("td")
    notes = html.text_in("p", **{"class": "muted phases-note"})
    assert "phases were not recorded for its shard attempts" in "".join(notes)
    # A shard that succeeded at its first attempt is in the timeline alone, not in the table.
    square.waves[0].recorded = [_attempt(0, 1, 10), _attempt(1, 1, 10, exit_code=4)]
    rows = [a for t, a in Page(render_report(report)).tags if t == "tr" and "data-attempt" in a]
    assert [(r["data-shard"], r["data-outcome"]) for r in rows] == [("1", "failed (exit 4)")]


def _launches(report: RunReport) -> list[tuple[str, str]]:
    """(x, width) of each launch rect the timeline draws, in order."""
    page = Page(timeline_svg(report))
    return [
        (a["x"] or "", a["width"] or "")
        for t, a in page.tags
        if t == "rect" and a.get("data-phase") == "launch"
    ]


def test_a_waves_launch_is_drawn_before_the_first_attempt_that_followed_it() -> None:
    report = _report()
    wave = report.stages[1].waves[0]
    wave.recorded = [_attempt(0, 1, 10, exit_code=4, uploaded_at=None), _attempt(0, 2, 15)]
    # No launch recorded (a run from before npa recorded it): no launch drawn.
    wave.launched_at = None
    assert _launches(report) == []
    # Asked at :05, the shard's pod began at :10: attempt 1's bar starts with 5 s of launch.
    wave.launched_at = "2026-01-01T12:00:05+00:00"
    [(x, width)] = _launches(report)
    setups = [a for t, a in Page(timeline_svg(report)).tags if a.get("data-phase") == "setup"]
    assert abs(float(x) + float(width) - float(setups[0]["x"] or "")) < 0.2, (x, width, setups)
    titles = Page(timeline_svg(report)).text_in("title")
    assert any("attempt 1: failed (exit 4); launch 5.0 s, setup 1.0 s" in t for t in titles)
    assert not any("attempt 2" in t and "launch" in t for t in titles)
    # A relaunch asked at :12: the launch belongs to attempt 2, the first that began after it.
    wave.launched_at = "2026-01-01T12:00:12+00:00"
    assert len(_launches(report)) == 1
    titles = Page(timeline_svg(report)).text_in("title")
    assert any("attempt 2: succeeded; launch 3.0 s, setup 1.0 s" in t for t in titles)
    # A record written in whole seconds may read just before the ask: a launch of no length,
    # never one running backwards; an ask after every attempt began draws nothing.
    wave.launched_at = "2026-01-01T12:00:15.600+00:00"
    assert any("attempt 2: succeeded; launch 0.0 s" in t
               for t in Page(timeline_svg(report)).text_in("title"))  # fmt: skip
    wave.launched_at = "2026-01-01T12:00:17+00:00"
    assert _launches(report) == []
    # The attempts table keeps the record's own phases: launch is the wave's, not the record's.
    rows = [a for t, a in Page(render_report(report)).tags if t == "tr" and "data-attempt" in a]
    assert [r["data-phases"] for r in rows] == ["setup start run", "setup start run upload"]
