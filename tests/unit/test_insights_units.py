"""Insights rules without a store: metrics schemas and the order in which divergence is told."""

from __future__ import annotations

import pytest

from npa.insights.compare import first_divergence, pair_stages
from npa.insights.scan import RunFacts, StageFacts, parse_metrics, redact

pytestmark = pytest.mark.unit


def stage(name: str, position: int, **over: object) -> StageFacts:
    base: dict[str, object] = dict(
        stage=name, position=position, state="SUCCEEDED", classification=None, detail=None,
        started_at=None, ended_at=None, duration_s=1.0, waves=1, attempts=1, recoveries=0,
        tool="t", image="r/i@sha256:aa", output_bytes=10,
    )  # fmt: skip
    base.update(over)
    return StageFacts(**base)  # type: ignore[arg-type]


def run(run_id: str, state: str, stages: list[StageFacts]) -> RunFacts:
    return RunFacts("wf", run_id, "p", "local", state, "", "", "file:///x", "h", {}, stages)


def test_metrics_schemas() -> None:
    assert parse_metrics("metrics.json", b'{"a": 1, "b": {"c": 2.5}, "s": "x", "t": true}') == {
        "a": 1.0,
        "b.c": 2.5,
    }
    lines = b'{"name": "loss", "value": 3}\n{"name": "loss", "value": 2}\nnot json\n{"acc": 0.9}\n'
    assert parse_metrics("metrics.jsonl", lines) == {"loss": 2.0, "acc": 0.9}
    assert parse_metrics("metrics.json", b"[1, 2") == {}


def test_an_earlier_image_change_is_stated_after_a_state_change_but_before_retries() -> None:
    base = run("a", "SUCCEEDED", [stage("one", 0), stage("two", 1)])
    failed = run("b", "FAILED", [
        stage("one", 0, attempts=2),
        stage("two", 1, state="FAILED", classification="payload"),
    ])  # fmt: skip
    pairs = pair_stages(base, failed)
    hit = first_divergence(base, pairs, failed)
    assert hit is not None and (hit.stage, hit.facet) == ("two", "state")
    assert hit.candidate == "FAILED (payload)"

    moved = run(
        "c", "SUCCEEDED", [stage("one", 0, attempts=2), stage("two", 1, image="r/i@sha256:bb")]
    )
    hit = first_divergence(base, pair_stages(base, moved), moved)
    assert hit is not None and (hit.stage, hit.facet) == ("two", "image")


def test_durations_alone_are_no_divergence() -> None:
    base = run("a", "SUCCEEDED", [stage("one", 0)])
    slow = run("b", "SUCCEEDED", [stage("one", 0, duration_s=99.0)])
    assert first_divergence(base, pair_stages(base, slow), slow) is None


def test_log_tails_never_keep_a_credential_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-of-some-length")
    assert redact("key=s3cr3t-value-of-some-length ok") == "key=[AWS_SECRET_ACCESS_KEY] ok"
