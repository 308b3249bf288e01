"""The local executor: runs one job's stages, wave by wave, and reports every step.

It runs inside the run's watcher process (:mod:`npa.launch.watch`, started detached in its own
session so it outlives the shell that submitted), which hands it the job and a recorder. While
it lives it holds the job's ``supervisor.lock``; readers treat a live job without that lock as a
dead controller. It writes its own log to the job's ``logs/supervisor.log``.

For each stage, in dependency order: fetch its inputs from the store, run each wave's shards (at
most ``parallel`` at once, and never more than the job's ``max_parallel``) in the stage's image
or as host processes, as its task says, each with the stage contract of
:mod:`npa.backends.contract` and an empty output folder of its own; put the outputs and logs
back into the store after every wave, and check every declared output is there and non-empty.
The job record is updated at each step; the run's record, and whether a failed wave runs again,
belong to the recorder (:class:`npa.backends.base.RunRecorder`).
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
from typing import IO
from urllib.parse import unquote, urlparse

from npa.adapters.containers import (
    RUN_LABEL,
    ContainerEngine,
    Mount,
    find_engine,
    start_failure,
)
from npa.adapters.storage import ObjectAbsent, ObjectStore, open_store
from npa.backends import contract
from npa.backends.base import JobState, JobSubmission, RunRecorder
from npa.backends.local import tasks as local_tasks
from npa.backends.local.jobs import LocalJobTable
from npa.backends.local.tasks import LocalTask
from npa.core.errors import NpaError
from npa.core.fsio import ensure_private_dir
from npa.core.layout import attempts_key, shards_of_wave
from npa.core.paths import NpaPaths
from npa.core.text import plural

POLL_SECONDS = 0.05
# What ``podman run`` and ``docker run`` exit with when the engine itself failed (the stage's
# command never ran).
ENGINE_FAILED = 125


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
        self.containers: ContainerRuntime | None = None

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
    def stage_dir(self, task: LocalTask) -> Path:
        return self.work / "stages" / task.stage

    def shard_root(self, task: LocalTask, shard: int) -> Path:
        """The folder that stands for the contract's ``/npa`` for one shard: ``source`` and
        ``inputs`` are the job's and the stage's (linked in, for a host process), ``outputs`` is
        the shard's own."""
        return self.stage_dir(task) / "shards" / str(shard)

    def fetch_inputs(self, task: LocalTask, runtime: ContainerRuntime | None) -> dict[str, Path]:
        """Fetch every input of the stage once, into the stage's ``inputs`` folder; returns the
        host path of each input (an external ``file://`` input is used where it is)."""
        assert self.store is not None
        folder = self.stage_dir(task) / "inputs"
        if folder.exists():
            shutil.rmtree(folder)
        ensure_private_dir(folder)
        found: dict[str, Path] = {}
        for inp in task.inputs:
            target = folder / inp.name
            if inp.key is not None:
                fetch(self.store, inp.key, target, inp.kind)
            elif inp.uri is not None and inp.uri.startswith("file://"):
                target = Path(unquote(urlparse(inp.uri).path))
                if not target.exists():
                    raise StageFailed(
                        JobState.FAILED_SETUP,
                        f"stage {task.stage} input {inp.name}: {inp.uri} "
                        "does not exist on this machine",
                    )
            elif inp.uri is not None:
                fetch_external(self.external_store(inp.uri), inp.uri, target)
            if not _holds_data(target):
                raise StageFailed(
                    JobState.FAILED_SETUP,
                    f"stage {task.stage} input {inp.name}: nothing at {inp.uri or inp.key}",
                )
            found[inp.name] = target
        if runtime is not None:
            runtime.readable(folder)
        return found

    def external_store(self, uri: str) -> ObjectStore:
        """The store an external ``s3://`` input is read from: its bucket, through the run
        store's endpoint and credentials."""
        s = self.submission
        bucket = urlparse(uri).netloc
        return open_store(
            f"s3://{bucket}",
            endpoint_url=s.endpoint_url,
            region=s.region,
            profile=s.profile,
            paths=self.paths,
        )

    def prepare_shard(
        self,
        task: LocalTask,
        shard: int,
        inputs: dict[str, Path],
        runtime: ContainerRuntime | None,
    ) -> Path:
        """A fresh root for one shard's attempt: empty output folders (a file output's parent
        folder), and for a host process the source and inputs linked in where the contract puts
        them."""
        root = self.shard_root(task, shard)
        if root.exists():
            shutil.rmtree(root)
        ensure_private_dir(root)
        outputs = root / "outputs"
        for out in task.outputs:
            local = Path(contract.relocate(out.path, str(root)))
            (local if out.kind == "prefix" else local.parent).mkdir(parents=True, exist_ok=True)
        outputs.mkdir(exist_ok=True)
        if runtime is not None:
            assert task.user is not None
            runtime.writable(outputs, task.user)
            return root
        (root / "source").symlink_to(self.work / "source", target_is_directory=True)
        (root / "inputs").mkdir()
        for name, path in inputs.items():
            (root / "inputs" / name).symlink_to(path)
        return root

    def upload_outputs(self, task: LocalTask, shards: list[int]) -> dict[str, int]:
        """Put what each shard of a wave left in its outputs into the store (shards in order:
        a file two shards both wrote is the later shard's); returns bytes stored per output."""
        assert self.store is not None
        stored = dict.fromkeys((o.name for o in task.outputs), 0)
        for shard in shards:
            root = str(self.shard_root(task, shard))
            for out in task.outputs:
                local = Path(contract.relocate(out.path, root))
                if out.kind == "file":
                    if local.is_file():
                        data = local.read_bytes()
                        self.store.put(out.key, data)
                        stored[out.name] += len(data)
                    continue
                if not local.is_dir():
                    continue
                for file in sorted(p for p in local.rglob("*") if p.is_file()):
                    data = file.read_bytes()
                    self.store.put(f"{out.key}/{file.relative_to(local).as_posix()}", data)
                    stored[out.name] += len(data)
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

    def count_attempt(self, task: LocalTask, wave: int, shard: int) -> int:
        """This start's ``NPA_ATTEMPT``: the shard's starts in this run, counted in the store
        where every backend counts them."""
        assert self.store is not None
        key = attempts_key(self.submission.prefix, task.stage, wave, shard)
        try:
            before = int(self.store.get(key).decode().strip() or 0)
        except (ObjectAbsent, ValueError):
            before = 0
        self.store.put(key, f"{before + 1}\n".encode())
        return before + 1

    # --- stages ------------------------------------------------------------------------------
    def runtime_for(self, task: LocalTask) -> ContainerRuntime | None:
        """The container runtime a task asks for (None: host processes); one per job."""
        if task.runtime != "container":
            return None
        if self.containers is None:
            assert task.engine is not None
            engine = find_engine(task.engine)
            assert engine is not None  # an explicit engine that does not work raised
            self.containers = ContainerRuntime(engine, self.submission.run_id, self.work / "source")
            removed = engine.remove_labelled(self.submission.run_id)
            if removed:
                self.log(f"removed containers an earlier executor left: {', '.join(removed)}")
            self.containers.readable(self.work / "source")
        return self.containers

    def run_stage(self, task: LocalTask) -> None:
        self.log(
            f"stage {task.stage}: {plural(task.waves, 'wave')} of up to "
            f"{plural(task.parallel, 'shard')}"
        )
        self.table.update(self.job_id, current_stage=task.stage)
        self.recorder.stage_started(task.stage)
        try:
            runtime = self.runtime_for(task)
        except NpaError as error:
            raise StageFailed(
                JobState.FAILED_SETUP,
                f"stage {task.stage}: {error.message}"
                + (f" (fix: {error.fix})" if error.fix else ""),
            ) from None
        inputs = self.fetch_inputs(task, runtime)
        budget = self.recorder.retry_budget(task.retries)
        adopted = set(self.submission.adopted_waves.get(task.stage, []))
        for wave in range(task.waves):
            if wave in adopted:
                self.log(f"stage {task.stage} wave {wave}: adopted from the earlier job")
                continue
            budget = self.run_wave_to_end(task, wave, inputs, runtime, budget)
        found = self.verify_outputs(task)
        missing = [name for name, size in found.items() if size == 0]
        if missing:
            detail = self.recorder.outputs_missing(task.stage, found, missing)
            raise StageFailed(JobState.FAILED, detail)
        self.recorder.stage_succeeded(task.stage, found)

    def run_wave_to_end(
        self,
        task: LocalTask,
        wave: int,
        inputs: dict[str, Path],
        runtime: ContainerRuntime | None,
        budget: int,
    ) -> int:
        """Run one wave until it succeeds or the recorder ends the job; returns the payload
        retries left."""
        shards = shards_of_wave(wave, task.parallel, task.shards)
        attempt = 0
        while True:
            attempt += 1
            self.recorder.wave_started(task.stage, wave, shards, attempt)
            self.log(f"stage {task.stage} wave {wave} attempt {attempt}: shards {shards}")
            codes = self.run_wave(task, wave, shards, inputs, runtime)
            if self.cancelled:
                raise Cancelled()
            self.upload_logs(task.stage)
            if all(code == 0 for code in codes.values()):
                stored = self.upload_outputs(task, shards)
                self.recorder.wave_succeeded(task.stage, wave, shards, codes, attempt, stored)
                return budget
            refused = None if runtime is None else self.engine_refusal(task, wave, codes)
            left = 0 if refused else budget
            verdict = self.recorder.wave_failed(task.stage, wave, shards, codes, attempt, left)
            if refused:
                raise StageFailed(JobState.FAILED_SETUP, refused)
            if not verdict.retry:
                assert verdict.state is not None
                raise StageFailed(verdict.state, verdict.detail)
            budget -= 1 if verdict.spends_retry else 0
            self.log(f"{verdict.detail}; retrying the wave ({verdict.classification})")

    def engine_refusal(self, task: LocalTask, wave: int, codes: dict[int, int]) -> str | None:
        """Why the engine could not start a shard's container (its exit 125), if it could not:
        retrying the wave cannot help then."""
        assert self.containers is not None
        for shard, code in sorted(codes.items()):
            if code != ENGINE_FAILED:
                continue
            log = self.logs / task.stage / f"wave-{wave}-shard-{shard}.log"
            tail = log.read_text(errors="replace")[-4000:] if log.is_file() else ""
            engine = self.containers.engine
            error = start_failure(engine, tail)
            why = error.message if error else _last_line(tail)
            fix = f" (fix: {error.fix})" if error and error.fix else ""
            return f"stage {task.stage} wave {wave} shard {shard}: {engine.name}: {why}{fix}"
        return None

    def run_wave(
        self,
        task: LocalTask,
        wave: int,
        shards: list[int],
        inputs: dict[str, Path],
        runtime: ContainerRuntime | None,
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
                root = self.prepare_shard(task, shard, inputs, runtime)
                attempt = self.count_attempt(task, wave, shard)
                log = open(folder / f"wave-{wave}-shard-{shard}.log", "ab")  # noqa: SIM115
                try:
                    child = self.start_shard(task, wave, shard, attempt, root, inputs, log)
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

    def start_shard(
        self,
        task: LocalTask,
        wave: int,
        shard: int,
        attempt: int,
        root: Path,
        inputs: dict[str, Path],
        log: IO[bytes],
    ) -> subprocess.Popen[bytes]:
        """Start one shard: the one place the two runtimes differ. In a container the contract's
        paths are mounts; as a host process they are moved under the shard's root."""
        env = {**task.env, **contract.shard_env(wave, shard, attempt)}
        if self.containers is not None and task.runtime == "container":
            name = f"npa-{self.job_id}-{task.stage}-w{wave}-s{shard}-a{attempt}"
            argv = self.containers.argv(task, name, env, root, inputs)
            return subprocess.Popen(
                argv,
                env={**os.environ, **env},  # the engine's client reads the values by name
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        env = contract.relocate_env(env, str(root))
        cwd = contract.relocate(task.workdir, str(root))
        return subprocess.Popen(
            ["/bin/sh", "-c", task.command],
            cwd=cwd,
            env={**_host_env(), **env, "PWD": cwd},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class ContainerRuntime:
    """Stages in their images through one engine: mounts, the user, and the files the user
    must read or write."""

    def __init__(self, engine: ContainerEngine, run_id: str, source: Path) -> None:
        self.engine = engine
        self.run_id = run_id
        self.source = source
        # Rootless podman maps the contract's user to the user running npa, so the files a stage
        # writes are npa's own; as root, npa hands the output folders to that user instead.
        self.root = os.geteuid() == 0

    def argv(
        self,
        task: LocalTask,
        name: str,
        env: dict[str, str],
        root: Path,
        inputs: dict[str, Path],
    ) -> list[str]:
        assert task.image is not None and task.user is not None
        mounts = [Mount(self.source, contract.SOURCE_DIR, read_only=True)]
        by_name = {i.name: i for i in task.inputs}
        mounts += [Mount(path, by_name[n].path, read_only=True) for n, path in inputs.items()]
        mounts.append(Mount(root / "outputs", contract.OUTPUTS_DIR))
        uid, _, gid = task.user.partition(":")
        userns = None if self.root else f"keep-id:uid={uid},gid={gid}"
        return self.engine.run_argv(
            image=task.image,
            command=["/bin/sh", "-c", task.command],
            name=name,
            env=env,
            mounts=mounts,
            workdir=task.workdir,
            labels={RUN_LABEL: self.run_id},
            user=task.user,
            userns=userns,
        )

    def readable(self, folder: Path) -> None:
        """Let the container's user read ``folder`` (it sits in the job's owner-only folder,
        which no container sees)."""
        for path in [folder, *folder.rglob("*")]:
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            os.chmod(path, mode | (0o555 if path.is_dir() else 0o444))

    def writable(self, folder: Path, user: str) -> None:
        """Give the container's user (``uid:gid``) the shard's output folders."""
        if not self.root:
            return
        uid, _, gid = user.partition(":")
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, int(uid), int(gid), follow_symlinks=False)


def fetch(store: ObjectStore, key: str, target: Path, kind: str) -> None:
    """Copy a stored output (a file, or every object under a folder) to ``target``."""
    if kind == "file":
        ensure_private_dir(target.parent)
        target.write_bytes(store.get(key))
        return
    ensure_private_dir(target)
    for obj in store.list(key.rstrip("/") + "/"):
        dest = target / obj.key[len(key.rstrip("/")) + 1 :]
        ensure_private_dir(dest.parent)
        dest.write_bytes(store.get(obj.key))


def fetch_external(store: ObjectStore, uri: str, target: Path) -> None:
    """An external input, decided as on every backend: a URI ending in ``/`` is a folder; any
    other is the object with exactly that key, or the folder under it when there is none."""
    key = urlparse(uri).path.lstrip("/")
    if not uri.endswith("/") and key:
        try:
            data = store.get(key)
        except ObjectAbsent:
            pass
        else:
            ensure_private_dir(target.parent)
            target.write_bytes(data)
            return
    fetch(store, key, target, "prefix")


def _holds_data(path: Path) -> bool:
    if path.is_file():
        return True
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


def _host_env() -> dict[str, str]:
    """The environment a host process inherits: the executor's, without npa's own variables, so
    the stage sees exactly the contract's ``NPA_*``."""
    return {k: v for k, v in os.environ.items() if not k.startswith(contract.RESERVED_PREFIX)}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
