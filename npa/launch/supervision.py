"""How a failure is classified and what recovery it is allowed.

Four classes, each with its own recovery rule:

- ``actionable_configuration``: a person must change something (bad task, missing command,
  wrong accelerator). Automatic retry stops; only the exact attempt that failed is cancelled.
- ``transient_infrastructure``: the platform failed under us (controller refused or died,
  preemption, a node lost). Adopted, or retried under the same run id, until
  ``--max-infrastructure-recoveries`` is used up: then INFRASTRUCTURE_RECOVERY_EXHAUSTED.
- ``payload``: the stage's own command exited non-zero. Only ``--retries`` (or the stage's
  ``retries``) may run it again, counted per stage; infrastructure recoveries never spend on
  it.
- ``unknown``: npa cannot tell. Relaunch is blocked, because a blind retry may duplicate work.

Independently, the same startup failure seen ``--startup-failure-threshold`` times in a row is
FAILED_STARTUP: an infrastructure problem, not the payload's. Startup failures are refused
launches, jobs that ended FAILED_CONTROLLER (the jobs controller itself failed), and pods of a
live job that could not start while SkyPilot retries them by itself (an image it cannot pull:
:func:`count_startup_failure`); "the same" compares their signatures (:func:`failure_signature`).
A pod whose image the registry says is not there or not allowed is not counted towards that
threshold: it is actionable configuration at its first sight (:func:`classify_pull_failure`,
defined with the classes in :mod:`npa.core.faults` so that backends read pull failures the same
way), and the run ends FAILED_STARTUP at once.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from npa.backends.base import JobState
from npa.core.faults import PULL_REASONS, Classification, PullFault, classify_pull_failure
from npa.core.redaction import redact_shapes
from npa.core.text import clipped
from npa.runs.manifest import SupervisorAttempt, SupervisorRecord, now_iso

__all__ = [
    "PULL_REASONS",
    "Classification",
    "PullFault",
    "classify_pull_failure",
]

# The status a pod that could not start is counted under: the job's own state (PENDING or
# STARTING) varies between the controller's attempts of one fault, so it is not part of it.
POD_START = "POD_START"


class Recovery(StrEnum):
    RETRIED = "retried"  # a new attempt under the same run id
    ADOPTED = "adopted"  # the existing attempt was kept, by job id
    STOPPED = "stopped"  # automatic retry stopped; a person must act
    BLOCKED = "blocked"  # relaunch blocked: existence or cause unknown
    EXHAUSTED = "exhausted"  # the finite recovery budget is spent


@dataclass(frozen=True)
class Policy:
    """The supervision limits a submit was given."""

    startup_failure_threshold: int = 3
    max_infrastructure_recoveries: int = 3
    retries: int | None = None  # --retries; None means each stage's own ``retries``

    def payload_retries(self, stage_retries: int) -> int:
        return self.retries if self.retries is not None else stage_retries


@dataclass(frozen=True)
class Verdict:
    classification: Classification
    recovery: Recovery
    terminal_state: JobState | None  # set when the run must end now


# Exit codes of a shell that mean "the command itself cannot run as written".
_NOT_RUNNABLE = {126: "command found but not executable", 127: "command not found"}
# Exit 75 (EX_TEMPFAIL in sysexits.h): a temporary failure, to be tried again. npa's stage
# library (npa/templates/skypilot-stage.sh) ends a SkyPilot node with it when the store stopped
# answering past its patience, and a command may say the same of itself: on every backend it is
# transient infrastructure, recovered under --max-infrastructure-recoveries.
TEMPORARY_FAILURE = 75
# Signals that mean the process was taken away from under the payload.
_INFRA_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGBUS}


def classify_exit(returncode: int) -> tuple[Classification, str]:
    """Classify a stage process's exit status (negative = killed by that signal)."""
    if returncode in _NOT_RUNNABLE:
        return Classification.ACTIONABLE_CONFIGURATION, f"exit {returncode}: " + _NOT_RUNNABLE[
            returncode
        ]
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return Classification.UNKNOWN, f"killed by unknown signal {-returncode}"
        if sig in _INFRA_SIGNALS:
            return Classification.TRANSIENT_INFRASTRUCTURE, f"killed by {sig.name}"
        return Classification.PAYLOAD, f"killed by {sig.name}"
    if returncode == TEMPORARY_FAILURE:
        return Classification.TRANSIENT_INFRASTRUCTURE, (
            f"exit {returncode}: a temporary failure (the store stopped answering, or the "
            "command said it failed for now)"
        )
    return Classification.PAYLOAD, f"exit {returncode}"


