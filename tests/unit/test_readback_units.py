"""Unit tests for the run resolver's parsing and the status decision table."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa.backends.base import JobRecord, JobState, QueueAnswer
from npa.core.errors import InvalidInput
from npa.runs.manifest import RunManifest
from npa.runs.receipts import Receipt
from npa.services.locate import Located, SourceAnswer, parse_run_ref
from npa.services.status import JobAnswer, ask_job, decide, relaunch_in_flight

pytestmark = pytest.mark.unit

RUN = "20260101-000000-abcdef"


def test_run_prefixes_parse_to_store_workflow_and_run() -> None:
    ref = parse_run_ref(f"s3://bucket/team/npa/wf/{RUN}/npa-workflow/")
    assert (ref.store_uri, ref.workflow, ref.run_id) == ("s3://bucket/team/npa", "wf", RUN)
    ref = parse_run_ref(f"s3://bucket/wf/{RUN}")
    assert (ref.store_uri, ref.workflow) == ("s3://bucket", "wf")
    ref = parse_run_ref(f"file:///data/store/wf/{RUN}/npa-workflow")
    assert ref.store_uri == "file:///data/store" and ref.run_id == RUN
    assert parse_run_ref(RUN).store_uri is None


@pytest.mark.parametrize(
    "bad",
    [
        "s3://bucket/wf",
        "gs://bucket/wf/run",
        "s3://bucket/wf/../x",
        "../etc",
        "a/b",
        "s3://bucket/anything/deeper/bar",
        f"s3://bucket/wf/{RUN}/npa-workflow/stages",
        f"s3://bucket/wf/{RUN}/npa-workflow/stages/total",
        f"s3://bucket/wf/{RUN}x",
        f"file:///store/wf/{RUN.upper()}",
    ],
)
def test_anything_but_an_exact_run_prefix_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput):
        parse_run_ref(bad)


def located(*sources: SourceAnswer, manifest: RunManifest | None = None, **kw: object) -> Located:
    from npa.services.configure import resolve_project

    loc = Located(
        settings=resolve_project("p"),
        run_id=RUN,
        workflow="wf",
        store_uri="file:///s",
        store=None,
        receipt=kw.get("receipt"),  # type: ignore[arg-type]
        reservation=kw.get("reservation"),  # type: ignore[arg-type]
        manifest=manifest,
        partial=list(kw.get("partial", [])),  # type: ignore[call-overload]
        sources=list(sources),
    )
    return loc


def answer(source: str, value: str) -> SourceAnswer:
    return SourceAnswer(source=source, where="-", answer=value)  # type: ignore[arg-type]


def manifest(state: str, job_id: int | None = 1) -> RunManifest:
    now = "2026-01-01T00:00:00+00:00"
    return RunManifest(
        project="p", workflow="wf", run_id=RUN, backend="local", infra="local", state=state,
        submitted_at=now, updated_at=now, store="file:///s", prefix=f"wf/{RUN}/npa-workflow",
        spec_sha256="x", source_digest=None, plan_digest="x", tasks={}, images={},
        job_name="n", job_id=job_id,
    )  # fmt: skip


def job(state: JobState) -> JobAnswer:
    return JobAnswer(
        answer="found", record=JobRecord(backend="local", job_id=1, job_name="n", state=state)
    )


NONE = JobAnswer(answer="not_applicable")
DOWN = JobAnswer(answer="unavailable")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPA_HOME", str(tmp_path))


def test_every_source_absent_is_not_found() -> None:
    loc = located(answer("receipt", "absent"), answer("reservation", "absent"),
                  answer("manifest", "absent"), answer("run-prefix", "absent"))  # fmt: skip
    assert decide(loc, NONE, cached=False)[0] == "NOT_FOUND"


@pytest.mark.parametrize("failing", ["receipt", "reservation", "manifest", "store-scan"])
def test_one_unavailable_source_is_never_not_found(failing: str) -> None:
    sources = [answer(s, "unavailable" if s == failing else "absent")
               for s in ("receipt", "reservation", "store-scan", "manifest")]  # fmt: skip
    assert decide(located(*sources), NONE, cached=False)[0] == "VERIFICATION_UNAVAILABLE"


def test_live_manifest_with_unreachable_backend_is_unavailable_and_cached_is_marked() -> None:
    loc = located(answer("manifest", "found"), manifest=manifest("RUNNING"))
    assert decide(loc, DOWN, cached=False)[0] == "VERIFICATION_UNAVAILABLE"
    assert decide(loc, NONE, cached=True)[0] == "CACHED"
    # The backend's end is not the run's: until the supervisor records its verdict (outputs
    # checked, a relaunch decided), the run keeps npa's recorded state, and says why.
    state, reason = decide(loc, job(JobState.FAILED_CONTROLLER), cached=False, polled=True)
    assert state == "RUNNING" and "verdict" in reason and "FAILED_CONTROLLER" in reason
    # A job whose controller died and that the same submit continues is reported as it is, and
    # so is the end of a job npa's own executor ran: it recorded its verdict in the job.
    lost = job(JobState.FAILED_CONTROLLER)
    assert lost.record is not None
    lost.record.continuable = True
    assert decide(loc, lost, cached=False, polled=True)[0] == "FAILED_CONTROLLER"
    assert decide(loc, job(JobState.FAILED), cached=False)[0] == "FAILED"


@pytest.mark.parametrize("ended", [s for s in JobState if s.terminal])
@pytest.mark.parametrize("recorded", ["LAUNCHING", "PENDING", "STARTING", "RUNNING", "RECOVERING"])
def test_a_job_the_backend_ended_is_never_the_runs_verdict(ended: JobState, recorded: str) -> None:
    loc = located(answer("manifest", "found"), manifest=manifest(recorded))
    state, reason = decide(loc, job(ended), cached=False, polled=True)
    assert (state, ended.value in reason) == (recorded, True)
    final = located(answer("manifest", "found"), manifest=manifest(ended.value))
    assert decide(final, job(ended), cached=False, polled=True)[0] == ended.value


def test_a_relaunch_in_progress_is_launching_and_never_the_old_attempts_job() -> None:
    m = manifest("LAUNCHING", job_id=None)
    m.job_name = f"npa-wf-{RUN}-a1"
    receipt = Receipt(project="p", project_identity="x", workflow="wf", run_id=RUN,
                      submitted_at="t", store="file:///s", workflow_prefix="-",
                      credentials_source="none",
                      job={"backend": "skypilot", "job_id": "7",
                           "job_name": f"npa-wf-{RUN}"})  # fmt: skip
    loc = located(answer("manifest", "found"), manifest=m, receipt=receipt)
    assert loc.job_id is None  # job 7 is the first attempt's, not the one the manifest names
    state, reason = decide(loc, JobAnswer(answer="absent"), cached=False)
    assert state == "LAUNCHING" and "relaunching the run as" in reason and "attempt 2" in reason
    # Once the receipt names the new attempt's job, its id counts.
    assert receipt.job is not None
    receipt.job.job_name, receipt.job.job_id = m.job_name, "8"
    assert loc.job_id == 8
    # A first launch that never completed is still LAUNCH_INCOMPLETE.
    first = located(answer("manifest", "found"), manifest=manifest("LAUNCHING", job_id=None))
    assert decide(first, JobAnswer(answer="absent"), cached=False)[0] == "LAUNCH_INCOMPLETE"


class NamedJobs:
    """A backend's queue by name, as :func:`ask_job` asks it (authoritative answers only)."""

    queue_source = "the queue"

    def __init__(self, *records: JobRecord) -> None:
        self.records = list(records)

    def queue(self, name: str) -> QueueAnswer:
        held = [r for r in self.records if r.job_name == name]
        return QueueAnswer(job_name=name, source=self.queue_source, records=held)

    def stage_tasks(self, record: JobRecord, stages: object) -> dict[str, object]:
        return {}


