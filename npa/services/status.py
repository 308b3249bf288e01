"""``status`` and ``list``: a run's state from every source that knows it, and the runs of a
project from the durable store.

``status`` resolves the run (:mod:`npa.services.locate`), then asks the backend for its job by
id (never by name, except to find the id of a launch whose id was never recorded), and for a
waiting job of a backend whose pods can say why they wait, asks them. The state it reports is
decided by :func:`decide` from those answers alone: a source that could not be asked makes the
state VERIFICATION_UNAVAILABLE, never NOT_FOUND, and NOT_FOUND needs every applicable source to
have answered that the run is not there. ``--cached`` reads only local records and the store and
says so: CACHED is evidence, not truth. Both commands only read, but for ``list`` completing
the project's run index once (:mod:`npa.runs.index`), and for ``status`` removing what a run
whose state it found final had of its own on the cluster (its Secret,
:func:`~npa.backends.base.release_ended_run`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from npa.adapters.kube.controller import ControllerReach
from npa.adapters.kube.pods import IMAGE_REASONS, PodReason
from npa.backends import LOCAL_INFRA
from npa.backends.base import (
    POD_REASONS_SOURCE,
    ChecksController,
    ExecutionBackend,
    JobRecord,
    JobState,
    LaunchFailure,
    PolledByWatcher,
    Released,
    ReportsLaunchFailures,
    ReportsPodReasons,
    TaskRecord,
    release_ended_run,
)
from npa.core.commands import logs_command
from npa.core.errors import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, NotFound, NpaError
from npa.core.layout import relaunch_suffix
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.launch.supervision import classify_pull_failure, image_fault
from npa.plan.model import WorkflowPlan
from npa.runs.manifest import (
    RunManifest,
    StageRecord,
    base_job_name,
    job_stages,
    launch_generation,
    read_plan,
)
from npa.runs.reading import (
    planned_waves,
    shown_stage_states,
    wave_count,
)
from npa.services.listing import PLAN_ONLY as PLAN_ONLY
from npa.services.listing import VERIFICATION_UNAVAILABLE as VERIFICATION_UNAVAILABLE
from npa.services.listing import RunList as RunList
from npa.services.listing import RunRow as RunRow
from npa.services.listing import list_runs as list_runs
from npa.services.locate import (
    Answer,
    Located,
    SourceAnswer,
    cmd,
    locate,
)

MANIFEST_PENDING = "MANIFEST_PENDING"
NOT_SUBMITTED = "NOT_SUBMITTED"
NOT_FOUND = "NOT_FOUND"
CACHED = "CACHED"
LAUNCH_INCOMPLETE = "LAUNCH_INCOMPLETE"
TERMINAL = frozenset(s.value for s in JobState if s.terminal)
FAILED_STATES = frozenset(s.value for s in JobState if s.failed)
WAITING = frozenset({"PENDING", "STARTING", "RECOVERING"})
# How a launch error says the cluster has no room for what the task asks.
_NO_ROOM = re.compile(
    r"ResourcesUnavailable|[Ii]nsufficient|No launchable resource|not enough|does not fit|"
    r"[Ff]ailed to acquire resources"
)


class JobAnswer(BaseModel):
    """What the backend said about the run's job."""

    answer: str  # found | absent | unadopted | unavailable | skipped | not_applicable
    record: JobRecord | None = None
    # ``unadopted``: the jobs that carry the name of a relaunch in flight before the supervisor
    # adopted one of them by id ("<id> (<state>)"); evidence, never the run's job.
    candidates: list[str] = Field(default_factory=list)
    # Stage -> the job's task that runs it (backends with per-task records: SkyPilot).
    stage_tasks: dict[str, TaskRecord] = Field(default_factory=dict)


class StageView(BaseModel):
    """One stage's state and where it comes from: ``backend`` (the job's own task for the
    stage, asked now), ``manifest`` (npa's record: final states, the local supervisor's
    progress), ``adopted`` (the manifest's record of an earlier job whose work a resume kept),
    or ``unknown`` (the backend could not tell; the state is then VERIFICATION_UNAVAILABLE)."""

    state: str
    waves: str  # "2/3 waves succeeded": counted against the run's plan
    waves_succeeded: int = 0
    waves_planned: int | None = None  # from the run's plan.json (None when it was not read)
    source: str = "manifest"
    task: str | None = None  # the backend task that reported the state
    recorded_state: str | None = None  # the manifest's record, when the state shown differs
    failure_reason: str | None = None
    classification: str | None = None
    detail: str | None = None