# How SkyPilot's terminal failure statuses read as classes.
_STATUS_CLASS = {
    "FAILED": Classification.PAYLOAD,
    "FAILED_SETUP": Classification.ACTIONABLE_CONFIGURATION,
    "FAILED_PRECHECKS": Classification.ACTIONABLE_CONFIGURATION,
    "FAILED_NO_RESOURCE": Classification.TRANSIENT_INFRASTRUCTURE,
    "FAILED_CONTROLLER": Classification.TRANSIENT_INFRASTRUCTURE,
}


def classify_job_status(status: str) -> Classification:
    """Classify a job that ended in a failure status."""
    return _STATUS_CLASS.get(status, Classification.UNKNOWN)


def classify_failed_job(status: str, exit_codes: Sequence[int]) -> Classification:
    """Classify a job that ended in a failure status, from its status and the exit codes of its
    program as its backend reports them (one per node; none when the backend knows none): a job
    whose every non-zero exit is a temporary failure (exit 75, the stage library's store
    outage) is transient infrastructure, as the same exit is on the local backend; any other
    job is classified by its status."""
    failed = [code for code in exit_codes if code != 0]
    if failed and all(code == TEMPORARY_FAILURE for code in failed):
        return classify_exit(TEMPORARY_FAILURE)[0]
    return classify_job_status(status)


# Job-end statuses that mean the controller failed to run the job, not the payload.
STARTUP_STATUSES = frozenset({"FAILED_CONTROLLER"})


def failure_signature(status: str, reason: str | None) -> str:
    """What makes two failures "identical": the status and the reason with its numbers (job
    ids, pids, timestamps, counts) folded, so one fault seen on successive jobs compares
    equal."""
    if not reason:
        return status
    folded = re.sub(r"\d+", "N", " ".join(reason.split()))
    return f"{status}: {clipped(folded, 300)}"


def _kept(text: str) -> str:
    """What the backend or a pod said, as the run's manifest keeps it: a credential in it (a
    stage's echo, a URL with a password) is taken out first, before it is compared or stored."""
    return redact_shapes(text)


def record(
    supervisor: SupervisorRecord,
    *,
    what: str,
    failure: str,
    classification: Classification,
    detail: str,
    policy: Policy,
    payload_budget: int = 0,
    startup: bool = False,
    stage: str | None = None,
) -> Verdict:
    """Add one failure to ``supervisor``, decide the recovery, and return the verdict."""
    failure, detail = _kept(failure), _kept(detail)
    verdict = _decide(supervisor, failure, classification, policy, payload_budget, startup)
    if verdict.recovery is Recovery.RETRIED:
        if classification is Classification.TRANSIENT_INFRASTRUCTURE:
            supervisor.infrastructure_recoveries += 1
        elif classification is Classification.PAYLOAD:
            supervisor.payload_retries += 1
    if startup:
        supervisor.startup_failures += 1
    supervisor.classification = classification.value
    supervisor.recovery = verdict.recovery.value
    supervisor.attempts.append(
        SupervisorAttempt(
            at=now_iso(),
            what=what,
            failure=failure,
            classification=classification.value,
            recovery=verdict.recovery.value,
            detail=detail,
            startup=startup,
            stage=stage,
        )
    )
    return verdict


