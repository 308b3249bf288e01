"""The stray-job rule (npa.launch.strays): which names are the run's, which jobs under them are
strays, against the run histories the watcher and cancel meet."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.backends.base import TERMINAL_STATES, JobRecord, JobState
from npa.launch.strays import record_strays, run_job_names, strays
from npa.runs.manifest import ResumeRecord, RunManifest, StrayJob
from tests.tiers import examples

pytestmark = pytest.mark.unit

RUN = "20261203-070000-abc123"
BASE = f"npa-wf-{RUN}"


def manifest(job_name: str, relaunches: int = 0, resumes: int = 0) -> RunManifest:
    now = "2026-12-03T07:00:00+00:00"
    m = RunManifest(
        project="p", workflow="wf", run_id=RUN, backend="skypilot", infra="k8s/x",
        state="RUNNING", submitted_at=now, updated_at=now, store="s3://b/npa",
        prefix=f"wf/{RUN}/npa-workflow", spec_sha256="x", source_digest=None, plan_digest="x",
        tasks={}, images={}, job_name=job_name, job_id=1,
    )  # fmt: skip
    m.resumes = [resume(now, i) for i in range(1, resumes + 1)]
    m.supervisor.relaunches = relaunches
    return m


def resume(at: str, attempt: int) -> ResumeRecord:
    return ResumeRecord(at=at, attempt=attempt, previous_job_id=None, previous_state="FAILED",
                        adopted_stages=[], job_name=f"{BASE}-r{attempt}")  # fmt: skip


def job(job_id: int, name: str, state: JobState) -> JobRecord:
    return JobRecord(backend="skypilot", job_id=job_id, job_name=name, state=state)


@pytest.mark.parametrize(
    ("m", "names"),
    [
        (manifest(BASE), [BASE]),
        (manifest(f"{BASE}-a2", relaunches=2), [BASE, f"{BASE}-a1", f"{BASE}-a2"]),
        (manifest(f"{BASE}-r1", resumes=1), [BASE, f"{BASE}-r1"]),
        (
            manifest(f"{BASE}-r1-a1", relaunches=1, resumes=1),
            [BASE, f"{BASE}-r1", f"{BASE}-a1", f"{BASE}-r1-a1"],
        ),
    ],
)
def test_the_runs_names_are_those_it_reached(m: RunManifest, names: list[str]) -> None:
    assert sorted(run_job_names(m)) == sorted(names)


def test_a_name_the_run_has_not_reached_is_never_its_own() -> None:
    # The next relaunch and the next resume may be launching now: never a stray.
    names = run_job_names(manifest(f"{BASE}-a1", relaunches=1))
    assert f"{BASE}-a2" not in names and f"{BASE}-r1" not in names


@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.sampled_from(list(JobState))), min_size=0, max_size=12
    ),
    st.one_of(st.none(), st.integers(1, 40)),
)
@settings(max_examples=examples(200), deadline=None)
def test_a_stray_is_a_live_job_that_is_not_the_one_followed(
    rows: list[tuple[int, JobState]], keep: int | None
) -> None:
    records = [job(i, BASE, s) for i, s in rows]
    found = strays(records, keep)
    ids = [r.job_id for r in found]
    assert ids == sorted(set(ids))  # each once, in id order
    assert keep not in ids
    assert all(r.state not in TERMINAL_STATES for r in found)
    live = {i for i, s in rows if s not in TERMINAL_STATES and i != keep}
    assert set(ids) == live


def test_a_stray_is_recorded_once() -> None:
    m = manifest(BASE)
    ended = [StrayJob(job_id=2, job_name=BASE, state="PENDING", at="t", by="supervisor")]
    record_strays(m, ended)
    record_strays(m, ended)
    assert [s.job_id for s in m.supervisor.strays] == [2]