class StatusResult(Result):
    """``status``: the run's state, how it was decided, and what to run next."""

    project: str
    run_id: str
    workflow: str | None
    state: str
    trustworthy: bool  # False for CACHED and VERIFICATION_UNAVAILABLE: never gate on them
    last_known_state: str | None  # the manifest's recorded state, when there is one
    reason: str
    backend: str | None
    job_id: int | None
    job_name: str | None
    job_state: str | None
    failure_reason: str | None = None
    run_prefix: str | None
    pending: list[PodReason] = Field(default_factory=list)
    # The launches the job's controller tried and failed while a task still waits to try again.
    launch_failures: list[LaunchFailure] = Field(default_factory=list)
    stages: dict[str, StageView] = Field(default_factory=dict)
    supervisor: dict[str, Any] | None = None
    sources: list[SourceAnswer]
    next: list[str] = Field(default_factory=list)
    checked_at: str
    # When this answer began asking its sources: every source answered between it and
    # ``checked_at``, so the answer says what was true in that span (None: an older answer).
    asked_from: str | None = None
    watched: bool = False
    # The backend ended the job and npa has not recorded its verdict yet; ``supervised`` says
    # whether a supervisor on this machine is there to record it (None: cannot tell from here).
    verdict_pending: bool = False
    supervised: bool | None = None
    # What this answer removed of the run's own launch resources because the run is final
    # (:func:`~npa.backends.base.release_ended_run`), or why it could not: beside the state,
    # never part of it.
    release: Released = Field(default_factory=Released)

    def text_lines(self) -> list[str]:
        head = f"run {self.run_id}: {self.state}"
        if self.state == CACHED:
            head += f" (last known: {self.last_known_state}; NOT live-verified, not for automation)"
        lines = [head, f"  {self.reason}"]
        if self.job_id is not None:
            named = f" ({self.job_name})" if self.job_name else ""
            state = self.job_state or "state not reported"
            lines.append(f"  job: {self.backend} {self.job_id}{named}: {state}")
        if self.failure_reason:
            lines.append(f"  failure: {self.failure_reason}")
        lines += [_pod_line(p) for p in self.pending]
        if self.launch_failures:
            last = self.launch_failures[-1]
            lines.append(
                f"  launch: {plural(len(self.launch_failures), 'failed launch', 'failed launches')}"
                f" so far, the controller retries; the latest: {last.error}"
            )
        lines += [_stage_line(name, stage) for name, stage in self.stages.items()]
        if self.supervisor and self.supervisor.get("classification"):
            sup = self.supervisor
            lines.append(
                f"  supervisor: {sup['classification']} -> {sup['recovery']} "
                f"({plural(len(sup.get('attempts', [])), 'attempt')})"
            )
        for stray in (self.supervisor or {}).get("strays", []):
            lines.append(
                f"  stray job {stray['job_id']} ({stray['job_name']}, was {stray['state']}): "
                f"carried the run's name without being its job; cancelled by {stray['by']}"
            )
        lines += self.release.lines()
        lines.append("  sources:")
        for s in self.sources:
            tail = f": {s.detail}" if s.detail else ""
            tail += f" ({s.error})" if s.error else ""
            lines.append(f"    {s.source}: {s.answer}{tail}  [{s.where}]")
        lines += [f"  next: {n}" for n in self.next]
        return lines

    def exit_code(self) -> int:
        if self.state == NOT_FOUND:
            return EXIT_NOT_FOUND
        if self.state == VERIFICATION_UNAVAILABLE:
            return EXIT_UNAVAILABLE
        if self.watched and self.state in TERMINAL and self.state != "SUCCEEDED":
            return EXIT_FAILURE
        if self.watched and self.unsupervised:
            return EXIT_FAILURE
        return 0

    @property
    def unsupervised(self) -> bool:
        """The job ended and nobody will record the run's verdict until the submit is run
        again: a watch ends here rather than wait for ever."""
        return self.verdict_pending and self.supervised is False


def _pod_line(p: PodReason) -> str:
    image = f" image {p.image}" if p.image else ""
    seen = f" ({p.count} pods failed to start so; pod events)" if p.source == "events" else ""
    fault = ""
    if p.reason in IMAGE_REASONS:
        read = classify_pull_failure(p.message, image=p.image, reason=p.reason)
        fault = f" [{read.classification.value}: {read.why}]"
    return f"  pod {p.namespace}/{p.pod}: {p.reason}{image}: {p.message}{seen}{fault}"


def _stage_line(name: str, stage: StageView) -> str:
    extra = f" [{stage.classification}] {stage.detail}" if stage.classification else ""
    if not stage.classification and stage.detail:
        extra = f": {stage.detail}"
    if stage.failure_reason:
        extra += f" ({stage.failure_reason})"
    origin = stage.task or stage.source
    return f"  stage {name}: {stage.state} ({stage.waves}; {origin}){extra}"


