"""What ``status --watch`` reports while it follows a run: transitions, and a heartbeat.

Each poll gives a full :class:`~npa.services.status.StatusResult`; a :class:`Follower` compares
it with the previous one and says what changed, per stage, as events. When it printed nothing for
``heartbeat`` seconds it says so, with how long the run has been in its state (since the
state change it printed, whatever stage, job or waiting line came after it), so a quiet run
is never mistaken for a hung watch. Text mode prints the events as lines; ``--json`` prints
each as one JSON object per line (NDJSON) as it happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from npa.services.status import StageView, StatusResult

Kind = Literal["state", "job", "stage", "waiting", "heartbeat"]


class WatchEvent(BaseModel):
    """One thing ``--watch`` saw happen (``before`` is None the first time)."""

    event: Kind
    at: str  # when the poll that saw it was answered
    asked_from: str | None = None  # when that poll began asking (what it saw held in between)
    run_id: str
    stage: str | None = None
    # job events: the job the state belongs to; a relaunch's new job is a transition of its own
    # even when it starts in the state the old one was last seen in
    job_id: int | None = None
    before: str | None = None
    after: str
    detail: str = ""
    seconds_in_state: float | None = None  # heartbeat: how long the run has been in ``after``
    # heartbeat: the run was already in ``after`` when the watch began, so it has been in it
    # at least ``seconds_in_state``
    at_least: bool = False

    def text(self) -> str:
        what = "run" if self.stage is None else f"stage {self.stage}"
        if self.event == "heartbeat":
            return (
                f"{self.at} {what} still {self.after} "
                f"({'at least ' if self.at_least else ''}"
                f"{self.seconds_in_state or 0:.0f}s in this state)"
            )
        if self.event == "job":
            job = "job" if self.job_id is None else f"job {self.job_id}"
            line = f"{self.at} {job}: {self.before or '-'} -> {self.after}"
            return line + (f" ({self.detail})" if self.detail else "")
        if self.event == "waiting":
            return f"{self.at} {what} {self.after}, waiting: {self.detail}"
        # A change of waves alone keeps the state: say it once, never "X -> X".
        change = (
            f"{self.before} -> {self.after}"
            if self.before not in (None, self.after)
            else self.after
        )
        return f"{self.at} {what}: {change}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class Follower:
    """Turns successive status answers into events."""

    heartbeat: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _last: StatusResult | None = None
    _state_at: float = field(default=0.0)  # when the state event now in force was printed
    _state_seen_begin: bool = False  # that event was a change, not the state the watch found
    _beat_at: float = field(default=0.0)  # when the watch last printed anything

    def see(self, result: StatusResult) -> list[WatchEvent]:
        now = self.clock()
        before = self._last
        events: list[WatchEvent] = []

        def add(kind: Kind, after: str, **extra: object) -> None:
            events.append(
                WatchEvent(event=kind, at=result.checked_at, asked_from=result.asked_from,
                           run_id=result.run_id, after=after,
                           **extra)
            )  # fmt: skip

        if before is None or before.state != result.state:
            add("state", result.state, before=before.state if before else None,
                detail=result.reason)  # fmt: skip
            self._state_at, self._state_seen_begin = now, before is not None
        if result.job_state:
            add_job = _job_event(before, result)
            if add_job is not None:
                add("job", result.job_state, job_id=result.job_id, **add_job)
        for name, stage in result.stages.items():
            old = before.stages.get(name) if before is not None else None
            if old is None or (old.state, old.waves) != (stage.state, stage.waves):
                add("stage", stage.state, stage=name, before=old.state if old else None,
                    detail=_stage_detail(old, stage))  # fmt: skip
        # Why the run waits (a pod's reason, the controller's failed launches), each time the
        # answer changes: a watch that only says "still PENDING" hides what status knows.
        why = waiting_reason(result)
        if why and (before is None or waiting_reason(before) != why):
            add("waiting", result.state, detail=why)
        # Any line printed shows the watch is alive: the next heartbeat is due after a silence.
        # What it says is the time in the run's state, which a stage or waiting line leaves.
        if events:
            self._beat_at = now
        elif now - self._beat_at >= self.heartbeat:
            self._beat_at = now
            add("heartbeat", result.state, seconds_in_state=round(now - self._state_at, 1),
                at_least=not self._state_seen_begin)  # fmt: skip
        self._last = result
        return events


def _job_event(before: StatusResult | None, result: StatusResult) -> dict[str, object] | None:
    """What a job event says when the job's state or the job itself changed, else None."""
    if before is None or before.job_state is None:
        return {"before": None}
    if before.job_id != result.job_id:
        old = f"job {before.job_id}" if before.job_id is not None else "the earlier job"
        return {"before": None, "detail": f"replaces {old}, last seen {before.job_state}"}
    if before.job_state != result.job_state:
        return {"before": before.job_state}
    return None


def _stage_detail(old: StageView | None, stage: StageView) -> str:
    """What a stage event adds to its state: its waves when they changed, its failure."""
    detail = stage.waves if old is None or old.waves != stage.waves else ""
    if stage.failure_reason:
        detail = f"{detail}; {stage.failure_reason}".strip("; ")
    return detail


def waiting_reason(result: StatusResult) -> str:
    """Why the run waits, in one line: each pod's reason, then the latest failed launch."""
    reasons = [f"pod {p.pod}: {p.reason}: {p.message}" for p in result.pending]
    if result.launch_failures:
        count = len(result.launch_failures)
        reasons.append(f"{count} failed launch(es), the latest: {result.launch_failures[-1].error}")
    return "; ".join(reasons)