@pytest.mark.parametrize("held", [[5], [5, 6], [5, 6, 7]], ids=["one", "two", "three"])
@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RUNNING, JobState.CANCELLED])
def test_jobs_under_a_relaunchs_name_before_its_adoption_are_evidence_not_the_runs_job(
    held: list[int], state: JobState
) -> None:
    """SkyPilot's API server can make two jobs of one relaunch request (CI of 2026-12-05: jobs 5
    and 6 under one ``-a1`` name; the supervisor adopted 6 and cancelled 5). Until the supervisor
    records the job it adopted, status says LAUNCHING and names every job under the name as
    evidence; it neither follows one of them nor calls the run ambiguous."""
    m = manifest("LAUNCHING", job_id=None)
    m.job_name = f"npa-wf-{RUN}-a1"
    jobs = [JobRecord(backend="skypilot", job_id=i, job_name=m.job_name, state=state) for i in held]
    loc = located(answer("manifest", "found"), manifest=m)
    found, source = ask_job(loc, NamedJobs(*jobs), cached=False)  # type: ignore[arg-type]
    assert found.answer == "unadopted" and found.record is None
    assert found.candidates == [f"{i} ({state.value})" for i in held]
    assert source.answer == "found" and m.job_name in (source.detail or "")
    run_state, reason = decide(loc, found, cached=False, polled=True)
    assert run_state == "LAUNCHING" and "attempt 2" in reason and "not adopted yet" in reason
    assert all(f"{i} ({state.value})" in reason for i in held)
    # Once the supervisor recorded the job it adopted, that job is the run's, asked by id.
    m.job_id, m.state = held[-1], "PENDING"
    assert relaunch_in_flight(m) is None
    # A first launch's job found by name (a launch whose id was never recorded) stays the run's.
    first = manifest("LAUNCHING", job_id=None)
    first.job_name = "npa-wf-" + RUN
    assert relaunch_in_flight(first) is None
    only = JobRecord(backend="skypilot", job_id=9, job_name=first.job_name, state=state)
    got, _ = ask_job(located(answer("manifest", "found"), manifest=first), NamedJobs(only),
                     cached=False)  # type: ignore[arg-type]  # fmt: skip
    assert got.answer == "found" and got.record == only