# --- deciding ----------------------------------------------------------------------------------


def decide(
    located: Located, job: JobAnswer, *, cached: bool, polled: bool = False
) -> tuple[str, str]:
    """The run's state and why, from the sources' answers alone. ``polled``: the job runs
    under a controller npa does not own, so its end is evidence and the verdict is the
    supervisor's (a backend that hosts npa's executor records the verdict in the job itself)."""
    m = located.manifest
    if m is not None:
        return _decide_recorded(m, job, cached=cached, polled=polled)
    return _decide_unrecorded(located, job, cached=cached)


def relaunch_in_flight(m: RunManifest | None) -> int | None:
    """The attempt number of a relaunch the supervisor has asked for and not adopted a job of
    yet (the manifest names the relaunch's job and no id), else None. Until it adopts one by id,
    a job under that name may be a duplicate the backend made of the request, which the
    supervisor then cancels: such a job is evidence, not the run's job."""
    if m is None or m.job_id is not None or m.state != "LAUNCHING":
        return None
    attempt = relaunch_suffix(m.job_name, base_job_name(m)).removeprefix(".a")
    return int(attempt) + 1 if attempt.isdigit() else None


def _jobs(held: list[str]) -> str:
    """``job 5 (PENDING) carries`` / ``jobs 5 (PENDING), 6 (PENDING) carry``."""
    return f"job {held[0]} carries" if len(held) == 1 else f"jobs {', '.join(held)} carry"


def _decide_recorded(
    m: RunManifest, job: JobAnswer, *, cached: bool, polled: bool
) -> tuple[str, str]:
    """The run's state when its manifest was read."""
    if cached:
        return CACHED, f"the manifest records {m.state}; the backend was not asked (--cached)"
    if m.state in TERMINAL:
        return m.state, "the manifest records a final state (final states never change)"
    if job.answer == "found" and job.record is not None:
        record = job.record
        if polled and record.state.terminal and not record.continuable:
            # The backend's end is evidence; the run's end is npa's verdict (outputs checked,
            # a retry or relaunch decided), which only the supervisor records.
            return m.state, (
                f"the {m.backend} backend ended job {record.job_id} {record.state.value}; "
                "npa's verdict (outputs checked, retries decided) is not recorded yet"
            )
        return record.state.value, f"the {m.backend} backend reports job {record.job_id}"
    attempt = relaunch_in_flight(m)
    if attempt is not None and job.answer in ("absent", "unadopted"):
        carried = (
            f"{_jobs(job.candidates)} that name, not adopted yet"
            if job.candidates
            else "no job carries that name yet"
        )
        return "LAUNCHING", (
            f"the supervisor is relaunching the run as {m.job_name} (attempt {attempt}); {carried}"
        )
    if job.answer == "unavailable":
        return VERIFICATION_UNAVAILABLE, (
            f"the manifest says {m.state}, but the {m.backend} backend could not be asked"
        )
    if job.answer == "absent" and m.job_id is None:
        return LAUNCH_INCOMPLETE, (
            "the manifest was written but no job carries the run's name: the launch never completed"
        )
    if job.answer == "absent":
        return VERIFICATION_UNAVAILABLE, (
            f"the manifest names job {m.job_id}, which the backend does not know; npa "
            "cannot tell what became of it"
        )
    return m.state, "the manifest's recorded state"


def _decide_unrecorded(located: Located, job: JobAnswer, *, cached: bool) -> tuple[str, str]:
    """The run's state when no manifest was read (none yet, or the store did not answer)."""
    manifest = located.answer("manifest")
    unavailable = [s.source for s in located.unavailable]
    evidence = (located.receipt is not None) or job.answer == "found"
    if located.mismatch is not None:
        return VERIFICATION_UNAVAILABLE, located.mismatch.message
    if manifest is not None and manifest.answer == "unavailable":
        return VERIFICATION_UNAVAILABLE, "the store could not be asked for the manifest"
    if evidence:
        why = "a submission receipt" if located.receipt is not None else "a backend job"
        if cached:
            return CACHED, f"{why} exists and the manifest has not landed (--cached)"
        return MANIFEST_PENDING, f"{why} exists and the manifest has not landed yet"
    if unavailable:
        return VERIFICATION_UNAVAILABLE, (
            f"no evidence of the run, but {', '.join(unavailable)} could not be asked"
        )
    if located.partial:
        return PLAN_ONLY, "objects exist under the run prefix but nothing was submitted"
    if located.reservation is not None:
        return NOT_SUBMITTED, "the run id is reserved; nothing was staged or submitted"
    bucket = next(
        (s for s in located.sources if s.detail == "the bucket itself does not exist"), None
    )
    if bucket is not None:
        return NOT_FOUND, f"{bucket.error}: so no run can be there"
    return NOT_FOUND, "every applicable source answered that this run does not exist"


