"""The local supervisor: runs one job's stages, wave by wave, and records every step.

Started detached by the local backend (``python -m npa.backends.local.supervisor JOB_DIR``), in
its own session so it outlives the shell that submitted. While it lives it holds the job's
``supervisor.lock``; readers treat a live job without that lock as a dead controller.

For each stage, in dependency order: fetch its inputs from the store, run each wave's shards as
processes (at most ``parallel`` at once, and never more than the job's ``max_parallel``), put the
outputs and logs back into the store after every wave, and check every declared output is there
and non-empty. Failures are classified and recovered according to :mod:`npa.launch.supervision`;
the job record and the run manifest are updated at each step.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from npa.adapters.storage import ObjectStore, open_store
from npa.backends.base import JobState, JobSubmission
from npa.backends.local import tasks as local_tasks
from npa.backends.local.jobs import LocalJobTable
from npa.backends.local.tasks import LocalTask
from npa.core.errors import NpaError
from npa.core.fsio import ensure_private_dir
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.launch.supervision import Classification, Policy, classify_exit, record
from npa.runs.manifest import RunManifest, StageRecord, WaveRecord, now_iso, update_manifest
from npa.spec.model import env_suffix

POLL_SECONDS = 0.05


class Cancelled(Exception):
    pass


class StageFailed(Exception):
    def __init__(self, state: JobState, detail: str) -> None:
        super().__init__(detail)
        self.state = state
        self.detail = detail


class Supervisor:
    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.job_id = int(job_dir.name)
        self.paths = NpaPaths.from_env()
        self.table = LocalJobTable(self.paths)
        self.submission: JobSubmission = self.table.submission(self.job_id)
        self.policy = Policy(
            startup_failure_threshold=self.submission.startup_failure_threshold,
            max_infrastructure_recoveries=self.submission.max_infrastructure_recoveries,
            retries=self.submission.retries,
        )
        self.work = ensure_private_dir(job_dir / "work")
        self.logs = ensure_private_dir(job_dir / "logs")
        self.cancelled = False
        self.children: list[subprocess.Popen[bytes]] = []
        self.manifest_lock = self.paths.lock(
            f"manifest.{self.submission.project}.{self.submission.run_id}"
        )
        self.store: ObjectStore | None = None

    # --- records -----------------------------------------------------------------------------
    def log(self, message: str) -> None:
        sys.stdout.write(f"{now_iso()} {message}\n")
        sys.stdout.flush()

    def manifest(self, mutate: Callable[[RunManifest], None]) -> None:
        assert self.store is not None
        update_manifest(self.store, self.submission.prefix, self.manifest_lock, mutate)

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
            self.manifest(self._started)
            self.materialise_source()
            self.table.update(self.job_id, state=JobState.RUNNING)
            self.manifest(lambda m: setattr(m, "state", JobState.RUNNING.value))
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

    def _started(self, m: RunManifest) -> None:
        m.job_id = self.job_id
        m.state = JobState.STARTING.value
        for stage in self.submission.order:
            m.stages.setdefault(stage, StageRecord())

    def finish(self, state: JobState, detail: str | None, *, infrastructure: bool = False) -> None:
        self.log(f"run ends {state.value}" + (f": {detail}" if detail else ""))
        if self.store is not None:

            def final(m: RunManifest) -> None:
                m.state = state.value
                if infrastructure and m.supervisor.classification is None:
                    m.supervisor.classification = Classification.TRANSIENT_INFRASTRUCTURE.value
                for rec in m.stages.values():
                    if rec.state in ("PENDING", "RUNNING") and state is JobState.CANCELLED:
                        rec.state = "CANCELLED"

            try:
                self.manifest(final)
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
    def materialise_source(self) -> None:
        """Rebuild the committed source tree from the store (the stages' working directory)."""
        from npa.runs.staging import SourceLayout, load_committed

        assert self.store is not None
        layout = SourceLayout(self.submission.prefix)
        manifest = load_committed(self.store, layout)
        root = ensure_private_dir(self.work / "source")
        if manifest is None:
            return
        for entry in manifest.files:
            target = root / entry.path
            ensure_private_dir(target.parent)
            data = self.store.get(layout.blob(entry.digest.removeprefix("sha256:")))
            target.write_bytes(data)
            os.chmod(target, entry.mode & 0o755 | 0o600)

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
            "NPA_RUN_PREFIX": f"{s.store}/{s.prefix.removesuffix('/npa-workflow')}",
            "NPA_SOURCE_DIR": str(self.work / "source"),
            "NPA_WAVES": str(task.waves),
            "NPA_SHARDS": str(task.shards),
            "NPA_SHARDS_PER_WAVE": str(task.parallel),
        }
        for inp in task.inputs:
            if inp.key is not None:
                env[f"NPA_INPUT_{env_suffix(inp.name)}"] = str(
                    self.fetch_input(task, inp.name, inp.key, inp.kind)
                )
            elif inp.uri is not None:
                env[f"NPA_INPUT_{env_suffix(inp.name)}"] = inp.uri.removeprefix("file://")
        for out in task.outputs:
            local = self.output_path(task, out.path)
            ensure_private_dir(local if out.kind == "prefix" else local.parent)
            env[f"NPA_OUTPUT_{env_suffix(out.name)}"] = str(local)
        env.update(task.env)
        return env

    def run_stage(self, task: LocalTask) -> None:
        self.log(
            f"stage {task.stage}: {plural(task.waves, 'wave')} of up to "
            f"{plural(task.parallel, 'shard')}"
        )
        self.table.update(self.job_id, current_stage=task.stage)

        def begin(m: RunManifest) -> None:
            rec = m.stages.setdefault(task.stage, StageRecord())
            rec.state, rec.started_at = "RUNNING", now_iso()

        self.manifest(begin)
        env = self.stage_env(task)
        budget = self.policy.payload_retries(task.retries)
        adopted = set(self.submission.adopted_waves.get(task.stage, []))
        for wave in range(task.waves):
            if wave in adopted:
                self.log(f"stage {task.stage} wave {wave}: adopted from the earlier job")
                continue
            shards = list(range(wave * task.parallel, min((wave + 1) * task.parallel, task.shards)))
            attempt = 0
            while True:
                attempt += 1
                codes = self.run_wave(task, wave, shards, env, attempt)
                if self.cancelled:
                    raise Cancelled()
                failed = {s: c for s, c in codes.items() if c != 0}
                self.upload_logs(task.stage)
                if not failed:
                    stored = self.upload_outputs(task)
                    self._wave_done(task, wave, shards, codes, attempt, "SUCCEEDED", stored)
                    break
                shard, code = sorted(failed.items())[0]
                classification, why = classify_exit(code)
                detail = f"stage {task.stage} wave {wave} shard {shard}: {why}"
                verdict = self._record_failure(
                    task, wave, shards, codes, attempt, classification, detail, budget, code
                )
                if verdict is None:
                    budget -= 1 if classification is Classification.PAYLOAD else 0
                    self.log(f"{detail}; retrying the wave ({classification.value})")
                    continue
                raise StageFailed(verdict, detail)
        found = self.verify_outputs(task)
        missing = [name for name, size in found.items() if size == 0]
        if missing:
            detail = (
                f"stage {task.stage} exited 0 but declared outputs are missing or empty: "
                + ", ".join(missing)
            )
            self._stage_end(task, "FAILED", found, Classification.PAYLOAD.value, detail)
            self._supervise(
                task.stage,
                f"stage {task.stage}",
                "missing-outputs",
                Classification.PAYLOAD,
                detail,
                0,
            )
            raise StageFailed(JobState.FAILED, detail)
        self._stage_end(task, "SUCCEEDED", found, None, None)

    def run_wave(
        self, task: LocalTask, wave: int, shards: list[int], env: dict[str, str], attempt: int
    ) -> dict[int, int]:
        """Run one wave's shards, at most ``max_parallel`` at once; exit code per shard."""
        folder = ensure_private_dir(self.logs / task.stage)
        limit = max(1, min(task.parallel, self.submission.max_parallel))
        waiting = list(shards)
        running: dict[int, subprocess.Popen[bytes]] = {}
        codes: dict[int, int] = {}

        def mark(m: RunManifest) -> None:
            rec = m.stages.setdefault(task.stage, StageRecord())
            rec.waves = [w for w in rec.waves if w.wave != wave]
            rec.waves.append(
                WaveRecord(
                    wave=wave,
                    shards=shards,
                    state="RUNNING",
                    attempts=attempt,
                    started_at=now_iso(),
                )
            )

        self.manifest(mark)
        self.log(f"stage {task.stage} wave {wave} attempt {attempt}: shards {shards}")
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

    # --- manifest updates ---------------------------------------------------------------------
    def _wave_done(
        self,
        task: LocalTask,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        state: str,
        stored: dict[str, int] | None = None,
    ) -> None:
        def mutate(m: RunManifest) -> None:
            rec = m.stages.setdefault(task.stage, StageRecord())
            started = next((w.started_at for w in rec.waves if w.wave == wave), None)
            rec.waves = [w for w in rec.waves if w.wave != wave]
            rec.waves.append(
                WaveRecord(
                    wave=wave,
                    shards=shards,
                    state=state,
                    attempts=attempt,
                    started_at=started,
                    ended_at=now_iso(),
                    exit_codes={str(k): v for k, v in sorted(codes.items())},
                )
            )
            rec.waves.sort(key=lambda w: w.wave)
            if stored is not None:
                rec.outputs = stored

        self.manifest(mutate)

    def _record_failure(
        self,
        task: LocalTask,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        classification: Classification,
        detail: str,
        budget: int,
        code: int,
    ) -> JobState | None:
        """Record a failed wave; returns the terminal state, or None to retry the wave."""
        self._wave_done(task, wave, shards, codes, attempt, "FAILED")
        verdict_state = self._supervise(
            task.stage,
            f"stage {task.stage} wave {wave}",
            f"exit:{code}",
            classification,
            detail,
            budget,
        )
        if verdict_state is not None:
            self._stage_end(task, "FAILED", None, classification.value, detail)
        return verdict_state

    def _supervise(
        self,
        stage: str,
        what: str,
        failure: str,
        classification: Classification,
        detail: str,
        budget: int,
    ) -> JobState | None:
        result: list[JobState | None] = [None]

        def mutate(m: RunManifest) -> None:
            verdict = record(
                m.supervisor,
                what=what,
                failure=failure,
                classification=classification,
                detail=detail,
                policy=self.policy,
                payload_budget=budget,
                stage=stage,
            )
            result[0] = verdict.terminal_state

        self.manifest(mutate)
        return result[0]

    def _stage_end(
        self,
        task: LocalTask,
        state: str,
        outputs: dict[str, int] | None,
        classification: str | None,
        detail: str | None,
    ) -> None:
        def mutate(m: RunManifest) -> None:
            rec = m.stages.setdefault(task.stage, StageRecord())
            rec.state, rec.ended_at = state, now_iso()
            rec.classification, rec.detail = classification, detail
            if outputs is not None:
                rec.outputs = outputs

        self.manifest(mutate)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m npa.backends.local.supervisor JOB_DIR\n")
        return 2
    return Supervisor(Path(argv[0])).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
