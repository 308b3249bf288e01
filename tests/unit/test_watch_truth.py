"""The cluster tests' witness of ``status --watch`` (tests/integration/watch_truth.py) catches
each kind of untrue line: a check that cannot fail would prove nothing on the cluster."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.integration.watch_truth import Job, Printed, Sample, Task, Watched, untrue_lines

T0 = 1_800_000_000.0


def _line(t: float, event: str, after: str, **extra: Any) -> Printed:
    """A line whose poll asked its sources over the 3 s before ``t``."""
    at = datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")
    asked = datetime.fromtimestamp(t - 3, UTC).isoformat(timespec="milliseconds")
    event_ = {"event": event, "at": at, "asked_from": asked, "after": after, **extra}
    return Printed(t + 0.5, event_)


def _world(lines: list[Printed]) -> Watched:
    """A run whose job 7 ran from +30 to +100 s and failed; npa relaunched it as job 8 at
    +120 s, which ran from +150 s and failed at +200 s; the verdict FAILED landed at +210 s."""
    samples = (
        [Sample(T0 + s, None) for s in range(0, 5)]
        + [Sample(T0 + s, "RUNNING", 7) for s in range(5, 110)]
        + [Sample(T0 + s, "LAUNCHING", None) for s in range(110, 125)]
        + [Sample(T0 + s, "RUNNING", 8) for s in range(125, 210)]
        + [Sample(T0 + s, "FAILED", 8, (("fails", "FAILED"),)) for s in range(210, 230)]
    )
    jobs = {
        7: Job(7, "npa-w-r", "FAILED", T0 + 4, [Task("FAILED", T0 + 30, T0 + 100)]),
        8: Job(8, "npa-w-r-a1", "FAILED", T0 + 122, [Task("FAILED", T0 + 150, T0 + 200)]),
    }
    return Watched(1, lines, samples, jobs)


TRUE = [
    _line(T0 + 2, "state", "MANIFEST_PENDING"),
    _line(T0 + 10, "state", "PENDING"),
    _line(T0 + 10, "job", "PENDING", job_id=7),
    _line(T0 + 40, "state", "RUNNING"),
    _line(T0 + 40, "job", "RUNNING", job_id=7),
    _line(T0 + 104, "job", "FAILED", job_id=7),
    _line(T0 + 115, "state", "LAUNCHING"),
    _line(T0 + 130, "job", "PENDING", job_id=8),
    _line(T0 + 160, "job", "RUNNING", job_id=8),
    _line(T0 + 205, "job", "FAILED", job_id=8),
    _line(T0 + 212, "state", "FAILED"),
    _line(T0 + 212, "stage", "FAILED", stage="fails"),
]


def test_a_watch_that_said_only_what_was_true_passes() -> None:
    assert untrue_lines(_world(TRUE)) == []


@pytest.mark.parametrize(
    ("line", "why"),
    [
        # the first fault: the job's end taken for the run's verdict
        (_line(T0 + 104, "state", "FAILED"), "ahead of the verdict"),
        (_line(T0 + 205, "stage", "SUCCEEDED", stage="fails"), "neither the store nor a task"),
        (_line(T0 + 10, "job", "RUNNING", job_id=7), "SkyPilot's times say otherwise"),
        (_line(T0 + 160, "job", "RUNNING", job_id=9), "no job of the run has that id"),
        # SkyPilot's queue may say RUNNING a while after a task's end: the store tells here
        (_line(T0 + 160, "job", "RUNNING", job_id=7), "the store named another job"),
        (_line(T0 + 100, "job", "SUCCEEDED", job_id=7), "queue ends that job FAILED"),
        (_line(T0 + 60, "state", "LAUNCHING"), "did not record LAUNCHING"),
        (_line(T0 + 60, "state", "VERIFICATION_UNAVAILABLE"), "never shows"),
        (_line(T0 + 60, "state", "MANIFEST_PENDING"), "already there"),
    ],
)
def test_each_kind_of_untrue_line_is_caught(line: Printed, why: str) -> None:
    lines = sorted([*TRUE, line], key=lambda p: p.arrived)
    found = untrue_lines(_world(lines))
    assert found and any(why in f for f in found), found


def test_a_live_state_long_after_the_verdict_and_a_wrong_end_are_caught() -> None:
    stale = [*TRUE[:-2], _line(T0 + 212, "state", "FAILED"), _line(T0 + 400, "state", "RUNNING")]
    found = untrue_lines(_world(stale))
    assert any("followed by another state" in f for f in found), found
    assert any("had the verdict long before" in f for f in found), found
    assert any("the watch ended on RUNNING, the store on FAILED" in f for f in found), found


def test_what_skypilot_and_npa_really_do_between_moments_is_not_taken_for_an_untruth() -> None:
    """Seen on the cluster: a job of two tasks is PENDING again after its first task; status
    finds a relaunch's job by name before the manifest records its id; a stage's attempt is
    FAILED (the task's end) before npa records the stage; a job is CANCELLING."""
    w = _world(TRUE)
    two = [Task("SUCCEEDED", T0 + 30, T0 + 60), Task("FAILED", T0 + 70, T0 + 100)]
    w.jobs[7] = Job(7, "npa-w-r", "FAILED", T0 + 4, two)
    w.lines = sorted(
        [
            *TRUE,
            _line(T0 + 66, "job", "PENDING", job_id=7),  # between its two tasks
            _line(T0 + 80, "job", "CANCELLING", job_id=7),
            _line(T0 + 104, "stage", "FAILED", stage="fails"),  # the attempt, before the record
            _line(T0 + 123, "job", "PENDING", job_id=8),  # the manifest names no job yet
        ],
        key=lambda p: p.arrived,
    )
    assert untrue_lines(w) == []


def test_a_stage_that_never_ran_reads_cancelled_once_the_store_holds_the_runs_end() -> None:
    """The readers' rule for a final run (npa/runs/reading.py): a stage without a final record
    reads CANCELLED. Seen on the cluster: the stage after one that exited 0 without its outputs.
    Printed before the store held the run's end, the same line is untrue."""
    after_end = sorted([*TRUE, _line(T0 + 212, "stage", "CANCELLED", stage="after")],
                       key=lambda p: p.arrived)  # fmt: skip
    assert untrue_lines(_world(after_end)) == []
    early = sorted([*TRUE, _line(T0 + 150, "stage", "CANCELLED", stage="after")],
                   key=lambda p: p.arrived)  # fmt: skip
    found = untrue_lines(_world(early))
    assert any("after CANCELLED" in f for f in found), found
    # A stage whose record is final keeps its record: CANCELLED for it is untrue.
    wrong = sorted([*TRUE, _line(T0 + 212, "stage", "CANCELLED", stage="fails")],
                   key=lambda p: p.arrived)  # fmt: skip
    found = untrue_lines(_world(wrong))
    assert any("fails CANCELLED" in f for f in found), found


def test_a_job_is_pending_before_skypilot_stamps_its_submission() -> None:
    """SkyPilot's submitted_at is the moment a job leaves PENDING (NULL until STARTING), so a
    job line PENDING before it is true, and STARTING before it is not. Seen on the cluster: a
    relaunch's job found PENDING 15 s before its submitted_at."""
    w = _world(TRUE)
    w.jobs[8].submitted_at = T0 + 140
    assert untrue_lines(w) == []
    early = _world(sorted([*TRUE, _line(T0 + 130, "job", "STARTING", job_id=8)],
                          key=lambda p: p.arrived))  # fmt: skip
    early.jobs[8].submitted_at = T0 + 140
    found = untrue_lines(early)
    assert any("SkyPilot's times say otherwise" in f for f in found), found