# --- asking the backend and the cluster ----------------------------------------------------------


def open_located_backend(located: Located, paths: NpaPaths) -> ExecutionBackend:
    """The backend the run was submitted to, as its manifest or receipt recorded it."""
    from npa.backends import open_backend

    name = located.backend_name
    assert name is not None
    return open_backend(name, paths, context=located.kube_context)


def ask_job(
    located: Located, backend: ExecutionBackend | None, *, cached: bool
) -> tuple[JobAnswer, SourceAnswer]:
    """The job by its recorded id; by exact name only to find the id of an unrecorded launch."""
    name = located.backend_name
    where = f"{name} backend"
    if backend is None:
        return JobAnswer(answer="not_applicable"), SourceAnswer(
            source="backend-job", where="-", answer="not_applicable", detail="no job recorded"
        )
    if cached:
        return JobAnswer(answer="skipped"), SourceAnswer(
            source="backend-job", where=where, answer="skipped", detail="--cached: not contacted"
        )
    m = located.manifest
    if m is not None and m.state in TERMINAL:
        return JobAnswer(answer="skipped"), SourceAnswer(
            source="backend-job", where=where, answer="skipped", detail="final state recorded"
        )
    try:
        where = f"{name}: {backend.queue_source}"
        if located.job_id is not None:
            record = backend.job(located.job_id)
        else:
            assert located.job_name is not None
            queue = backend.queue(located.job_name)
            if queue.records and relaunch_in_flight(m) is not None:
                held = [f"{r.job_id} ({r.state.value})" for r in queue.records]
                return JobAnswer(answer="unadopted", candidates=held), SourceAnswer(
                    source="backend-job",
                    where=where,
                    answer="found",
                    detail=f"{_jobs(held)} {located.job_name}; the supervisor has not adopted "
                    "a job of this relaunch yet",
                )
            if len(queue.records) > 1:
                ids = ", ".join(str(r.job_id) for r in queue.records)
                return JobAnswer(answer="unavailable"), SourceAnswer(
                    source="backend-job",
                    where=where,
                    answer="unavailable",
                    detail=f"several jobs carry the run's name ({ids}): ambiguous",
                    fix=located.status_command(),
                )
            if not queue.records:
                return JobAnswer(answer="absent"), SourceAnswer(
                    source="backend-job",
                    where=where,
                    answer="absent",
                    detail=f"no job named {located.job_name}",
                )
            record = queue.records[0]
        stage_tasks = backend.stage_tasks(record, job_stages(m)) if m is not None else {}
    except NotFound as error:
        return JobAnswer(answer="absent"), SourceAnswer(
            source="backend-job", where=where, answer="absent", detail=error.message
        )
    except NpaError as error:
        return JobAnswer(answer="unavailable"), SourceAnswer(
            source="backend-job",
            where=where,
            answer="unavailable",
            error=f"{error.kind}: {error.message}",
            fix=error.fix,
        )
    if located.job_name and record.job_name != located.job_name:
        # Job ids are per controller (or per NPA_HOME for the local backend): the same id seen
        # from elsewhere can be another run's job. Never report that job's state as this run's.
        return JobAnswer(answer="unavailable"), SourceAnswer(
            source="backend-job",
            where=where,
            answer="unavailable",
            detail=f"job {record.job_id} here is {record.job_name}, not {located.job_name}: "
            "this backend is not the one the run was submitted to",
            fix=located.status_command("--cached"),
        )
    per_stage = ", ".join(f"{st} {t.state.value}" for st, t in _by_task(stage_tasks))
    return JobAnswer(answer="found", record=record, stage_tasks=stage_tasks), SourceAnswer(
        source="backend-job",
        where=where,
        answer="found",
        detail=f"job {record.job_id} {record.state.value}"
        + (f" ({per_stage})" if per_stage else ""),
    )


def _controller_cause(located: Located, job: JobAnswer, backend: ExecutionBackend | None) -> str:
    """When the job's queue did not answer and the backend's controller is a pod: the cluster's
    view of that pod joins the sources, and the reason gains its cause ("" when it has none)."""
    if job.answer != "unavailable" or not isinstance(backend, ChecksController):
        return ""
    reach = backend.controller_reach(located.project)
    located.sources.append(controller_source(backend, reach))
    return f"; {reach.detail}" if reach.answer == "unreachable" else ""


