"""``workflow report``'s reading side in process: which status answers get a page, how each
source is rated, and the CLI refusing a run it cannot find without writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa.adapters.kube.pods import PodReason
from npa.core.errors import NotFound, Unavailable
from npa.runs.manifest import RunManifest, SupervisorAttempt
from npa.services import report
from npa.services.locate import SourceAnswer
from npa.services.status import StatusResult
from tests.harness.cli import invoke_npa

RUN = "20260101-120000-abcdef"


def status(
    state: str, *sources: SourceAnswer, last: str | None = None, **kw: object
) -> StatusResult:
    values: dict[str, object] = {
        "project": "p", "run_id": RUN, "workflow": "wf", "state": state,
        "trustworthy": state not in ("CACHED", "VERIFICATION_UNAVAILABLE"),
        "last_known_state": last, "reason": f"because {state}", "backend": "local",
        "job_id": 1, "job_name": "npa-wf", "job_state": None, "run_prefix": None,
        "sources": list(sources), "checked_at": "2026-01-01T12:00:00+00:00",
    }  # fmt: skip
    values.update(kw)
    return StatusResult.model_validate(values)


def test_a_run_whose_store_did_not_answer_gets_no_page_but_the_stores_error() -> None:
    failing = SourceAnswer(
        source="manifest", where="s3://b/wf", answer="unavailable",
        error="the store did not answer within 2 s", fix="npa configure --show",
    )  # fmt: skip
    st = status("VERIFICATION_UNAVAILABLE", failing)
    assert report._store_unread(st)
    error = report.refuse_unread(st)
    assert isinstance(error, Unavailable) and error.exit_code == 4
    assert "did not answer within 2 s" in error.message and "No page was written" in error.message
    assert error.fix == "npa configure --show"
    # The manifest was read and only the backend could not be asked: a page, marked.
    assert not report._store_unread(status("VERIFICATION_UNAVAILABLE", last="RUNNING"))
    missing = report.refuse_unread(status("NOT_FOUND", next=["npa workbench workflow list"]))
    assert isinstance(missing, NotFound) and missing.fix == "npa workbench workflow list"


def test_sources_are_rated_live_record_cached_or_unavailable() -> None:
    sources = [
        SourceAnswer(source="manifest", where="m", answer="found"),
        SourceAnswer(source="backend-job", where="b", answer="found"),
        SourceAnswer(source="backend-job", where="b", answer="skipped", detail="final state"),
        SourceAnswer(source="kubernetes-pods", where="k", answer="unavailable", error="refused"),
    ]
    live = [s.standing for s in report._sources(status("RUNNING", *sources), cached=False)]
    assert live == ["record", "live", "record", "unavailable"]
    cached = [s.standing for s in report._sources(status("CACHED", *sources), cached=True)]
    assert cached == ["cached", "cached", "cached", "unavailable"]


def test_an_image_pull_reason_carries_its_fault_class() -> None:
    pod = PodReason(namespace="ns", pod="p-0", phase="Pending", reason="ImagePullBackOff",
                    message='failed to pull "reg/x:1": not found', image="reg/x:1")  # fmt: skip
    [shown] = report._pending(status("PENDING", pending=[pod]))
    assert shown.pod == "ns/p-0" and shown.reason == "ImagePullBackOff"
    assert shown.fault is not None and shown.fault.startswith("actionable_configuration")


def test_the_supervisors_records_become_marks_on_the_timeline() -> None:
    m = RunManifest(
        project="p", workflow="wf", run_id=RUN, backend="local", infra="local", state="FAILED",
        submitted_at="2026-01-01T12:00:00+00:00", updated_at="x", store="s", prefix="x",
        spec_sha256="x", source_digest=None, plan_digest="x", tasks={}, images={},
        job_name="npa-wf",
    )  # fmt: skip
    for what, cls, startup in (("stage a wave 0", "payload", False),
                               ("stage a wave 0", "transient_infrastructure", False),
                               ("launch", "transient_infrastructure", True)):  # fmt: skip
        m.supervisor.attempts.append(
            SupervisorAttempt(at="2026-01-01T12:00:05+00:00", what=what, failure="f",
                              classification=cls, recovery="retried", detail="d", startup=startup)
        )  # fmt: skip
    kinds = [mark.kind for mark in report._markers(m)]
    assert kinds == ["submitted", "payload", "infrastructure", "relaunch"]


def test_the_cli_writes_no_page_for_a_run_that_is_not_there(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    res = invoke_npa("workbench", "workflow", "report", RUN, "--project", "demo", "--out",
                     str(page), "--json")  # fmt: skip
    assert res.code == 3, res.stdout + res.stderr
    assert res.json()["error"]["kind"] == "not_found"
    assert not page.exists()
    both = invoke_npa("workbench", "workflow", "report", RUN, "--watch", "--cached")
    assert both.code == 2 and "pick one" in both.stderr


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPA_HOME", str(tmp_path / ".npa"))
    monkeypatch.setenv("HOME", str(tmp_path))
