"""How long ``cancel`` waits for a sent cancel to show, per backend: one rule
(:func:`npa.services.cancel.settle_seconds`), tested on a clock the test moves, never on time.

SkyPilot's jobs controller looks for cancel requests every 15 s and only then marks the job
CANCELLING; on the loaded CI of 2026-12-05 a job of the real cluster was still RUNNING 20 s
after its cancel, and cancel said ``still_running`` (exit 1) for a cancel that then took."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from npa.backends.base import JobRecord, JobState
from npa.backends.skypilot.backend import CONTROLLER_CANCEL_ROUND, SkyPilotBackend
from npa.core.paths import NpaPaths
from npa.services import cancel as cancel_service

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SlowController:
    """A backend whose job shows the cancel ``acts_after`` seconds after it was sent (never,
    with None)."""

    def __init__(self, clock: Clock, acts_after: float | None, settle: float) -> None:
        self.clock, self.acts_after, self.cancel_settle_seconds = clock, acts_after, settle

    def job(self, job_id: int) -> JobRecord:
        acted = self.acts_after is not None and self.clock.now >= self.acts_after
        state = JobState.CANCELLING if acted else JobState.RUNNING
        return JobRecord(backend="skypilot", job_id=job_id, job_name="j", state=state)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(
        cancel_service, "time", SimpleNamespace(monotonic=c.monotonic, sleep=c.sleep)
    )
    monkeypatch.delenv(cancel_service.SETTLE_ENV, raising=False)
    return c


def skypilot_settle() -> float:
    return SkyPilotBackend(NpaPaths(Path("/nonexistent")), context=None).cancel_settle_seconds


def test_skypilot_gives_its_controller_several_cancel_rounds() -> None:
    assert skypilot_settle() >= 3 * CONTROLLER_CANCEL_ROUND


@pytest.mark.parametrize("rounds", [0, 1, 2, 3])
def test_a_cancel_the_controller_takes_within_its_rounds_is_seen(clock: Clock, rounds: int) -> None:
    """The controller acts at its next look (up to a round away) plus ``rounds`` slowed ones."""
    acts_after = CONTROLLER_CANCEL_ROUND * (rounds + 1) - 0.5
    backend = SlowController(clock, acts_after, skypilot_settle())
    seen = cancel_service._settled(backend, 7)  # type: ignore[arg-type]
    assert seen.state is JobState.CANCELLING
    assert acts_after <= clock.now <= acts_after + 1.0  # it stops asking once it is seen


def test_a_cancel_never_acted_on_is_reported_after_the_settle_time(clock: Clock) -> None:
    backend = SlowController(clock, None, skypilot_settle())
    seen = cancel_service._settled(backend, 7)  # type: ignore[arg-type]
    assert seen.state is JobState.RUNNING
    assert skypilot_settle() <= clock.now <= skypilot_settle() + 1.0


def test_the_environment_overrides_the_backend(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cancel_service.SETTLE_ENV, "2")
    backend = SlowController(clock, None, skypilot_settle())
    cancel_service._settled(backend, 7)  # type: ignore[arg-type]
    assert 2.0 <= clock.now <= 3.0
    monkeypatch.setenv(cancel_service.SETTLE_ENV, "")  # empty: the backend's own
    assert cancel_service.settle_seconds(backend) == skypilot_settle()  # type: ignore[arg-type]
