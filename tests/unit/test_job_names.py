"""Job and launch names of a run's attempts: a relaunch is read against the run's own job
name, so no run id (whatever its random tail) and no resume is ever mistaken for one."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.core.layout import (
    job_name,
    launch_name,
    relaunch_job_name,
    relaunch_suffix,
    resume_job_name,
)

pytestmark = pytest.mark.unit

# Every run id new_run_id can draw, including the tails that end like "-a<digits>".
run_ids = st.builds(
    lambda when, tail: f"{when:%Y%m%d-%H%M%S}-{tail}",
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31)),
    st.one_of(
        st.text("0123456789abcdef", min_size=6, max_size=6),
        st.text("0123456789", min_size=5, max_size=5).map(lambda d: "a" + d),
    ),
)
workflows = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)


@given(workflows, run_ids, st.integers(0, 5), st.integers(1, 50))
def test_each_attempt_of_each_resume_has_its_own_name_and_journal(
    workflow: str, run_id: str, resumes: int, relaunch: int
) -> None:
    base = resume_job_name(workflow, run_id, resumes) if resumes else job_name(workflow, run_id)
    again = relaunch_job_name(base, relaunch)
    # The run id stays whole in every attempt's name.
    assert again.startswith(f"npa-{workflow}-{run_id}")
    assert relaunch_suffix(base, base) == ""
    assert relaunch_suffix(again, base) == f".a{relaunch}"
    names = {
        launch_name("p", run_id, resumes=r, job_name=n, base=b)
        for r in range(resumes + 1)
        for b in [resume_job_name(workflow, run_id, r) if r else job_name(workflow, run_id)]
        for n in [b, *(relaunch_job_name(b, a) for a in range(1, relaunch + 1))]
    }
    assert len(names) == (resumes + 1) * (relaunch + 1)


def test_a_drawn_run_id_that_ends_like_a_relaunch_is_not_one() -> None:
    run_id = "20261202-021519-a94508"
    base = job_name("tiny-local", run_id)
    assert relaunch_job_name(base, 1) == f"npa-tiny-local-{run_id}-a1"
    assert launch_name("p", run_id, resumes=0, job_name=base, base=base) == f"launch.p.{run_id}"


def test_a_name_that_is_no_attempt_of_the_base_gets_a_journal_of_its_own() -> None:
    # One an earlier npa derived from the tail alone: it must not share the run's journal.
    base = job_name("tiny-local", "20261202-021519-a94508")
    old = "npa-tiny-local-20261202-021519-a1"
    assert relaunch_suffix(old, base) == f".{old}"
    assert relaunch_suffix(f"{base}-a1x", base) == f".{base}-a1x"
