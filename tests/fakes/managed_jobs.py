"""A managed-jobs service double, injected at the SkyPilot backend boundary.

It answers with SkyPilot's own ``ManagedJobRecord`` model and ``ManagedJobStatus`` enum and
raises SkyPilot's own exception classes, and keeps its state in a JSON file (under a lock) so a
killed submit and its rerun, or two concurrent submits, see the same jobs. Loaded by the CLI via
``NPA_SKYPILOT_JOBS_SERVICE=tests.fakes.managed_jobs:FakeManagedJobs`` with
``NPA_FAKE_JOBS_STATE`` naming the state file.

Scripting (keys of the state file): ``refuse`` - exception class names the next launches fail
with; ``queue_error`` - the queue raises this; ``kill_at`` - SIGKILL the calling process when
the launch transaction reaches this step (cleared first, so the rerun goes through);
``outcomes`` - the status each next launched job takes at once (``PENDING`` when none is left).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_ENV = "NPA_FAKE_JOBS_STATE"


def initial_state() -> dict[str, Any]:
    return {
        "next_id": 1,
        "jobs": [],
        "requests": {},
        "launch_calls": 0,
        "refuse": [],
        "queue_error": None,
        "kill_at": None,
        "kubeconfigs": [],
    }


def read_state(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else initial_state()


def write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, path)


class FakeManagedJobs:
    def __init__(self, *, kubeconfig: str | None) -> None:
        self.path = Path(os.environ[STATE_ENV])
        self.kubeconfig = kubeconfig

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = read_state(self.path)
            yield state
            write_state(self.path, state)

    def launch(self, task_yamls: list[str], name: str) -> str:
        with self._state() as state:
            state["launch_calls"] += 1
            state["kubeconfigs"].append(self.kubeconfig)
            request_id = f"req-{state['launch_calls']}"
            if state["refuse"]:
                state["requests"][request_id] = {"error": state["refuse"].pop(0)}
                return request_id
            job_id = state["next_id"]
            state["next_id"] += 1
            outcomes = state.get("outcomes") or []
            state["jobs"].append(
                {
                    "job_id": job_id,
                    "job_name": name,
                    "status": outcomes.pop(0) if outcomes else "PENDING",
                    "tasks": len(task_yamls),
                    "submitted_at": time.time(),
                }
            )
            state["requests"][request_id] = {"job_id": job_id}
            return request_id

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
            error = state["queue_error"]
            jobs = list(state["jobs"])
        if error:
            from sky import exceptions

            raise getattr(exceptions, error)("the jobs controller is not up")
        records = []
        for job in jobs:
            if name not in job["job_name"]:
                continue
            for task in range(job["tasks"]):
                records.append(
                    ManagedJobRecord(
                        job_id=job["job_id"],
                        task_id=task,
                        job_name=job["job_name"],
                        task_name=f"task-{task}",
                        status=ManagedJobStatus(job["status"]),
                        submitted_at=job["submitted_at"],
                        recovery_count=0,
                        infra="Kubernetes/fake",
                    )
                )
        return records

    def cancel(self, job_ids: list[int]) -> None:
        with self._state() as state:
            for job in state["jobs"]:
                if job["job_id"] in job_ids:
                    job["status"] = "CANCELLED"

    def tail_logs(self, job_id: int, follow: bool) -> Iterator[str]:
        yield f"fake log of job {job_id}"

    def observe(self, step: str) -> None:
        with self._state() as state:
            kill = state["kill_at"] == step
            if kill:
                state["kill_at"] = None
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