def controller_source(backend: ChecksController, reach: ControllerReach) -> SourceAnswer:
    """The job controller as the cluster sees it, asked when its queue did not answer: a
    controller whose kubelet stopped answering is the cause, not a job that ended."""
    answers: dict[str, Answer] = {"reachable": "found", "absent": "absent"}
    answer = answers.get(reach.answer, "unavailable")
    fix = backend.controller_node_fix(reach.node) if reach.node and answer != "found" else None
    return SourceAnswer(
        source="jobs-controller",
        where="its pod and node",
        answer=answer,
        detail=reach.detail,
        fix=fix,
    )


def ask_pods(
    backend: ReportsPodReasons, record: JobRecord, project: str
) -> tuple[list[PodReason], SourceAnswer]:
    """Why a waiting job's pods wait, from the pods themselves and from the events of those
    that could not start and are gone."""
    pods = backend.pods_source(project)
    where = pods.where
    if pods.missing is not None:
        return [], SourceAnswer(
            source=POD_REASONS_SOURCE, where=where, answer="not_applicable", detail=pods.missing
        )
    try:
        reasons = backend.pending_reasons(record, project)
    except Exception as exc:
        return [], SourceAnswer(
            source=POD_REASONS_SOURCE,
            where=where,
            answer="unavailable",
            error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            fix=pods.fix,
        )
    detail = "; ".join(
        f"{r.pod}: {r.reason}" + (f" ({r.count} pods, from events)" if r.source == "events" else "")
        for r in reasons
    )
    return reasons, SourceAnswer(
        source=POD_REASONS_SOURCE,
        where=where,
        answer="found" if reasons else "absent",
        detail=detail or "no waiting pod and no pod that failed to start",
    )


def ask_launches(
    backend: ReportsLaunchFailures, record: JobRecord
) -> tuple[list[LaunchFailure], SourceAnswer]:
    """The launches a waiting job's controller tried and failed (no pod exists to say why)."""
    where, fix = backend.launch_failures_source(record)
    try:
        failures = backend.launch_failures(record)
    except NpaError as error:
        return [], SourceAnswer(
            source="launch-attempts", where=where, answer="unavailable", error=error.message,
            fix=fix,
        )  # fmt: skip
    detail = (
        f"{plural(len(failures), 'failed launch', 'failed launches')}; latest: {failures[-1].error}"
        if failures
        else "no failed launch recorded yet"
    )
    return failures, SourceAnswer(
        source="launch-attempts",
        where=where,
        answer="found" if failures else "absent",
        detail=detail,
        fix=fix if failures else None,
    )


# --- the result --------------------------------------------------------------------------------


def _by_task(stage_tasks: dict[str, TaskRecord]) -> list[tuple[str, TaskRecord]]:
    return sorted(stage_tasks.items(), key=lambda item: item[1].task_id)


def read_run_plan(located: Located) -> WorkflowPlan | None:
    """The run's recorded plan (``plan.json``), or None when it cannot be read: the stages'
    order and wave counts then come from the manifest alone."""
    if located.store is None or located.prefix is None:
        return None
    try:
        return read_plan(located.store, located.prefix)
    except NpaError:
        return None


def plan_order(m: RunManifest, plan: WorkflowPlan | None) -> list[str]:
    """The run's stages in plan order: the manifest's record of it, else the run's plan
    (manifests written before the order was recorded); what neither names comes last."""
    order = list(m.order) or (list(plan.order) if plan is not None else [])
    known = set(order)
    for name in [*m.stages, *m.tasks]:
        if name not in known:
            known.add(name)
            order.append(name)
    return order


def _recorded_view(rec: StageRecord | None, planned: int | None) -> StageView:
    """A stage as the manifest records it, its waves counted against the plan."""
    done, total = wave_count(rec, planned)
    waves = "no waves recorded" if total is None else f"{done}/{total} waves succeeded"
    return StageView(
        state=rec.state if rec is not None else "PENDING",
        waves=waves,
        waves_succeeded=done,
        waves_planned=planned,
        classification=rec.classification if rec else None,
        detail=rec.detail if rec else None,
    )


