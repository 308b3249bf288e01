"""``cancel``: stop a run's job, by its immutable id, and only that job.

Repeat-safe: a run that never launched (reserved, planned or staged) is a successful no-op, and
so is a job already in a final state. A launch whose job id was never recorded is looked up by
the exact job name once; one match is cancelled by its id, several block (npa never acts on an
ambiguous name).

What it reports is what it saw after asking, never the request it made: ``cancelled`` when the
backend then reports the job CANCELLED, ``cancelling`` when the backend acknowledged and stops
it on its own time (CANCELLING), ``already_final`` when the job ended by itself meanwhile, and
``still_running`` (exit 1) when the job is still seen running once the backend had its while
to act on the cancel (:attr:`~npa.backends.base.ExecutionBackend.cancel_settle_seconds`: 60 s
for SkyPilot, whose controller looks for cancels every 15 s; ``NPA_CANCEL_SETTLE_SECONDS``
overrides it).

Whatever the job's outcome, it then removes what the launch put in place for this run alone
(the SkyPilot backend's run Secret, :func:`~npa.backends.base.release_ended_run`), so a cancel
run again finishes that too; when the API refuses, the outcome is still reported, with what
was left (``release_error``, exit 4).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from pydantic import Field

from npa.backends.base import ExecutionBackend, JobRecord, JobState, Released, release_ended_run
from npa.core.errors import EXIT_UNAVAILABLE, InvalidInput, NotFound, NpaError, Unavailable
from npa.core.layout import manifest_lock
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.launch.strays import end_strays, record_strays
from npa.runs.manifest import StrayJob, launch_generation, update_manifest
from npa.services.locate import Located, SourceAnswer, locate
from npa.services.status import open_located_backend


class CancelResult(Result):
    project: str
    run_id: str
    # cancelled | cancelling | already_final | never_launched | no_job | still_running
    outcome: str
    job_id: int | None
    backend: str | None
    job_state: str | None
    detail: str
    sources: list[SourceAnswer]
    # Other live jobs under the run's names (npa.launch.strays), cancelled by id.
    strays: list[StrayJob] = Field(default_factory=list)
    # What the launch had put in place for this run alone and cancel removed (by name).
    released: list[str] = Field(default_factory=list)
    # Why it could not be removed (the API refused or did not answer): exit 4, the outcome
    # above unchanged; the same cancel removes it once the API answers.
    release_error: str | None = None
    next: list[str] = Field(default_factory=list)

    def text_lines(self) -> list[str]:
        job = f" (job {self.job_id})" if self.job_id is not None else ""
        strays = [
            f"  also cancelled job {s.job_id} ({s.job_name}, was {s.state}): it carried the "
            "run's name without being its job"
            for s in self.strays
        ]
        released = Released(released=self.released, error=self.release_error).lines()
        return [f"run {self.run_id}{job}: {self.outcome}: {self.detail}", *strays, *released] + [
            f"  next: {n}" for n in self.next
        ]

    def exit_code(self) -> int:
        if self.outcome == "still_running":
            return 1
        return EXIT_UNAVAILABLE if self.release_error else 0


def _never_launched(located: Located) -> None:
    """No manifest and no receipt: nothing was ever launched, unless a source is unknown
    (Unavailable) or the run does not exist at all (NotFound)."""
    for source in located.unavailable:
        raise Unavailable(
            f"run {located.run_id}: {source.source} could not be read ({source.error}); "
            "npa cannot tell whether the run launched, so it cancels nothing",
            fix=source.fix or located.status_command(),
        )
    if located.reservation is None and not located.partial:
        raise NotFound(
            f"run {located.run_id} does not exist in project {located.project}",
            fix=f"npa workbench workflow list --project {located.project}",
        )


def _job_by_name(located: Located, backend: ExecutionBackend) -> int | None:
    """The one job carrying the run's name (a launch whose id was never recorded); None when
    there is none. Several are never guessed between."""
    name = located.job_name
    assert name is not None
    answer = backend.queue(name)  # BackendUnavailable propagates: exit 4, nothing cancelled
    ids = [r.job_id for r in answer.records]
    if len(ids) > 1:
        raise InvalidInput(
            f"several jobs carry the run's name {name} ({', '.join(map(str, ids))}); npa "
            "never cancels by name, so it cancels none of them",
            fix=located.status_command("--json"),
        )
    return ids[0] if ids else None


def cancel(
    run: str,
    project: str | None,
    *,
    workflow_uri: str | None = None,
    paths: NpaPaths | None = None,
) -> CancelResult:
    paths = paths or NpaPaths.from_env()
    located = locate(run, project, workflow_uri=workflow_uri, paths=paths)
    located.require_own_run()  # another run's manifest names no job of this run

    def result(outcome: str, detail: str, job_id: int | None, state: str | None) -> CancelResult:
        return CancelResult(
            project=located.project,
            run_id=located.run_id,
            outcome=outcome,
            job_id=job_id,
            backend=located.backend_name,
            job_state=state,
            detail=detail,
            sources=located.sources,
        )

    if located.backend_name is None:
        _never_launched(located)
        return result(
            "never_launched", "the run was never submitted: nothing to cancel", None, None
        )
    backend = open_located_backend(located, paths)
    outcome = _cancel_job(located, backend, result)
    outcome.strays = _end_strays(located, backend, paths, keep=outcome.job_id)
    generation = launch_generation(located.manifest)
    done = release_ended_run(backend, located.project, located.workflow, located.run_id, generation)
    outcome.released, outcome.release_error = done.released, done.error
    if done.error is not None:
        # The job's outcome stands as seen; what was left is said, with how to finish it.
        outcome.next += [c for c in (done.fix, located.cancel_command()) if c]
    return outcome


def _end_strays(
    located: Located, backend: ExecutionBackend, paths: NpaPaths, keep: int | None
) -> list[StrayJob]:
    """Cancel the run's other live jobs by id and record them in its manifest."""
    m = located.manifest
    if m is None or located.store is None or located.prefix is None:
        return []
    try:
        ended = end_strays(backend, m, keep, "cancel", lambda _line: None)
    except NpaError as error:
        raise Unavailable(
            f"run {located.run_id}: its job was handled, but npa could not ask for other jobs "
            f"under its names ({error.message})",
            fix=located.cancel_command(),
        ) from None
    if ended:
        lock = paths.lock(manifest_lock(located.project, located.run_id))
        update_manifest(located.store, located.prefix, lock, lambda mm: record_strays(mm, ended))
    return ended


