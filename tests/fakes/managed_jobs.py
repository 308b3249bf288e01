"""A managed-jobs service double, injected at the SkyPilot backend boundary.

It answers with SkyPilot's own ``ManagedJobRecord`` model and ``ManagedJobStatus`` enum and
raises SkyPilot's own exception classes, and keeps its state in a JSON file (under a lock) so a
killed submit and its rerun, or two concurrent submits, see the same jobs. The CLI gets it
through its constructor when run as ``python -m tests.fakes.cli`` (:mod:`tests.fakes.entry`),
with ``NPA_FAKE_JOBS_STATE`` naming the state file.

Scripting (keys of the state file): ``refuse`` - exception class names the next launches fail
with; ``queue_error`` - the queue raises this; ``kill_at`` - SIGKILL the calling process when
the launch transaction reaches this step (cleared first, so the rerun goes through);
``outcomes`` - the status each next launched job takes at once (``PENDING`` when none is left),
a ``[status, failure_reason]`` pair, or ``{"status", "failure_reason", "tasks"}`` where
``tasks`` gives the launched tasks' own statuses in order; ``cancel_mode`` - ``at_once`` (the
default: the job is CANCELLED when ``cancel`` returns), ``requested`` (as SkyPilot's controller
before it acts: the status stays, the details column names the request) or ``ignored``;
``twins`` - the launch calls (counted from 1) that also create a second, PENDING job under the
same name that no request resolves to.

A job is a pipeline of tasks, as SkyPilot runs it: ``launch`` loads each task YAML with
``sky.Task.from_yaml_config`` and names the tasks with SkyPilot's own rule
(``dag_utils.maybe_infer_and_fill_dag_and_task_names``: the lone task of a one-task job is named
after the job). Each entry of a job's ``tasks`` may carry its own ``status`` (else the job's
``status`` applies), ``failure_reason`` and ``logs``. A task that reaches SUCCEEDED has done what
its rendered ``run`` does last: each ``npa_upload`` line's output is written to the store (one
small object), once, as the stage library would upload it; a task scripted with
``"outputs": false`` exits 0 without them. The queue answers one ``ManagedJobRecord``
per task; a job given failed launches (:func:`fail_launch`) has its current task in
SkyPilot's launch backoff, and ``controller_log`` answers with the controller's lines for each;
``tail_logs`` answers the way SkyPilot's log stream does (``task=`` a name or an id
selects one task, with SkyPilot's header line; an unknown job or task streams SkyPilot's
not-found message instead of log lines) and records every call in ``tail_calls``. Where
SkyPilot's tail would wait (a task that is not running in a live job, without ``follow``), it
raises instead of hanging.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_ENV = "NPA_FAKE_JOBS_STATE"
# The stage library's last step in a rendered run script: ``npa_upload KIND LOCAL URI``.
_UPLOAD = re.compile(r"^\s*npa_upload (file|prefix) \S+ (s3://\S+)\s*$", re.MULTILINE)


def initial_state() -> dict[str, Any]:
    return {
        "next_id": 1,
        "jobs": [],
        "requests": {},
        "launch_calls": 0,
        "queue_calls": 0,  # how often the queue was asked: a test waits on polls, not on time
        "refuse": [],
        "queue_error": None,
        "kill_at": None,
        "kubeconfigs": [],
        "tail_calls": [],
    }


def read_state(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else initial_state()


def job_tasks(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's tasks; a scripted job may give only their number (unnamed tasks, which
    SkyPilot names after the job: ``<job>`` alone, else ``<job>-<index>``)."""
    tasks = job["tasks"]
    if isinstance(tasks, int):
        if tasks == 1:
            return [{"name": job["job_name"]}]
        return [{"name": f"{job['job_name']}-{i}"} for i in range(tasks)]
    return list(tasks)


def task_status(job: dict[str, Any], task: dict[str, Any]) -> str:
    return str(task.get("status") or job["status"])


@contextlib.contextmanager
def locked_state(path: Path) -> Iterator[dict[str, Any]]:
    """The state under the service's own lock, written back at the end: a test's change cannot
    be lost to a poll of the run's watcher that read the state before it."""
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_state(path)
        yield state
        write_state(path, state)


def set_tasks(path: Path, job_id: int, **statuses: str) -> None:
    """Script the state of tasks of one job by task name (``name=STATUS``)."""
    with locked_state(path) as state:
        job = next(j for j in state["jobs"] if j["job_id"] == job_id)
        tasks = job_tasks(job)
        for task in tasks:
            if task["name"] in statuses:
                task["status"] = statuses.pop(task["name"])
        assert not statuses, f"job {job_id} has no tasks {sorted(statuses)}"
        job["tasks"] = tasks


def fail_launch(path: Path, job_id: int, error: str) -> None:
    """One more failed launch of the job's current task, as SkyPilot's jobs controller logs it
    before it waits and tries again: the task stays where it was, in backoff."""
    with locked_state(path) as state:
        job = next(j for j in state["jobs"] if j["job_id"] == job_id)
        job.setdefault("launch_failures", []).append(error)