def _stage_view(name: str, view: StageView, job: JobAnswer, adopted: bool, state: str) -> StageView:
    """One stage: its own task's state while the backend reports per task, else the record."""
    recorded = view.state
    record = job.record
    task = job.stage_tasks.get(name)
    unknown: str | None = None
    if adopted:
        view.source = "adopted"
        view.detail = view.detail or "adopted from an earlier job when the run resumed"
    elif record is not None and task is not None:
        view.state, view.source = task.state.value, "backend"
        view.task = f"{record.backend} job {record.job_id} task {task.task_id} {task.task_name}"
        view.recorded_state = recorded if recorded != view.state else None
        view.failure_reason = task.failure_reason
        if task.details and not task.state.terminal and not view.classification:
            view.detail = task.details
    elif record is not None and record.tasks:
        unknown = f"job {record.job_id} has no task npa can tell runs this stage"
    elif state == VERIFICATION_UNAVAILABLE and recorded not in TERMINAL:
        unknown = f"the backend could not be asked; the manifest last recorded {recorded}"
    if unknown is not None:  # never the manifest's stale state, never absent
        view.state, view.source, view.recorded_state = VERIFICATION_UNAVAILABLE, "unknown", recorded
        view.detail = unknown
    return view


def _stages(
    m: RunManifest, job: JobAnswer, state: str, order: list[str], plan: WorkflowPlan | None
) -> dict[str, StageView]:
    """Every stage of the run, in plan order. While the job is live and its backend reports per
    task, each launched stage's state is its own task's; otherwise it is the manifest's record,
    unless the backend could not be asked about a stage the manifest holds as live. A final run
    shows only final stage states (:func:`npa.runs.reading.shown_stage_states`)."""
    adopted = job_stages(m).adopted
    waves = planned_waves(plan)
    views = {
        name: _stage_view(
            name, _recorded_view(m.stages.get(name), waves.get(name)), job, name in adopted, state
        )
        for name in order
    }
    shown = shown_stage_states(m, order, state if state != CACHED else None)
    for name, view in views.items():
        if view.state in TERMINAL or shown[name].run_end is None:
            continue
        view.recorded_state = shown[name].recorded
        view.state, view.detail = shown[name].state, shown[name].note
    return views


def run_spec(located: Located) -> str | None:
    """The spec file the run was prepared from, as this machine's reservation records it (None
    on a machine that did not prepare it: no path of the user's can be guessed)."""
    return located.reservation.spec if located.reservation else None


def _preflight_images(located: Located, spec: str | None) -> str | None:
    """The command that resolves and verifies every image of the run's spec, with the fix of
    each one that cannot be pulled."""
    if spec is None:
        return None
    return cmd("workbench", "workflow", "preflight-images", spec, "--project", located.project,
               "--json")  # fmt: skip


def _gpus(located: Located, spec: str | None) -> str:
    """The command that compares what the run's stages ask with what the nodes have."""
    ctx = ["--context", located.kube_context] if located.kube_context else []
    return cmd("workbench", "workflow", "gpus", *ctx, *(["--spec", spec] if spec else []))


def _pod_fixes(located: Located, pending: list[PodReason], spec: str | None) -> list[str | None]:
    """What to run about each reason a pod waits."""
    out: list[str | None] = []
    for reason in pending:
        if reason.reason in IMAGE_REASONS:
            out.append(_preflight_images(located, spec))
        elif reason.reason == "Unschedulable":
            out.append(_gpus(located, spec))
    return out


def _why_waiting(
    located: Located, backend: ExecutionBackend | None, record: JobRecord
) -> tuple[list[PodReason], list[LaunchFailure], list[str]]:
    """Why a waiting job waits, from what its backend can tell: its pods, and the launches its
    controller failed while a task waits to try again (with what to run about those)."""
    pending: list[PodReason] = []
    if isinstance(backend, ReportsPodReasons):
        pending, pods = ask_pods(backend, record, located.project)
        located.sources.append(pods)
    launches: list[LaunchFailure] = []
    fixes: list[str] = []
    if isinstance(backend, ReportsLaunchFailures) and any(t.waiting for t in record.tasks):
        launches, attempts = ask_launches(backend, record)
        located.sources.append(attempts)
        fixes = _launch_fixes(located, launches, attempts.fix)
    return pending, launches, fixes


def _launch_fixes(located: Located, launches: list[LaunchFailure], log: str | None) -> list[str]:
    """What to run about launches the controller keeps failing: read its log, and when the
    cluster has no room for what a stage asks, compare the two."""
    if not launches:
        return []
    out = [log] if log else []
    if _NO_ROOM.search(launches[-1].error):
        out.append(_gpus(located, run_spec(located)))
    return out


def _recorded_failure(m: RunManifest | None) -> str | None:
    """Why a run the manifest records as failed ended: the detail of the stage it ended in."""
    if m is None or m.state not in FAILED_STATES:
        return None
    return next((r.detail for r in m.stages.values() if r.state == m.state and r.detail), None)