def _cancel_job(
    located: Located,
    backend: ExecutionBackend,
    result: Callable[[str, str, int | None, str | None], CancelResult],
) -> CancelResult:
    """Cancel the job the run follows (its recorded id, or the one job carrying its name)."""
    job_id = located.job_id if located.job_id is not None else _job_by_name(located, backend)
    if job_id is None:
        name = located.job_name
        return result("no_job", f"no job named {name} exists: nothing to cancel", None, None)
    try:
        before = backend.job(job_id)
    except NotFound as error:
        return result("no_job", error.message, job_id, None)
    if located.job_name and before.job_name != located.job_name:
        raise Unavailable(
            f"job {job_id} on this {before.backend} backend is {before.job_name}, not the run's "
            f"{located.job_name}: it is not the backend the run was submitted to; nothing was "
            "cancelled",
            fix=located.status_command("--json"),
        )
    if before.state.terminal and not before.continuable:
        return result("already_final", f"job is {before.state.value}", job_id, before.state.value)
    try:
        backend.cancel(job_id)
    except NpaError as error:
        raise Unavailable(
            f"cancelling job {job_id} of run {located.run_id} failed: {error.message}",
            fix=error.fix or located.status_command(),
        ) from None
    return _seen_after(located, _settled(backend, job_id), result)


# Overrides how long cancel re-asks a job that still shows the state it had, before it says
# so (a controller acts on a cancel on its own time: the backend's cancel_settle_seconds).
SETTLE_ENV = "NPA_CANCEL_SETTLE_SECONDS"


def settle_seconds(backend: ExecutionBackend) -> float:
    """How long ``cancel`` waits for the backend to act on a cancel it sent."""
    return float(os.environ.get(SETTLE_ENV) or backend.cancel_settle_seconds)


def _settled(backend: ExecutionBackend, job_id: int) -> JobRecord:
    """The job as the backend shows it once the cancel took effect, or after the settle time."""
    deadline = time.monotonic() + settle_seconds(backend)
    after = backend.job(job_id)
    while not (after.state.terminal or after.state is JobState.CANCELLING):
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
        after = backend.job(job_id)
    return after


def _seen_after(
    located: Located,
    after: JobRecord,
    result: Callable[[str, str, int | None, str | None], CancelResult],
) -> CancelResult:
    """What the backend shows once the cancel was sent: the outcome is what was seen."""
    job_id, state = after.job_id, after.state
    if state is JobState.CANCELLED:
        return result("cancelled", "the job is seen CANCELLED", job_id, state.value)
    if state.terminal:
        return result(
            "already_final", f"the job ended {state.value} before it was stopped", job_id,
            state.value,
        )  # fmt: skip
    if state is JobState.CANCELLING:
        return result(
            "cancelling", "the backend acknowledged the cancel and is stopping the job", job_id,
            state.value,
        )  # fmt: skip
    outcome = result(
        "still_running", f"cancel was sent, but the job is still {state.value}", job_id,
        state.value,
    )  # fmt: skip
    outcome.next = [located.status_command(), located.cancel_command()]
    return outcome
