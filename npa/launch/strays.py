"""Jobs that carry a run's name without being its job, and how they are ended.

The launch transaction adopts exactly one job per launch, by id. A backend can still create a
second job for one request (SkyPilot's API server retries a request internally when the jobs
controller is locked; both attempts may launch), leaving a job under the run's name that nobody
follows. One rule decides which jobs those are, for the watcher and for ``cancel`` alike:

- the run's names are those its manifest has used: the run's own job name, each resume's, and
  each relaunch (``-a<N>``) up to the count the supervisor recorded; never a name the run has
  not reached yet (a launch of it may be under way);
- a *stray* is a job under one of those names that is still going and is not the job the run
  follows now (``keep``; ``None`` when every live job of the run is to end, as on ``cancel``).

A stray is cancelled by its id, never by name, and recorded in the manifest's
``supervisor.strays``.
"""

from __future__ import annotations

from collections.abc import Callable

from npa.backends.base import ExecutionBackend, JobRecord
from npa.core.layout import job_name, relaunch_job_name
from npa.runs.manifest import RunManifest, StrayJob, now_iso


def run_job_names(m: RunManifest) -> list[str]:
    """Every job name the run has used, oldest first."""
    bases = [job_name(m.workflow, m.run_id), *(r.job_name for r in m.resumes)]
    names = [*bases]
    for base in bases:
        names += [relaunch_job_name(base, n) for n in range(1, m.supervisor.relaunches + 1)]
    names.append(m.job_name)
    return list(dict.fromkeys(names))


def strays(records: list[JobRecord], keep: int | None) -> list[JobRecord]:
    """The jobs of ``records`` (all under the run's names) that are going and not ``keep``."""
    found = {r.job_id: r for r in records if not r.state.terminal and r.job_id != keep}
    return [found[i] for i in sorted(found)]


def end_strays(
    backend: ExecutionBackend,
    m: RunManifest,
    keep: int | None,
    by: str,
    log: Callable[[str], None],
) -> list[StrayJob]:
    """Cancel every stray of the run by id; returns what was cancelled (to be recorded).
    :class:`~npa.core.errors.BackendUnavailable` from the queue propagates: nothing is known,
    nothing is cancelled."""
    ended: list[StrayJob] = []
    for job in strays(backend.jobs_named(run_job_names(m)), keep):
        follows = f"job {keep}" if keep is not None else "no job"
        log(f"job {job.job_id} ({job.job_name}, {job.state.value}) carries the run's name but the "
            f"run follows {follows}: cancelling it by id")  # fmt: skip
        backend.cancel(job.job_id)
        seen = job.state.value
        ended.append(
            StrayJob(job_id=job.job_id, job_name=job.job_name, state=seen, at=now_iso(), by=by)
        )
    return ended


def record_strays(m: RunManifest, ended: list[StrayJob]) -> None:
    """Add ``ended`` to the manifest's record (once per job id)."""
    seen = {s.job_id for s in m.supervisor.strays}
    m.supervisor.strays += [s for s in ended if s.job_id not in seen]