def submit_again(located: Located, spec: str | None, *, resume: bool) -> str | None:
    """The submit that picks the run up again, with the infra and policy it was submitted
    with (a plain rerun continues its job; ``resume`` starts a new job that adopts the work
    done); None without the spec file (:func:`run_spec`)."""
    if spec is None:
        return None
    argv = ["workbench", "workflow", "submit", spec, "--project", located.project]
    argv += ["--resume-run" if resume else "--run-id", located.run_id]
    m = located.manifest
    if m is not None:
        argv += ["--infra", m.infra] if m.infra != LOCAL_INFRA else []
        policy = m.policy
        # The runtime asked for (a run of host processes is continued as host processes).
        runtime = policy.get("runtime", "auto")
        argv += ["--runtime", str(runtime)] if runtime != "auto" else []
        if policy.get("retries") is not None:
            argv += ["--retries", str(policy["retries"])]
        for flag, key in (
            ("--startup-failure-threshold", "startup_failure_threshold"),
            ("--max-infrastructure-recoveries", "max_infrastructure_recoveries"),
        ):
            if policy.get(key, 3) != 3:
                argv += [flag, str(policy[key])]
        argv += [] if policy.get("resolve_accelerators", True) else ["--no-resolve-accelerators"]
    return cmd(*argv)


def _next(
    located: Located,
    state: str,
    pending: list[PodReason],
    stages: dict[str, StageView],
    controller_fix: str | None,
    record: JobRecord | None = None,
    *,
    reattach: bool = False,
) -> list[str]:
    run, project = located.run_id, located.project
    spec = run_spec(located)
    out = _pod_fixes(located, pending, spec)
    if reattach:
        # The job ended with no supervisor to judge it: the same submit starts one, which
        # records the verdict (never a second launch).
        out.append(submit_again(located, spec, resume=False))
    # The stage whose log says why: the one that failed, else the first that did not succeed.
    failed = next((n for n, v in stages.items() if v.state in FAILED_STATES), None) or next(
        (n for n, v in stages.items() if v.state != "SUCCEEDED"), None
    )
    logs = logs_command(run, project, failed) if failed else None
    artifacts = cmd("workbench", "workflow", "artifacts", run, "--project", project, "--json")
    resume = submit_again(located, spec, resume=True)
    if record is not None and record.continuable:
        # No executor, no final state: the same submit starts one that continues this job.
        out += [submit_again(located, spec, resume=False), logs]
    elif state in ("FAILED", "FAILED_SETUP", "FAILED_NO_RESOURCE"):
        out += [artifacts, logs]
    elif state == "FAILED_STARTUP" and _image_fault(located):
        # The registry said the image is not there or not allowed: the same launch would get the
        # same answer. Find and fix the image (a launched run never changes: the fixed spec is
        # a new run).
        out.append(_preflight_images(located, spec))
    elif state in ("FAILED_STARTUP", "FAILED_CONTROLLER", "INFRASTRUCTURE_RECOVERY_EXHAUSTED"):
        out += [controller_fix or logs, resume]
    elif state == "SUCCEEDED":
        out.append(artifacts)
    else:
        out += _next_unfinished(located, state, resume)
    return list(dict.fromkeys(c for c in out if c))


def _image_fault(located: Located) -> bool:
    return located.manifest is not None and image_fault(located.manifest.supervisor)


def _next_unfinished(located: Located, state: str, resume: str | None) -> list[str]:
    """What to run next for a run that has not ended, or whose state npa cannot tell."""
    if state in (NOT_SUBMITTED, PLAN_ONLY, LAUNCH_INCOMPLETE):
        return [resume] if resume else []
    if state == VERIFICATION_UNAVAILABLE:
        return [s.fix for s in located.unavailable if s.fix] + [located.status_command("--cached")]
    if state == NOT_FOUND:
        fixes = [s.fix for s in located.sources if s.answer == "absent" and s.fix]
        listing = ("workbench", "workflow", "list", "--project", located.project, "--limit", "50")
        return [*fixes, cmd(*listing)]
    if state not in TERMINAL and state != CACHED:
        return [located.status_command("--watch")]
    return []


