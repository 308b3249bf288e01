"""The rules every reader of a stored run applies, each defined once here.

``list``, ``status``, ``artifacts``, ``logs``, ``cancel`` and ``insights ingest-run`` read runs
back from the store. Each of them must agree on three things, so each calls these functions
rather than deciding for itself:

- **Whose manifest it is** (:func:`check_run_identity`, defined in
  :mod:`npa.runs.identity_rule`): a manifest counts as the run's only when its run id,
  workflow, prefix and project all agree with the key it is stored under (and the project
  asked about). One that disagrees (copied or written under another run's key) is a
  :class:`~npa.core.errors.RunMismatch`, reported with the same message by every reader, and
  none of its state is shown.
- **What each stage's state reads as** (:func:`shown_stage_states`): a final run shows only
  final stage states. The stage the run ended in reads as the run's end state; any other stage
  whose record is not final reads ``CANCELLED`` (the state SkyPilot gives the tasks of a
  pipeline that ended before them), with a note that says whether it was stopped or never ran.
- **How many waves a stage has** (:func:`planned_waves`): the plan's count, not the number of
  wave records written so far.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from npa.backends.base import JobState
from npa.plan.model import WorkflowPlan
from npa.runs.identity_rule import RunKey as RunKey
from npa.runs.identity_rule import check_run_identity as check_run_identity
from npa.runs.identity_rule import key_of_prefix_uri as key_of_prefix_uri
from npa.runs.manifest import RunManifest, StageRecord

FINAL = frozenset(s.value for s in JobState if s.terminal)
FAILED = frozenset(s.value for s in JobState if s.failed)
# What a stage of a final run reads as when its record was not final.
CUT_SHORT = JobState.CANCELLED.value


# --- waves --------------------------------------------------------------------------------------


def planned_waves(plan: WorkflowPlan | None) -> dict[str, int]:
    """Each stage's number of waves as the run's plan has it (empty without a plan)."""
    return {} if plan is None else {s.name: s.waves.waves for s in plan.stages}


def wave_count(rec: StageRecord | None, planned: int | None) -> tuple[int, int | None]:
    """(waves succeeded, waves in the stage): counted against the plan; without one, against the
    wave records (None when there are none either)."""
    waves = rec.waves if rec is not None else []
    done = sum(w.state == "SUCCEEDED" for w in waves)
    if planned is not None:
        return done, planned
    return done, (len(waves) or None)


# --- stage states of a final run ---------------------------------------------------------------


@dataclass(frozen=True)
class ShownStage:
    """A stage's state as every reader shows it, and the record it came from."""

    state: str
    recorded: str
    note: str | None = None  # why the state shown is not the record
    never_ran: bool = False  # a final run's stage that never started
    run_end: str | None = None  # the run's end state, for a final run
    ended_at: str | None = None  # the stage the run ended in, when one can be named


def _started(rec: StageRecord | None) -> bool:
    return rec is not None and (
        rec.state != "PENDING" or rec.started_at is not None or bool(rec.waves)
    )


def _ended_at(m: RunManifest, order: list[str], recorded: dict[str, str], end: str) -> str | None:
    """The stage a final run ended in: the first (in plan order) that records the run's own end,
    else the first that failed, else the first that started and never recorded an end."""
    if end != "SUCCEEDED":
        for wanted in ({end}, FAILED):
            found = next((n for n in order if recorded[n] in wanted), None)
            if found is not None:
                return found
    return next((n for n in order if recorded[n] not in FINAL and _started(m.stages.get(n))), None)


def shown_stage_states(
    m: RunManifest, order: list[str], run_state: str | None = None
) -> dict[str, ShownStage]:
    """Each stage of ``order`` as readers show it. ``run_state`` is the run's state as the reader
    decided it (a backend's answer may be final before the manifest is); the run is final when
    that, or the manifest's state, is."""
    recorded = {n: (m.stages[n].state if n in m.stages else "PENDING") for n in order}
    end = run_state if run_state in FINAL else (m.state if m.state in FINAL else None)
    if end is None:
        return {n: ShownStage(state=s, recorded=s) for n, s in recorded.items()}
    at = _ended_at(m, order, recorded, end)
    where = f" at stage {at}" if at is not None else ""
    shown: dict[str, ShownStage] = {}
    for name in order:
        state = recorded[name]
        base = ShownStage(state=state, recorded=state, run_end=end, ended_at=at)
        if state in FINAL:
            shown[name] = base
        elif name == at:
            note = f"the run ended {end} in this stage; its record still said {state}"
            shown[name] = replace(base, state=end, note=note)
        elif _started(m.stages.get(name)):
            note = f"stopped: the run ended {end}{where} while this stage was {state}"
            shown[name] = replace(base, state=CUT_SHORT, note=note)
        else:
            note = f"never ran, because the run ended {end}{where}" + (
                "" if at is not None else " before this stage started"
            )
            shown[name] = replace(base, state=CUT_SHORT, note=note, never_ran=True)
    return shown
