"""The local executor: runs one job's stages, wave by wave, and reports every step.

It runs inside the run's watcher process (:mod:`npa.launch.watch`, started detached in its own
session so it outlives the shell that submitted), which hands it the job and a recorder. While
it lives it holds the job's ``supervisor.lock``; readers treat a live job without that lock as a
dead controller. It writes its own log to the job's ``logs/supervisor.log``.

For each stage, in dependency order: fetch its inputs from the store, run each wave's shards as
processes (at most ``parallel`` at once, and never more than the job's ``max_parallel``), put the
outputs and logs back into the store after every wave, and check every declared output is there
and non-empty. The job record is updated at each step; the run's record, and whether a failed
wave runs again, belong to the recorder (:class:`npa.backends.base.RunRecorder`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from npa.adapters.storage import ObjectStore, open_store
from npa.backends.base import JobState, JobSubmission, RunRecorder
from npa.backends.local import tasks as local_tasks
from npa.backends.local.jobs import LocalJobTable
from npa.backends.local.tasks import LocalTask
from npa.core.errors import NpaError
from npa.core.fsio import ensure_private_dir
from npa.core.layout import input_variable, output_variable, run_root, shards_of_wave
from npa.core.paths import NpaPaths
from npa.core.text import plural

POLL_SECONDS = 0.05


class Cancelled(Exception):
    pass


class StageFailed(Exception):
    def __init__(self, state: JobState, detail: str) -> None:
        super().__init__(detail)
        self.state = state
        self.detail = detail


class Executor:
    def __init__(self, paths: NpaPaths, job_id: int, recorder: RunRecorder) -> None:
        self.paths = paths
        self.table = LocalJobTable(paths)
        self.job_id = job_id
        self.job_dir = self.table.job_dir(job_id)
        self.recorder = recorder
        self.submission: JobSubmission = self.table.submission(self.job_id)
        self.work = ensure_private_dir(self.job_dir / "work")
        self.logs = ensure_private_dir(self.job_dir / "logs")
        self.cancelled = False
        self.children: list[subprocess.Popen[bytes]] = []
        self.store: ObjectStore | None = None

    # --- records -----------------------------------------------------------------------------
    def log(self, message: str) -> None:
        at = datetime.now(UTC).isoformat(timespec="milliseconds")
        with open(self.logs / "supervisor.log", "a", encoding="utf-8") as out:
            out.write(f"{at} {message}\n")

    # --- lifecycle ---------------------------------------------------------------------------
    def on_term(self, signum: int, frame: FrameType | None) -> None:
        self.cancelled = True
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)

    def run(self) -> int:
        lock_fd = os.open(self.job_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.log("another supervisor holds this job; exiting")
            return 0
        # The holder's pid in the lock tells an operator (and a test) which process to stop.
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        job = self.table.read(self.job_id)
        if job.state.terminal:
            return 0
        if job.cancel_requested:
            self.finish(JobState.CANCELLED, "cancelled before it started")
            return 0
        self.table.update(
            self.job_id, state=JobState.STARTING, started_at=time.time(), supervisor_pid=os.getpid()
        )
        s = self.submission
        try:
            self.store = open_store(
                s.store,
                endpoint_url=s.endpoint_url,
                region=s.region,
                profile=s.profile,
                paths=self.paths,
            )
            self.recorder.started(self.job_id, s.order)
            self.recorder.restore_source(self.store, s.prefix, self.work / "source")
            self.table.update(self.job_id, state=JobState.RUNNING)
            self.recorder.running()
            for stage in s.order:
                if self.cancelled:
                    raise Cancelled()
                if stage in s.adopted_stages:
                    self.log(f"stage {stage}: adopted from the earlier job; not run again")
                    continue
                self.run_stage(local_tasks.parse(s.tasks[stage]))
        except Cancelled:
            self.finish(JobState.CANCELLED, "cancelled")
            return 0
        except StageFailed as failed:
            self.finish(failed.state, failed.detail)
            return 1
        except NpaError as error:
            self.log(f"error: {error.message}")
            self.finish(JobState.FAILED_CONTROLLER, error.message, infrastructure=True)
            return 1
        except Exception as exc:  # the record must say the controller failed, not hang live
            self.log(traceback.format_exc())
            self.finish(JobState.FAILED_CONTROLLER, f"{type(exc).__name__}: {exc}")
            return 1
        self.finish(JobState.SUCCEEDED, None)
        return 0

    def finish(self, state: JobState, detail: str | None, *, infrastructure: bool = False) -> None:
        self.log(f"run ends {state.value}" + (f": {detail}" if detail else ""))
        if self.store is not None:
            try:
                self.recorder.ended(state, detail, infrastructure=infrastructure)
                self.upload_logs(None)
            except NpaError as error:
                self.log(f"could not record the final state in the store: {error.message}")
        self.table.update(
            self.job_id,
            state=state,
            ended_at=time.time(),
            failure_reason=detail if state is not JobState.SUCCEEDED else None,
            current_stage=None,
        )

    # --- data --------------------------------------------------------------------------------
    def fetch_input(self, task: LocalTask, name: str, key: str, kind: str) -> Path:
        assert self.store is not None
        base = self.work / "inputs" / task.stage / name
        if base.exists():
            shutil.rmtree(base) if base.is_dir() else base.unlink()
        if kind == "file":
            ensure_private_dir(base.parent)
            base.write_bytes(self.store.get(key))
            return base
        ensure_private_dir(base)
        for obj in self.store.list(key + "/"):
            target = base / obj.key[len(key) + 1 :]
            ensure_private_dir(target.parent)
            target.write_bytes(self.store.get(obj.key))
        return base

    def output_path(self, task: LocalTask, path: str) -> Path:
        return self.work / "outputs" / task.stage / path.rstrip("/")

    def upload_outputs(self, task: LocalTask) -> dict[str, int]:
        """Put the stage's outputs into the store; returns bytes stored per declared output."""
        assert self.store is not None
        stored: dict[str, int] = {}
        for out in task.outputs:
            local = self.output_path(task, out.path)
            total = 0
            if out.kind == "file":
                if local.is_file():
                    data = local.read_bytes()
                    self.store.put(out.key, data)
                    total = len(data)
            elif local.is_dir():
                for file in sorted(p for p in local.rglob("*") if p.is_file()):
                    data = file.read_bytes()
                    self.store.put(f"{out.key}/{file.relative_to(local).as_posix()}", data)
                    total += len(data)
            stored[out.name] = total
        return stored

    def upload_logs(self, stage: str | None) -> None:
        assert self.store is not None
        folder = self.logs / stage if stage else self.logs
        files = [folder / "supervisor.log"] if stage is None else sorted(folder.glob("*.log"))
        for file in files:
            if file.is_file():
                where = f"stages/{stage}/logs/{file.name}" if stage else "logs/supervisor.log"
                self.store.put(f"{self.submission.prefix}/{where}", file.read_bytes())

    def verify_outputs(self, task: LocalTask) -> dict[str, int]:
        """Bytes the store holds for each declared output (0 = missing or empty)."""
        assert self.store is not None
        found: dict[str, int] = {}
        for out in task.outputs:
            if out.kind == "file":
                try:
                    found[out.name] = self.store.head(out.key).size
                except NpaError:
                    found[out.name] = 0
            else:
                found[out.name] = sum(o.size for o in self.store.list(out.key + "/"))
        return found

    # --- stages ------------------------------------------------------------------------------
    def stage_env(self, task: LocalTask) -> dict[str, str]:
        s = self.submission
        env = {
            **os.environ,
            "NPA_WORKFLOW": s.workflow,
            "NPA_RUN_ID": s.run_id,
            "NPA_STAGE": task.stage,
            "NPA_RUN_PREFIX": f"{s.store}/{run_root(s.prefix)}",
            "NPA_SOURCE_DIR": str(self.work / "source"),
            "NPA_WAVES": str(task.waves),
            "NPA_SHARDS": str(task.shards),
            "NPA_SHARDS_PER_WAVE": str(task.parallel),
        }
        for inp in task.inputs:
            if inp.key is not None:
                env[input_variable(inp.name)] = str(
                    self.fetch_input(task, inp.name, inp.key, inp.kind)
                )
            elif inp.uri is not None:
                env[input_variable(inp.name)] = inp.uri.removeprefix("file://")
        for out in task.outputs:
            local = self.output_path(task, out.path)
            ensure_private_dir(local if out.kind == "prefix" else local.parent)
            env[output_variable(out.name)] = str(local)
        env.update(task.env)
        return env

    def run_stage(self, task: LocalTask) -> None:
        self.log(
            f"stage {task.stage}: {plural(task.waves, 'wave')} of up to "
            f"{plural(task.parallel, 'shard')}"
        )
        self.table.update(self.job_id, current_stage=task.stage)
        self.recorder.stage_started(task.stage)
        env = self.stage_env(task)
        budget = self.recorder.retry_budget(task.retries)
        adopted = set(self.submission.adopted_waves.get(task.stage, []))
        for wave in range(task.waves):
            if wave in adopted:
                self.log(f"stage {task.stage} wave {wave}: adopted from the earlier job")
                continue
            budget = self.run_wave_to_end(task, wave, env, budget)
        found = self.verify_outputs(task)
        missing = [name for name, size in found.items() if size == 0]
        if missing:
            detail = self.recorder.outputs_missing(task.stage, found, missing)
            raise StageFailed(JobState.FAILED, detail)
        self.recorder.stage_succeeded(task.stage, found)

    def run_wave_to_end(self, task: LocalTask, wave: int, env: dict[str, str], budget: int) -> int:
        """Run one wave until it succeeds or the recorder ends the job; returns the payload
        retries left."""
        shards = shards_of_wave(wave, task.parallel, task.shards)
        attempt = 0
        while True:
            attempt += 1
            self.recorder.wave_started(task.stage, wave, shards, attempt)
            self.log(f"stage {task.stage} wave {wave} attempt {attempt}: shards {shards}")
            codes = self.run_wave(task, wave, shards, env)
            if self.cancelled:
                raise Cancelled()
            self.upload_logs(task.stage)
            if all(code == 0 for code in codes.values()):
                stored = self.upload_outputs(task)
                self.recorder.wave_succeeded(task.stage, wave, shards, codes, attempt, stored)
                return budget
            verdict = self.recorder.wave_failed(task.stage, wave, shards, codes, attempt, budget)
            if not verdict.retry:
                assert verdict.state is not None
                raise StageFailed(verdict.state, verdict.detail)
            budget -= 1 if verdict.spends_retry else 0
            self.log(f"{verdict.detail}; retrying the wave ({verdict.classification})")

    def run_wave(
        self, task: LocalTask, wave: int, shards: list[int], env: dict[str, str]
    ) -> dict[int, int]:
        """Run one wave's shards, at most ``max_parallel`` at once; exit code per shard."""
        folder = ensure_private_dir(self.logs / task.stage)
        limit = max(1, min(task.parallel, self.submission.max_parallel))
        waiting = list(shards)
        running: dict[int, subprocess.Popen[bytes]] = {}
        codes: dict[int, int] = {}

        while waiting or running:
            while waiting and len(running) < limit and not self.cancelled:
                shard = waiting.pop(0)
                log = open(folder / f"wave-{wave}-shard-{shard}.log", "ab")  # noqa: SIM115
                try:
                    child = subprocess.Popen(
                        ["/bin/sh", "-c", task.command],
                        cwd=self.work / "source",
                        env={**env, "NPA_WAVE": str(wave), "NPA_SHARD": str(shard)},
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                finally:
                    log.close()
                running[shard] = child
                self.children.append(child)
            if self.cancelled and not running:
                break
            for shard, child in list(running.items()):
                code = child.poll()
                if code is not None:
                    codes[shard] = code
                    del running[shard]
                    self.children.remove(child)
            time.sleep(POLL_SECONDS)
        return codes