def test_final_manifest_states_stand_and_a_lost_job_is_not_absence() -> None:
    loc = located(answer("manifest", "found"), manifest=manifest("FAILED_STARTUP"))
    assert decide(loc, DOWN, cached=False)[0] == "FAILED_STARTUP"
    loc = located(answer("manifest", "found"), manifest=manifest("RUNNING"))
    assert decide(loc, JobAnswer(answer="absent"), cached=False)[0] == "VERIFICATION_UNAVAILABLE"
    loc = located(answer("manifest", "found"), manifest=manifest("LAUNCHING", job_id=None))
    assert decide(loc, JobAnswer(answer="absent"), cached=False)[0] == "LAUNCH_INCOMPLETE"


def test_submission_evidence_without_manifest_is_pending_else_plan_or_reservation() -> None:
    receipt = Receipt(project="p", project_identity="x", workflow="wf", run_id=RUN,
                      submitted_at="t", store="file:///s", workflow_prefix="-",
                      credentials_source="none")  # fmt: skip
    loc = located(answer("manifest", "absent"), receipt=receipt)
    assert decide(loc, NONE, cached=False)[0] == "MANIFEST_PENDING"
    loc = located(answer("manifest", "absent"))
    assert decide(loc, job(JobState.PENDING), cached=False)[0] == "MANIFEST_PENDING"
    loc = located(answer("manifest", "absent"), partial=["plan.json"])
    assert decide(loc, NONE, cached=False)[0] == "PLAN_ONLY"
    loc = located(answer("manifest", "absent"), reservation=object())
    assert decide(loc, NONE, cached=False)[0] == "NOT_SUBMITTED"
    # The store could not be read: a receipt alone does not make it MANIFEST_PENDING.
    loc = located(answer("manifest", "unavailable"), receipt=receipt)
    assert decide(loc, NONE, cached=False)[0] == "VERIFICATION_UNAVAILABLE"


def test_children_lists_folders_not_objects(tmp_path: Path) -> None:
    from npa.adapters.storage import open_store

    store = open_store((tmp_path / "s").as_uri())
    for key in ("wf/r1/npa-workflow/a", "wf/r1/npa-workflow/b", "wf/r2/x", "top.txt", "b/c"):
        store.put(key, b"x")
    assert store.children("") == ["b", "wf"]  # the temp folder is not a child
    assert store.children("wf/") == ["r1", "r2"]
    assert store.children("missing/") == []


def test_a_missing_bucket_is_not_found_with_the_bucket_named() -> None:
    from npa.services.locate import BUCKET_ABSENT

    bucket = SourceAnswer(
        source="store-scan", where="s3://b/*", answer="absent", detail=BUCKET_ABSENT,
        error="bucket 'b' does not exist", fix="aws s3api create-bucket --bucket b",
    )  # fmt: skip
    state, reason = decide(located(answer("receipt", "absent"), bucket), NONE, cached=False)
    assert state == "NOT_FOUND" and "bucket 'b' does not exist" in reason


class Slow:
    """A store whose reads take ``delay`` seconds (or fail)."""

    uri = "s3://slow"

    def __init__(self, delay: float) -> None:
        import threading

        self.delay = delay
        self.release = threading.Event()
        self.calls = 0

    def get(self, key: str) -> bytes:
        self.calls += 1
        if key == "broken":
            from npa.adapters.storage import ObjectAbsent

            raise ObjectAbsent("no such key")
        self.release.wait(self.delay)
        return b"data"


def test_a_bounded_store_gives_up_once_and_then_at_once() -> None:
    import re

    from npa.adapters.storage import ObjectAbsent, StoreUnavailable
    from npa.adapters.storage.bounded import BoundedStore

    fast = BoundedStore(Slow(0), 5)  # type: ignore[arg-type]
    assert fast.get("k") == b"data"
    with pytest.raises(ObjectAbsent):  # the store's own answers pass through unchanged
        fast.get("broken")
    inner = Slow(3600)
    silent = BoundedStore(inner, 0.2)  # type: ignore[arg-type]
    with pytest.raises(
        StoreUnavailable, match=re.escape("did not answer a read of k within 0.2 s")
    ):
        silent.get("k")
    with pytest.raises(StoreUnavailable):  # known silent now: not asked (nor waited for) again
        silent.get("other")
    assert inner.calls == 1
    inner.release.set()


def test_the_read_timeout_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from npa.adapters.storage.bounded import DEFAULT_READ_TIMEOUT, read_budget, read_timeout

    monkeypatch.delenv("NPA_READ_TIMEOUT", raising=False)
    assert read_timeout() == DEFAULT_READ_TIMEOUT < 30
    monkeypatch.setenv("NPA_READ_TIMEOUT", "7.5")
    assert read_timeout() == 7.5
    with read_budget(2):
        assert read_timeout() == 2
    for bad in ("0", "-1", "x", "1e9"):
        monkeypatch.setenv("NPA_READ_TIMEOUT", bad)
        with pytest.raises(InvalidInput):
            read_timeout()