def status(
    run: str,
    project: str | None,
    *,
    cached: bool = False,
    workflow_uri: str | None = None,
    paths: NpaPaths | None = None,
) -> StatusResult:
    """One status check of one run, from every applicable source."""
    paths = paths or NpaPaths.from_env()
    asked_from = datetime.now(UTC).isoformat(timespec="milliseconds")
    located = locate(run, project, workflow_uri=workflow_uri, paths=paths)
    backend = open_located_backend(located, paths) if located.backend_name else None
    job, job_source = ask_job(located, backend, cached=cached)
    located.sources.append(job_source)
    polled = isinstance(backend, PolledByWatcher)
    state, reason = decide(located, job, cached=cached, polled=polled)
    reason += _controller_cause(located, job, backend)
    record = job.record
    m = located.manifest
    pending_verdict = polled and _verdict_pending(m, record, state)
    supervised = _supervised(paths, located, backend) if pending_verdict else None
    if supervised is False:
        reason += "; no supervisor runs for it on this machine (the same submit starts one)"
    waiting = record is not None and state in WAITING and not cached
    pending, launches, launch_fixes = (
        _why_waiting(located, backend, record) if waiting and record else ([], [], [])
    )
    plan = read_run_plan(located) if m is not None else None
    stages = _stages(m, job, state, plan_order(m, plan), plan) if m else {}
    done = _release_if_final(located, backend, state, cached=cached)
    return StatusResult(
        project=located.project,
        run_id=located.run_id,
        workflow=located.workflow,
        state=state,
        trustworthy=state not in (CACHED, VERIFICATION_UNAVAILABLE),
        last_known_state=m.state if m else None,
        reason=reason,
        backend=located.backend_name,
        job_id=record.job_id if record else located.job_id,
        job_name=located.job_name,
        job_state=record.state.value if record else None,
        failure_reason=(record.failure_reason if record else None) or _recorded_failure(m),
        run_prefix=located.prefix_uri,
        pending=pending,
        launch_failures=launches,
        stages=stages,
        supervisor=m.supervisor.model_dump(mode="json") if m else None,
        sources=located.sources,
        release=done,
        next=launch_fixes
        + ([done.fix] if done.fix else [])
        + _next(
            located,
            state,
            pending,
            stages,
            backend.controller_fix(located.project) if backend is not None else None,
            record,
            reattach=supervised is False,
        ),
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        asked_from=asked_from,
        verdict_pending=pending_verdict,
        supervised=supervised,
    )


def _release_if_final(
    located: Located, backend: ExecutionBackend | None, state: str, *, cached: bool
) -> Released:
    """A run whose state is final can use nothing of its own launch any more: remove it
    (repeat-safe). Only a live answer decides: never CACHED, never VERIFICATION_UNAVAILABLE or
    any other state npa cannot call final, and never a job that ended while npa's verdict is
    pending (the supervisor that records it may relaunch, and a relaunch reads the Secret)."""
    if cached or state not in TERMINAL:
        return Released()
    generation = launch_generation(located.manifest)
    return release_ended_run(backend, located.project, located.workflow, located.run_id, generation)


def _verdict_pending(m: RunManifest | None, record: JobRecord | None, state: str) -> bool:
    """The backend ended the job and the run still shows npa's recorded, unfinished state."""
    return (
        m is not None
        and record is not None
        and state == m.state
        and state not in TERMINAL
        and record.state.terminal
        and not record.continuable
    )


def _supervised(paths: NpaPaths, located: Located, backend: ExecutionBackend | None) -> bool | None:
    """Whether the supervisor that records a polled run's verdict is alive on this machine:
    None when no supervisor of the run ever ran here (it was submitted elsewhere) or the
    backend has none."""
    if not isinstance(backend, PolledByWatcher):
        return None
    from npa.launch.watch import alive, lock_path

    if not lock_path(paths, located.project, located.run_id).exists():
        return None
    return alive(paths, located.project, located.run_id) is not None


# Seconds a watch waits on a job that ended with no supervisor before it ends (exit 1).
UNSUPERVISED_GRACE = 30.0


def watch(
    run: str,
    project: str | None,
    *,
    interval: float = 10.0,
    timeout: float | None = None,
    workflow_uri: str | None = None,
    on_poll: Callable[[StatusResult], None] | None = None,
    paths: NpaPaths | None = None,
) -> StatusResult:
    """Poll ``status`` until the run is final (or NOT_FOUND, or ``timeout`` passes); every
    answer goes to ``on_poll`` (see :mod:`npa.services.watching` for what changed).

    A source that is briefly unavailable does not end the watch; the last answer is returned.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    unsupervised_since: float | None = None
    while True:
        result = status(run, project, workflow_uri=workflow_uri, paths=paths)
        result.watched = True
        if on_poll is not None:
            on_poll(result)
        if result.state in TERMINAL or result.state in (NOT_FOUND, NOT_SUBMITTED, PLAN_ONLY):
            return result
        # A supervisor just started by submit may not hold its lock yet: the run is left to
        # nobody only when that stays so for a grace period.
        unsupervised_since = (
            (unsupervised_since or time.monotonic()) if result.unsupervised else None
        )
        if (
            unsupervised_since is not None
            and time.monotonic() - unsupervised_since >= UNSUPERVISED_GRACE
        ):
            return result
        if deadline is not None and time.monotonic() >= deadline:
            return result
        time.sleep(interval)