def _backoff(job: dict[str, Any], tasks: list[dict[str, Any]]) -> int | None:
    """The task a job with failed launches waits to launch again (its first unfinished one)."""
    if not job.get("launch_failures"):
        return None
    from sky.jobs import ManagedJobStatus

    return next(
        (
            i
            for i, t in enumerate(tasks)
            if ManagedJobStatus(task_status(job, t))
            in (ManagedJobStatus.PENDING, ManagedJobStatus.STARTING)
        ),
        None,
    )


def write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, path)


class FakeManagedJobs:
    def __init__(self, *, kubeconfig: str | None) -> None:
        self.path = Path(os.environ[STATE_ENV])
        self.kubeconfig = kubeconfig

    def _state(self) -> contextlib.AbstractContextManager[dict[str, Any]]:
        return locked_state(self.path)

    def launch(self, task_yamls: list[str], name: str, config: dict[str, Any] | None = None) -> str:
        names = self._task_names(task_yamls, name)
        uploads = [[list(m) for m in _UPLOAD.findall(text)] for text in task_yamls]
        with self._state() as state:
            state["launch_calls"] += 1
            state["kubeconfigs"].append(self.kubeconfig)
            state.setdefault("configs", []).append(config)
            request_id = f"req-{state['launch_calls']}"
            if state["refuse"]:
                state["requests"][request_id] = {"error": state["refuse"].pop(0)}
                return request_id
            job_id = state["next_id"]
            state["next_id"] += 1
            outcomes = state.get("outcomes") or []
            outcome = outcomes.pop(0) if outcomes else "PENDING"
            if isinstance(outcome, dict):
                status, reason = outcome["status"], outcome.get("failure_reason")
                per_task = list(outcome.get("tasks", []))
            else:
                status, reason = (outcome, None) if isinstance(outcome, str) else outcome
                per_task = []
            state["jobs"].append(
                {
                    "job_id": job_id,
                    "job_name": name,
                    "status": status,
                    "tasks": [
                        {
                            "name": task,
                            "logs": [f"log of job {job_id} task {i} {task}"],
                            "uploads": uploads[i],
                            "yaml": task_yamls[i],
                            **({"failure_reason": reason} if reason else {}),
                            **({"status": per_task[i]} if i < len(per_task) else {}),
                        }
                        for i, task in enumerate(names)
                    ],
                    "submitted_at": time.time(),
                }
            )
            state["requests"][request_id] = {"job_id": job_id}
            if state["launch_calls"] in state.get("twins", []):
                # The API server ran this request twice (it retries one internally while the
                # controller is locked): a second job under the same name that no request names.
                first = state["jobs"][-1]
                tasks = [
                    {k: v for k, v in t.items() if k not in ("status", "failure_reason")}
                    for t in first["tasks"]
                ]
                twin = {**first, "job_id": state["next_id"], "status": "PENDING", "tasks": tasks}
                state["next_id"] += 1
                state["jobs"].append(twin)
            return request_id

    @staticmethod
    def _task_names(task_yamls: list[str], name: str) -> list[str]:
        """The names SkyPilot gives the chained tasks: the DAG the real service launches, named
        by SkyPilot's own rule."""
        from sky.utils import dag_utils

        from npa.backends.skypilot.jobs import build_dag

        dag = build_dag(task_yamls, name)
        dag_utils.maybe_infer_and_fill_dag_and_task_names(dag)
        return [str(task.name) for task in dag.tasks]

    def get(self, request_id: str) -> Any:
        from sky import exceptions

        with self._state() as state:
            answer = state["requests"][request_id]
        if "error" in answer:
            raise getattr(exceptions, answer["error"])("jobs controller could not be created")
        return [answer["job_id"]], None

    def queue(self, name: str) -> list[Any]:
        from sky.jobs import ManagedJobStatus
        from sky.schemas.api.responses import ManagedJobRecord

        with self._state() as state:
            state["queue_calls"] = state.get("queue_calls", 0) + 1
            error = state["queue_error"]
            if not error:
                self._upload_outputs(state)
            jobs = list(state["jobs"])
        if error:
            from sky import exceptions

            raise getattr(exceptions, error)("the jobs controller is not up")
        records = []
        for job in jobs:
            if name not in job["job_name"]:
                continue
            tasks = job_tasks(job)
            waiting = _backoff(job, tasks)
            for task_id, task in enumerate(tasks):
                # SkyPilot's record of a job in launch backoff: the schedule state says so, the
                # details column holds the job's latest PENDING event, and no failure reason.
                backoff = task_id == waiting
                status = ManagedJobStatus(task_status(job, task))
                records.append(
                    ManagedJobRecord(
                        job_id=job["job_id"],
                        task_id=task_id,
                        job_name=job["job_name"],
                        task_name=task["name"],
                        status=status,
                        failure_reason=task.get("failure_reason"),
                        # SkyPilot stamps a task's submitted_at as its controller takes it up
                        # (the task leaves PENDING); a task still waiting has none.
                        submitted_at=None
                        if status is ManagedJobStatus.PENDING
                        else job["submitted_at"],
                        recovery_count=0,
                        infra="Kubernetes/fake",
                        schedule_state="ALIVE_BACKOFF" if backoff else None,
                        details=job.get("cancel_requested")
                        or ("Job is in backoff" if backoff else None),
                    )
                )
        return records

    @staticmethod
    def _upload_outputs(state: dict[str, Any]) -> None:
        """What a succeeded task's run script uploaded, written once per task: a ``file``
        output is the object itself, a ``prefix`` output gets one object named after the task."""
        client = None
        for job in state["jobs"]:
            tasks = job_tasks(job)
            for task in tasks:
                done = task_status(job, task) != "SUCCEEDED" or task.get("uploaded")
                if done or not task.get("outputs", True):
                    continue
                for kind, uri in task.get("uploads", []):
                    if client is None:
                        import boto3

                        client = boto3.client("s3")
                    bucket, _, key = uri.removeprefix("s3://").partition("/")
                    if kind == "prefix":
                        key = f"{key.rstrip('/')}/{task['name']}.txt"
                    body = f"output of job {job['job_id']} task {task['name']}\n".encode()
                    client.put_object(Bucket=bucket, Key=key, Body=body)
                task["uploaded"] = True
            job["tasks"] = tasks

    def cancel(self, job_ids: list[int]) -> None:
        from sky.jobs import ManagedJobStatus

        with self._state() as state:
            mode = state.get("cancel_mode", "at_once")
            for job in state["jobs"]:
                if job["job_id"] not in job_ids:
                    continue
                if mode == "ignored":
                    continue
                if mode == "requested":  # recorded; the controller has not acted on it yet
                    job["cancel_requested"] = (
                        f"Cancellation requested by user root (request ID: req-{job['job_id']})"
                    )
                    continue
                if job["job_id"] in job_ids:
                    job["status"] = "CANCELLED"
                    tasks = job_tasks(job)
                    for task in tasks:
                        if not ManagedJobStatus(task_status(job, task)).is_terminal():
                            task["status"] = "CANCELLED"
                    job["tasks"] = tasks

    def tail_logs(self, job_id: int, follow: bool, task: str | int | None = None) -> Iterator[str]:
        from sky.jobs import ManagedJobStatus

        with self._state() as state:
            state.setdefault("tail_calls", []).append(
                {"job_id": job_id, "task": task, "follow": follow}
            )
            job = next((j for j in state["jobs"] if j["job_id"] == job_id), None)
        if job is None:
            yield f"Job {job_id} not found."
            return
        tasks = list(enumerate(job_tasks(job)))
        chosen = [
            (i, t)
            for i, t in tasks
            if task is None or (i == task if isinstance(task, int) else t["name"] == task)
        ]
        if not chosen:
            valid = f"0-{len(tasks) - 1}" if len(tasks) > 1 else "0"
            yield f"No task found matching {task!r} in job {job_id}. Valid task IDs are {valid}."
            return
        states = [ManagedJobStatus(task_status(job, t)) for _, t in tasks]
        live = not all(s.is_terminal() for s in states)
        for i, _task in chosen:
            if live and not follow and states[i] is not ManagedJobStatus.RUNNING:
                raise TimeoutError(
                    f"sky.jobs.tail_logs would wait: task {i} is {states[i].value} in a live job"
                )
        if task is None and len(tasks) > 1:
            yield (
                f"Hint: This job has {len(tasks)} tasks. Use 'sky jobs logs {job_id} TASK' to "
                "view logs for a specific task (TASK can be task ID or name)."
            )
        for i, t in chosen:
            if len(chosen) > 1 or task is not None:
                yield f"=== Task {t['name']}({i}) ==="
            yield from t.get("logs", [])

    def controller_log(self, job_id: int) -> list[str]:
        """The jobs controller's log of the job as SkyPilot's words it: each task it starts, and
        each launch that failed before it waits and tries again."""
        with self._state() as state:
            state.setdefault("controller_log_calls", []).append(job_id)
            job = next((j for j in state["jobs"] if j["job_id"] == job_id), None)
        if job is None:
            return [f"Job {job_id} not found."]
        tasks = job_tasks(job)
        current = _backoff(job, tasks) or 0
        lines = [f"Starting job {job_id}"]
        lines.append(f"Starting task {current} ({tasks[current]['name']}) for job {job_id}")
        for error in job.get("launch_failures", []):
            lines.append(f"Failed to launch a cluster with error: {error})")
            lines.append("Retrying to launch the cluster in 61.3 seconds.")
        return lines

    def observe(self, step: str) -> None:
        with self._state() as state:
            kill = state["kill_at"] == step
            if kill:
                state["kill_at"] = None
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
