"""The launch transaction: one run, one job, ever.

1. Readiness: when the backend needs it, its API must be stable (:mod:`npa.launch.readiness`).
2. Lock: an owner-only lock per run (``locks/launch.<project>.<run>.lock``); a second submit of
   the same run waits for it and then finds the first one's job.
3. Earlier evidence: the run's launch journal may hold a job id (adopt it, by id) or a launch
   request whose answer never arrived (resolve that request before anything else: the job may
   exist without being visible yet).
4. Reconcile: ask the backend's structured queue for the exact job name. One match: adopt its
   job id. Several, or no answer: existence is ambiguous, so stop. None (an authoritative
   answer): the job is proven absent, launch.
5. Launch: journal the request id at once, then resolve it to a job id. A transient refusal is
   retried only after step 4 proves absence again and step 1 re-establishes stability; the
   supervision policy bounds how often.

Nothing here ever cancels or launches by name; every identity is a job id.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from npa.backends.base import ExecutionBackend, JobState, JobSubmission
from npa.core.errors import (
    AmbiguousExistence,
    BackendUnavailable,
    LaunchRejected,
    LaunchStopped,
    NotFound,
    TransientRefusal,
)
from npa.core.fsio import exclusive_lock
from npa.launch.readiness import ReadinessCheck, ReadinessRecord
from npa.launch.supervision import Classification, Policy, record
from npa.runs.journal import OperationJournal
from npa.runs.manifest import SupervisorRecord

Observer = Callable[[str], None]
DEFAULT_LOCK_TIMEOUT = 600.0


class LockRecord(BaseModel):
    path: str
    waited_seconds: float


class ReconcileRecord(BaseModel):
    source: str
    job_name: str
    answer: Literal["absent", "found", "several", "unavailable"]
    job_ids: list[int] = Field(default_factory=list)
    detail: str | None = None


class AttemptRecord(BaseModel):
    attempt: int
    request_id: str | None
    outcome: Literal["accepted", "refused", "rejected", "unresolved", "resolved-earlier"]
    job_id: int | None = None
    detail: str | None = None


class LaunchTransaction(BaseModel):
    """What the transaction did; ``--json`` prints it as ``launch_transaction``."""

    backend: str
    job_name: str
    readiness: list[ReadinessRecord] = Field(default_factory=list)
    lock: LockRecord | None = None
    journal: str
    evidence: dict[str, Any] | None = None  # what an earlier, interrupted submit left
    reconcile: list[ReconcileRecord] = Field(default_factory=list)
    attempts: list[AttemptRecord] = Field(default_factory=list)
    adopted_job_id: int | None = None
    launched_job_id: int | None = None
    outcome: Literal["launched", "adopted"] | None = None

    @property
    def job_id(self) -> int | None:
        return self.launched_job_id if self.launched_job_id is not None else self.adopted_job_id


def _status_fix(run_id: str, project: str) -> str:
    return shlex.join(
        ["npa", "workbench", "workflow", "status", run_id, "--project", project, "--json"]
    )


class Transaction:
    def __init__(
        self,
        backend: ExecutionBackend,
        submission: JobSubmission,
        *,
        journal: OperationJournal,
        lock_path: Path,
        readiness: ReadinessCheck | None,
        policy: Policy,
        supervisor: SupervisorRecord,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        observe: Observer | None = None,
    ) -> None:
        self.backend = backend
        self.submission = submission
        self.journal = journal
        self.lock_path = lock_path
        self.readiness = readiness
        self.policy = policy
        self.supervisor = supervisor
        self.lock_timeout = lock_timeout
        self.observe = observe or (lambda step: None)
        self.record = LaunchTransaction(
            backend=backend.name, job_name=submission.job_name, journal=str(journal.path)
        )

    # --- helpers -----------------------------------------------------------------------------
    def _fix(self) -> str:
        return _status_fix(self.submission.run_id, self.submission.project)

    def _establish(self) -> None:
        if self.readiness is not None:
            self.record.readiness.append(self.readiness.establish())

    def _adopt(self, job_id: int, how: str) -> LaunchTransaction:
        self.record.adopted_job_id = job_id
        self.record.outcome = "adopted"
        self.journal.append("adopted", "done", job_id=job_id, how=how)
        self.observe("launch_accepted")
        return self.record

    def _earlier(self) -> tuple[int | None, list[str]]:
        """The job id an earlier submit recorded, and requests it left unresolved."""
        job_id: int | None = None
        requested: list[str] = []
        resolved: set[str] = set()
        for entry in self.journal.records():
            step = entry.get("step")
            if step in ("accepted", "adopted") and isinstance(entry.get("job_id"), int):
                job_id = entry["job_id"]
            elif step == "requested" and isinstance(entry.get("request_id"), str):
                requested.append(entry["request_id"])
            elif step in ("refused", "rejected") and isinstance(entry.get("request_id"), str):
                resolved.add(entry["request_id"])
        return job_id, [r for r in requested if r not in resolved]

    def _reconcile(self) -> list[int]:
        name = self.submission.job_name
        try:
            answer = self.backend.queue(name)
        except BackendUnavailable as exc:
            self.record.reconcile.append(
                ReconcileRecord(
                    source=self.backend.queue_source,
                    job_name=name,
                    answer="unavailable",
                    detail=exc.message,
                )
            )
            self.journal.append("reconciled", "failed", answer="unavailable", detail=exc.message)
            raise AmbiguousExistence(
                f"cannot tell whether job {name!r} exists: the {self.backend.name} queue did "
                f"not answer ({exc.message}); npa will not launch a possible duplicate",
                fix=self._fix() + "  # then rerun the same submit once the queue answers",
                details={"launch_transaction": self.record.model_dump(mode="json")},
            ) from None
        ids = sorted({r.job_id for r in answer.records if r.job_name == name})
        verdict: Literal["absent", "found", "several"] = (
            "absent" if not ids else "found" if len(ids) == 1 else "several"
        )
        self.record.reconcile.append(
            ReconcileRecord(source=answer.source, job_name=name, answer=verdict, job_ids=ids)
        )
        self.journal.append("reconciled", "done", answer=verdict, job_ids=ids)
        if verdict == "several":
            raise AmbiguousExistence(
                f"{len(ids)} jobs are named {name!r} (ids {', '.join(map(str, ids))}); npa "
                "adopts exactly one job per run and will neither guess nor act by name",
                fix=self._fix() + "  # decide which job id is the run's; cancel others by id",
                details={"launch_transaction": self.record.model_dump(mode="json")},
            )
        return ids

    # --- the transaction ---------------------------------------------------------------------
    def run(self) -> LaunchTransaction:
        self._establish()
        started = time.monotonic()
        with exclusive_lock(
            self.lock_path, timeout=self.lock_timeout, purpose="launching this run's job"
        ):
            self.record.lock = LockRecord(
                path=str(self.lock_path), waited_seconds=round(time.monotonic() - started, 3)
            )
            self.journal.append("locked", "done", lock=str(self.lock_path))
            self.observe("locked")
            return self._locked()

    def _locked(self) -> LaunchTransaction:
        known, pending = self._earlier()
        self.record.evidence = {"job_id": known, "unresolved_requests": pending}
        if known is not None:
            try:
                self.backend.job(known)
            except NotFound:
                raise AmbiguousExistence(
                    f"the launch journal names job {known} but the {self.backend.name} backend "
                    "says it does not exist; npa will not launch a second job for this run",
                    fix=self._fix(),
                ) from None
            except BackendUnavailable as exc:
                raise AmbiguousExistence(
                    f"cannot confirm job {known}: {exc.message}", fix=self._fix()
                ) from None
            return self._adopt(known, "journal")
        for request_id in pending:
            outcome = self._resolve(request_id, attempt=0)
            if outcome is not None:
                return self._adopt(outcome, "earlier request")

        attempt = 0
        while True:
            ids = self._reconcile()
            if ids:
                return self._adopt(ids[0], "queue")
            attempt += 1
            request_id = self.backend.request_launch(self.submission)
            self.journal.append("requested", "started", request_id=request_id, attempt=attempt)
            self.observe("launch_requested")
            job_id = self._resolve(request_id, attempt=attempt)
            if job_id is not None:
                self.record.launched_job_id = job_id
                self.record.outcome = "launched"
                self.observe("launch_accepted")
                return self.record
            # Refused: retry only after absence is proven again and the API is stable again.
            self._establish()

    def _resolve(self, request_id: str, *, attempt: int) -> int | None:
        """The job id a request created; None when it was refused transiently (and the
        supervision policy allows another attempt)."""
        try:
            job_id = self.backend.launch_result(request_id)
        except TransientRefusal as refusal:
            self.record.attempts.append(
                AttemptRecord(
                    attempt=attempt,
                    request_id=request_id,
                    outcome="refused",
                    detail=refusal.message,
                )
            )
            self.journal.append("refused", "failed", request_id=request_id, detail=refusal.message)
            verdict = record(
                self.supervisor,
                what="launch",
                failure=refusal.details.get("signature", refusal.message),
                classification=Classification.TRANSIENT_INFRASTRUCTURE,
                detail=refusal.message,
                policy=self.policy,
                startup=True,
            )
            if verdict.terminal_state is not None:
                raise LaunchStopped(
                    f"launch of {self.submission.job_name!r} ends "
                    f"{verdict.terminal_state.value}: {refusal.message} "
                    f"({self.supervisor.startup_failures} startup failures, "
                    f"{self.supervisor.infrastructure_recoveries} infrastructure recoveries)",
                    state=verdict.terminal_state,
                    fix=(self.backend.controller_fix(self.submission.project) or self._fix())
                    + "  # the controller side",
                ) from None
            return None
        except LaunchRejected as rejected:
            self.record.attempts.append(
                AttemptRecord(
                    attempt=attempt,
                    request_id=request_id,
                    outcome="rejected",
                    detail=rejected.message,
                )
            )
            self.journal.append(
                "rejected", "failed", request_id=request_id, detail=rejected.message
            )
            record(
                self.supervisor,
                what="launch",
                failure=rejected.message,
                classification=Classification.ACTIONABLE_CONFIGURATION,
                detail=rejected.message,
                policy=self.policy,
                startup=True,
            )
            raise LaunchStopped(
                f"the {self.backend.name} backend rejected job {self.submission.job_name!r}: "
                f"{rejected.message}",
                state=JobState.FAILED_STARTUP,
                fix=rejected.fix,
            ) from None
        except BackendUnavailable as exc:
            self.record.attempts.append(
                AttemptRecord(
                    attempt=attempt, request_id=request_id, outcome="unresolved", detail=exc.message
                )
            )
            raise AmbiguousExistence(
                f"launch request {request_id} was sent but its answer could not be read "
                f"({exc.message}); the job may exist, so npa stops rather than launch again",
                fix=self._fix() + "  # rerunning the same submit resolves this request first",
                details={"launch_transaction": self.record.model_dump(mode="json")},
            ) from None
        self.record.attempts.append(
            AttemptRecord(
                attempt=attempt,
                request_id=request_id,
                outcome="accepted" if attempt else "resolved-earlier",
                job_id=job_id,
            )
        )
        self.journal.append("accepted", "done", request_id=request_id, job_id=job_id)
        return job_id