def count_startup_failure(
    supervisor: SupervisorRecord,
    *,
    what: str,
    failure: str,
    detail: str,
    policy: Policy,
    stage: str | None = None,
    classification: Classification = Classification.TRANSIENT_INFRASTRUCTURE,
) -> Verdict:
    """Count one startup failure of a job that is still live: SkyPilot retries the start by
    itself, so npa relaunches nothing and keeps the job (adopted) until the identical failure
    has been seen ``--startup-failure-threshold`` times in a row; then the run is
    FAILED_STARTUP and the job must be cancelled. An actionable configuration fault (an image
    the registry says is absent or forbidden) stops at once: no count, no threshold."""
    failure, detail = _kept(failure), _kept(detail)
    stop = (
        classification is Classification.ACTIONABLE_CONFIGURATION
        or _identical_run(supervisor, failure) + 1 >= policy.startup_failure_threshold
    )
    verdict = Verdict(
        classification,
        Recovery.STOPPED if stop else Recovery.ADOPTED,
        JobState.FAILED_STARTUP if stop else None,
    )
    supervisor.startup_failures += 1
    supervisor.classification = verdict.classification.value
    supervisor.recovery = verdict.recovery.value
    supervisor.attempts.append(
        SupervisorAttempt(
            at=now_iso(),
            what=what,
            failure=failure,
            classification=verdict.classification.value,
            recovery=verdict.recovery.value,
            detail=detail,
            startup=True,
            stage=stage,
        )
    )
    return verdict


def image_fault(supervisor: SupervisorRecord) -> bool:
    """Whether the run's supervisor stopped it on an image it cannot pull as configured (the
    registry's not-found or forbidden answer, or a reference that cannot be pulled): what a
    person runs next is then the image check, never the same launch again."""
    last = supervisor.attempts[-1] if supervisor.attempts else None
    if last is None or last.classification != Classification.ACTIONABLE_CONFIGURATION.value:
        return False
    reason = last.failure.removeprefix(f"{POD_START}: ").split(":", 1)[0]
    return last.failure.startswith(f"{POD_START}: ") and reason in PULL_REASONS


def payload_retries_of(supervisor: SupervisorRecord, stage: str) -> int:
    """How many payload retries ``stage`` has had: each stage has its own ``--retries``."""
    return sum(
        1
        for a in supervisor.attempts
        if a.stage == stage
        and a.classification == Classification.PAYLOAD.value
        and a.recovery == Recovery.RETRIED.value
    )


def _identical_run(supervisor: SupervisorRecord, failure: str) -> int:
    """How many of the latest startup attempts in a row failed exactly like ``failure``."""
    count = 0
    for attempt in reversed(supervisor.attempts):
        startup = attempt.startup or attempt.what == "launch"  # older records lack the flag
        if not startup or attempt.failure != failure:
            break
        count += 1
    return count


def _decide(
    supervisor: SupervisorRecord,
    failure: str,
    classification: Classification,
    policy: Policy,
    payload_budget: int,
    startup: bool,
) -> Verdict:
    if startup and _identical_run(supervisor, failure) + 1 >= policy.startup_failure_threshold:
        return Verdict(classification, Recovery.STOPPED, JobState.FAILED_STARTUP)
    if classification is Classification.ACTIONABLE_CONFIGURATION:
        state = JobState.FAILED_STARTUP if startup else JobState.FAILED
        return Verdict(classification, Recovery.STOPPED, state)
    if classification is Classification.UNKNOWN:
        state = JobState.FAILED_STARTUP if startup else JobState.FAILED
        return Verdict(classification, Recovery.BLOCKED, state)
    if classification is Classification.TRANSIENT_INFRASTRUCTURE:
        if supervisor.infrastructure_recoveries >= policy.max_infrastructure_recoveries:
            return Verdict(
                classification, Recovery.EXHAUSTED, JobState.INFRASTRUCTURE_RECOVERY_EXHAUSTED
            )
        return Verdict(classification, Recovery.RETRIED, None)
    # payload
    if payload_budget > 0:
        return Verdict(classification, Recovery.RETRIED, None)
    return Verdict(classification, Recovery.STOPPED, JobState.FAILED)
