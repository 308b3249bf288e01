"""The local executor: runs one job's stages, wave by wave, and reports every step.

It runs inside the run's watcher process (:mod:`npa.launch.watch`, started detached in its own
session so it outlives the shell that submitted), which hands it the job and a recorder. Its
first act is to take the job's ``executor.lock`` and write its identity (pid and start time)
into it and into the job record; it holds the lock until it exits, so a job is executing exactly
while some process holds that lock. A second executor of the same job finds the lock held and
exits without touching anything. Its own log is the job's ``logs/supervisor.log``.

For each stage, in dependency order: fetch its inputs from the store, run each wave's shards (at
most ``parallel`` at once, and never more than the job's ``max_parallel``) in the stage's image
or as host processes, as its task says, each with the stage contract of
:mod:`npa.backends.contract` and an empty output folder of its own; put the outputs and logs
back into the store after every wave, and check every declared output is there and non-empty.
The job record is updated at each step; the run's record, and whether a failed wave runs again,
belong to the recorder (:class:`npa.backends.base.RunRecorder`).

Every shard runs under a small wrapper (:mod:`npa.backends.local.shard`) that leads a process
group of its own and kills that group when this process dies, however it dies (a shard in a
container also has its container removed then, by name: killing the engine's client alone would
leave the container running). A shard owns its group until the group is gone: when the stage's
command ends the wrapper kills the group, when the wrapper itself is killed this executor does,
and a shard counts as ended (so a wave's retry starts) only once no process of its group is
alive (:meth:`Executor.end_shard`). Each shard's identity and exit status are recorded under
``shards/<stage>/w<wave>/a<attempt>/``. An executor
that takes a job its predecessor left without a final state *continues* it: it first stops
every process an earlier executor of the run left (and refuses to start while any is alive),
then skips the stages and waves the run's record holds as succeeded and, in a wave that was cut
short, runs only the shards that did not run to the end.

A full disk does not leave a live-looking job behind: a reserve file taken at start is given
back before the final state is written, so the job ends in a recorded failed state.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from npa.adapters.containers import (
    RUN_LABEL,
    ContainerEngine,
    Mount,
    client_env,
    docker_client_config,
    find_engine,
    start_failure,
)
from npa.adapters.storage import ObjectAbsent, ObjectStore, open_store
from npa.adapters.storage.patient import PatientStore, stop_waiting, store_patience
from npa.backends import contract
from npa.backends.base import JobState, JobSubmission, RunRecorder, StageProgress, WaveProgress
from npa.backends.local import cgroup
from npa.backends.local import tasks as local_tasks
from npa.backends.local.jobs import LocalJobTable, ProcessRecord
from npa.backends.local.tasks import LocalTask
from npa.backends.phases import ShardPhases, write_phases
from npa.backends.phases import now as utc_now
from npa.core.errors import BackendError, NpaError, local_state_error, passes_by_itself
from npa.core.fsio import (
    atomic_write_bytes,
    atomic_write_text,
    ensure_private_dir,
    flock_within,
    refusals_named,
    write_holder,
)
from npa.core.layout import attempts_key, shards_of_wave
from npa.core.paths import NpaPaths
from npa.core.procs import (
    GroupMember,
    ProcessIdentity,
    await_exit,
    command_of,
    end_group,
    group_members,
    run_child,
    signal_group,
)
from npa.core.redaction import KnownSecrets, known_secrets
from npa.core.text import plural

POLL_SECONDS = 0.05
# A stage gets this long to stop after SIGTERM (a cancel) before its group is killed.
CANCEL_GRACE = 10.0
# Readers peek at the executor lock for an instant; another executor holds it for life.
LOCK_WAIT = 5.0
# How long the processes an earlier executor left may take to die once killed.
REAP_WAIT = 30.0
RESERVE_BYTES = 1 << 20
# Less free space than this after a failed wave: the disk is full, not the stage at fault.
MIN_FREE_BYTES = 64 << 10
SHARD_WRAPPER = Path(__file__).with_name("shard.py")
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


class Suspended(Exception):
    """The store still did not answer after an outage outlasted its patience: the job stays
    without a final state (continuable), so the same submit continues it."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def spawn_shard(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log: BinaryIO,
    exit_file: Path,
    death_fd: int,
    on_death: list[str] | None = None,
    tree_cgroup: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start one shard, tied to this executor's life: the leader of a new process group (the
    wrapper), which moves itself into ``tree_cgroup`` (when given), runs ``argv`` and kills its
    group and cgroup when ``death_fd`` reports this process gone, after running ``on_death``
    (what removes a shard's container). The one place a stage process, or a stage's container,
    is started."""
    cleanup = ["--on-death", json.dumps(on_death)] if on_death else []
    if tree_cgroup is not None:
        cleanup += ["--cgroup", str(tree_cgroup)]
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(SHARD_WRAPPER), str(death_fd), str(exit_file), *cleanup,
         "--", *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=(death_fd,),
    )  # fmt: skip


@dataclass(frozen=True)
class ShardTree:
    """Every process of one shard: the process group its wrapper leads and, where the machine
    offers one, the shard's cgroup (which also holds what left the group with ``setsid``)."""

    leader: ProcessIdentity
    cgroup: Path | None = None

    def members(self) -> list[GroupMember]:
        found = {m.pid: m for m in group_members(self.leader)}
        for pid in cgroup.members(self.cgroup) if self.cgroup is not None else []:
            found.setdefault(pid, GroupMember(pid, command_of(pid)))
        return sorted(found.values(), key=lambda m: m.pid)

    def remains(self) -> bool:
        """Whether anything of the tree is left: a live process, or the cgroup's folder."""
        return bool(self.members()) or (self.cgroup is not None and self.cgroup.is_dir())

    def signal(self, sig: int) -> None:
        signal_group(self.leader, sig)
        if self.cgroup is not None:
            cgroup.signal_all(self.cgroup, sig)

    def end(self, wait: float) -> list[GroupMember]:
        """End this shard's tree: kill its cgroup until it is empty and removed, and its group
        until none of it lives, within ``wait`` seconds; what still lives then ([]: all gone).
        The one place a shard's processes are ended from the executor's side."""
        deadline = time.monotonic() + wait
        left = {}
        if self.cgroup is not None:
            for pid in cgroup.end(self.cgroup, wait):
                left[pid] = GroupMember(pid, command_of(pid))
        for member in end_group(self.leader, max(0.0, deadline - time.monotonic())):
            left.setdefault(member.pid, member)
        return sorted(left.values(), key=lambda m: m.pid)

    def fix(self) -> str:
        """The command that kills what is left of the tree by hand."""
        kill = f"kill -KILL -- -{self.leader.pid}"
        if self.cgroup is None:
            return kill
        return f"{kill}; echo 1 > {self.cgroup}/cgroup.kill; rmdir {self.cgroup}"

    def record(self) -> str:
        """The text of the shard's ``s<N>.pid`` record (read back by :func:`shard_trees`)."""
        start = self.leader.start if self.leader.start is not None else ""
        return f"{self.leader.pid} {start}\n" + (f"{self.cgroup}\n" if self.cgroup else "")


@dataclass
class ShardProcess:
    """One started shard: its wrapper, the leader of the shard's process group, and for a shard
    in a container the command that removes that container by name.

    The wrapper is not reaped until its whole group is proven gone: while it is an unreaped
    zombie the kernel keeps its pid, which is the group's id, from being handed out again, so
    signalling the group by that id never reaches another process's group."""

    name: str  # "stage S wave W shard N", for the log and errors
    popen: subprocess.Popen[bytes]
    leader: ProcessIdentity
    exit_file: Path
    remove: list[str] | None = None
    cgroup: Path | None = None

    @property
    def tree(self) -> ShardTree:
        return ShardTree(self.leader, self.cgroup)

    def ended(self) -> bool:
        """Whether the wrapper has exited (it stays unreaped: see the class)."""
        if self.popen.returncode is not None:
            return True
        if not hasattr(os, "waitid"):  # macOS: reaped now; the group is found by its members
            return self.popen.poll() is not None
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        try:
            return os.waitid(os.P_PID, self.popen.pid, flags) is not None
        except ChildProcessError:  # reaped elsewhere: poll() says how it ended
            return self.popen.poll() is not None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the shard's whole group and cgroup."""
        if self.popen.returncode is not None:
            self.tree.signal(sig)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        if self.cgroup is not None:
            cgroup.signal_all(self.cgroup, sig)

    def end(self, wait: float) -> list[GroupMember]:
        """End whatever is left of the shard's tree (:meth:`ShardTree.end`), waiting at most
        ``wait`` seconds until none of it lives, then reap the wrapper; [] then. Otherwise the
        processes still alive at the deadline, the wrapper left unreaped (holding the id)."""
        left = self.tree.end(wait)
        if not left:
            self.popen.wait()
        return left

    def code(self) -> int:
        """The shard's exit status: what the wrapper recorded of its command, else how the
        wrapper itself ended (killed: no record)."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.exit_file.read_text().strip())
        assert self.popen.returncode is not None
        return self.popen.returncode


def group_outlived(
    name: str, tree: ShardTree, left: list[GroupMember], run: JobSubmission
) -> BackendError:
    """What stops a run when a shard's tree outlives :data:`REAP_WAIT` seconds of SIGKILL (a
    process stuck in the kernel: a hung network mount)."""
    return BackendError(
        f"{name}: processes of its group are still alive {REAP_WAIT:g}s after SIGKILL "
        f"(pids {', '.join(str(m.pid) for m in left)}); npa counts a shard as ended only once "
        "all of them are gone",
        fix=f"{tree.fix()}; npa workbench workflow status {run.run_id} --project {run.project}",
    )


def shard_trees(job_dir: Path) -> list[tuple[Path, ShardTree]]:
    """Every shard a job's executors started (record file, its tree), from the records
    :meth:`ShardTree.record` wrote."""
    found = []
    for record in sorted((job_dir / "shards").glob("*/w*/a*/s*.pid")):
        lines = record.read_text().splitlines() if record.is_file() else []
        parts = lines[0].split() if lines else []
        if parts and parts[0].isdigit():
            start = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            leader = ProcessIdentity(pid=int(parts[0]), start=start)
            cgroup_dir = Path(lines[1]) if len(lines) > 1 and lines[1].strip() else None
            found.append((record, ShardTree(leader, cgroup_dir)))
    return found


class Executor:
    def __init__(self, paths: NpaPaths, job_id: int, recorder: RunRecorder) -> None:
        self.paths = paths
        self.table = LocalJobTable(paths)
        self.job_id = job_id
        self.job_dir = self.table.job_dir(job_id)
        self.recorder = recorder
        self.submission: JobSubmission = self.table.submission(self.job_id)
        self.work = self.job_dir / "work"
        self.logs = self.job_dir / "logs"
        self.cancelled = False
        self.cancelled_at = 0.0
        self.children: list[ShardProcess] = []
        self.store: ObjectStore | None = None
        self.containers: ContainerRuntime | None = None
        self.lock_fd: int | None = None
        self.death_fd: int | None = None  # read end of the pipe shards watch (see shard.py)
        self.death_w: int | None = None  # its write end: open, never written, until we exit
        # Where shards get cgroups of their own (None: process groups only), and how many so far.
        self.cgroup_base: Path | None = None
        self.cgroups_made = 0
        self.since = time.time()  # when the job was first taken
        self._secrets: KnownSecrets | None = None
        # Each running shard attempt's phases so far, by (stage, wave, shard); written to the
        # store as the attempt ends (npa.backends.phases).
        self.phases: dict[tuple[str, int, int], dict[str, object]] = {}

    # --- records -----------------------------------------------------------------------------
    def redact(self, text: str) -> str:
        """``text`` without a credential (npa.core.redaction: the values this machine holds and
        the stages' declared secrets, read once per executor, and every credential-shaped
        value): what every text this executor keeps goes through."""
        if self._secrets is None:
            self._secrets = known_secrets(npa_home=self.paths.root)
            for body in self.submission.tasks.values():  # what the stages are given as secrets
                for name, source in local_tasks.parse(body).secrets.items():
                    variable = source.removeprefix(contract.SECRET_FROM_ENV)
                    self._secrets.add(os.environ.get(variable), f"secret:{name}")
        return self._secrets.redact(text)

    def log(self, message: str) -> None:
        at = datetime.now(UTC).isoformat(timespec="milliseconds")
        line = f"{at} {self.redact(message)}\n"
        try:
            with open(self.logs / "supervisor.log", "a", encoding="utf-8") as out:
                out.write(line)
        except OSError:  # a full or read-only disk: the watcher's own output still has it
            sys.stdout.write(line)
            sys.stdout.flush()

    @property
    def reserve_path(self) -> Path:
        return self.job_dir / "reserve"

    def reserve(self) -> None:
        """Hold some disk space back, so the final records can be written on a full disk."""
        with contextlib.suppress(OSError), open(self.reserve_path, "wb") as out:
            out.write(b"\0" * RESERVE_BYTES)
            out.flush()
            os.fsync(out.fileno())

    def release_reserve(self) -> None:
        with contextlib.suppress(OSError):
            self.reserve_path.unlink()

    # --- lifecycle ---------------------------------------------------------------------------
    def on_term(self, signum: int, frame: FrameType | None) -> None:
        if not self.cancelled:
            self.cancelled, self.cancelled_at = True, time.monotonic()
        stop_waiting()  # a store outage being waited out ends the wait
        self.signal_children(signal.SIGTERM)

    def signal_children(self, sig: int) -> None:
        for child in self.children:
            child.signal(sig)

    def end_shard(self, child: ShardProcess) -> int:
        """Count a shard whose wrapper exited as ended only once its whole process group is
        gone (what its command left running is killed, as Kubernetes kills a container's
        remaining processes when its main process ends); its exit status. Raises BackendError
        naming what still lives after :data:`REAP_WAIT` seconds."""
        begun = time.monotonic()
        members = child.tree.members()
        left = child.end(REAP_WAIT)
        if left:
            raise group_outlived(child.name, child.tree, left, self.submission)
        self.children.remove(child)
        code = child.code()
        if members:
            took = (time.monotonic() - begun) * 1000
            self.log(
                f"{child.name}: its wrapper ended with {plural(len(members), 'process')} of its "
                f"group alive ({', '.join(f'{m.pid} {m.command[:60]}' for m in members)}); "
                f"killed, the group was gone {took:.0f} ms later"
            )
        if child.remove and code < 0:  # the engine's client was killed, not its container
            self.remove_container(child)
        return code

    def remove_container(self, child: ShardProcess) -> None:
        """Remove the container of a shard whose wrapper was killed: killing the engine's client
        leaves the container running."""
        assert child.remove is not None
        try:
            run_child(child.remove, timeout=60)  # its own group, ended on a timeout
        except (OSError, subprocess.SubprocessError) as exc:
            self.log(f"{child.name}: could not remove its container: {exc}")

    def end_children(self) -> None:
        """Kill every shard still running and wait until their groups are gone; what is still
        alive after :data:`REAP_WAIT` seconds is logged (the final state must be written)."""
        self.signal_children(signal.SIGKILL)
        for child in list(self.children):
            left = child.end(REAP_WAIT)
            if left:
                pids = ", ".join(str(m.pid) for m in left)
                self.log(f"{child.name}: still alive after SIGKILL: pids {pids} (fix: "
                         f"{child.tree.fix()})")  # fmt: skip
            else:
                self.children.remove(child)

    def take_lock(self) -> bool:
        """Take the job's executor lock for the rest of this process's life; False when another
        executor holds it."""
        path = self.table.lock_path(self.job_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise local_state_error(exc, "create the lock", path) from None
        try:
            taken = flock_within(fd, path, LOCK_WAIT)
        except NpaError:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            return False
        me = ProcessIdentity.current()
        write_holder(fd, f"{me.pid} {me.start if me.start is not None else ''}\n")
        self.lock_fd = fd
        return True

    def run(self) -> int:
        """Execute the job to its end; the process exit code. Never raises."""
        try:
            return self._run()
        except NpaError as error:  # before the job was taken: nothing of it was changed
            self.log(f"error: {error.message}" + (f" (fix: {error.fix})" if error.fix else ""))
            return 1

    def _run(self) -> int:
        if not self.take_lock():
            self.log("another executor holds this job; exiting")
            return 0
        job = self.table.read(self.job_id)
        if job.state.terminal:
            return 0
        me = ProcessIdentity.current()
        now = time.time()
        self.since = job.started_at or now
        self.table.update(
            self.job_id,
            state=JobState.STARTING,
            started_at=self.since,
            executor=ProcessRecord(pid=me.pid, start=me.start, at=now),
            executors=job.executors + 1,
            interruption=None,
        )
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.log(f"executor {me} took job {self.job_id}" + (
            f" (continuing it after {job.executors} earlier executor(s))" if job.executors else ""
        ))  # fmt: skip
        self.cgroup_base, how = cgroup.place(f"{me.pid}-{me.start}")
        self.log(how)
        if job.cancel_requested:
            self.reap_previous()
            self.finish(JobState.CANCELLED, "cancelled before it started")
            return 0
        self.death_fd, self.death_w = os.pipe()  # neither end is inherited by default
        self.reserve()
        try:
            return self.execute()
        finally:
            self.release_reserve()

    def patient(self, store: ObjectStore) -> PatientStore:
        """``store`` riding out outages of up to the store's patience (see patient.py)."""
        return PatientStore(store, store_patience(), note=self.log)

    def execute(self) -> int:
        s = self.submission
        try:
            ensure_private_dir(self.work)
            ensure_private_dir(self.logs)
            self.store = self.patient(
                open_store(
                    s.store,
                    endpoint_url=s.endpoint_url,
                    region=s.region,
                    profile=s.profile,
                    paths=self.paths,
                )
            )
            self.run_recovering()
        except Cancelled:
            self.finish(JobState.CANCELLED, "cancelled")
            return 0
        except StageFailed as failed:
            self.finish(failed.state, failed.detail)
            return 1
        except Suspended as suspended:
            self.suspend(suspended.detail)
            return 1
        except NpaError as error:
            detail = error.message + (f"; fix: {error.fix}" if error.fix else "")
            self.log(f"error: {detail}")
            actionable = not passes_by_itself(error)
            self.finish(
                JobState.FAILED_CONTROLLER, detail, infrastructure=True, actionable=actionable
            )
            return 1
        except Exception as exc:  # the record must say the controller failed, not hang live
            self.log(traceback.format_exc())
            self.finish(JobState.FAILED_CONTROLLER, f"{type(exc).__name__}: {exc}")
            return 1
        self.finish(JobState.SUCCEEDED, None)
        return 0

    def run_recovering(self) -> None:
        """Run the job from its records to its end. A store outage that outlasts the store's
        patience is an infrastructure fault: the shards of the attempt it cut short are
        stopped, the policy records a recovery, and the job goes on from its records (a wave
        whose shards all ran to the end is not run again)."""
        while True:
            try:
                self.run_from_records()
                return
            except NpaError as error:
                if self.cancelled:
                    raise Cancelled() from None
                if not passes_by_itself(error):
                    raise
                self.recover(error)

    def run_from_records(self) -> None:
        s = self.submission
        assert self.store is not None
        self.recorder.started(self.job_id, s.order)
        self.reap_previous()
        self.recorder.restore_source(self.store, s.prefix, self.work / "source")
        self.table.update(self.job_id, state=JobState.RUNNING)
        self.recorder.running()
        for stage in s.order:
            if self.cancelled:
                raise Cancelled()
            if stage in s.adopted_stages:
                self.log(f"stage {stage}: adopted from the earlier job; not run again")
                continue
            progress = self.recorder.progress(stage, since=self.since)
            if progress.state == "SUCCEEDED":
                self.log(f"stage {stage}: succeeded under an earlier executor; not run again")
                continue
            if progress.state == "FAILED":
                raise StageFailed(JobState.FAILED, progress.detail or f"stage {stage} failed")
            self.run_stage(local_tasks.parse(s.tasks[stage]), progress)

    def recover(self, error: NpaError) -> None:
        """Stop what runs, and have the policy record the outage as an infrastructure
        recovery; returns when the job goes on. The policy may end the job instead
        (StageFailed, INFRASTRUCTURE_RECOVERY_EXHAUSTED); a store that still does not answer
        leaves it continuable (Suspended)."""
        self.stop_shards()
        stage = self.table.read(self.job_id).current_stage
        lasted = error.details.get("outage_seconds")
        detail = f"store outage{f' of {lasted:.0f} s' if lasted else ''}: {error.message}"
        self.log(f"{detail}; the shards that ran were stopped")
        try:
            verdict = self.recorder.infrastructure_fault(detail, stage=stage)
        except NpaError as again:
            if self.cancelled:
                raise Cancelled() from None
            if not passes_by_itself(again):
                raise
            raise Suspended(f"{detail}; still no answer when recording it") from None
        if not verdict.retry:
            assert verdict.state is not None
            raise StageFailed(verdict.state, verdict.detail)
        self.log("the store answers again: the job goes on from its records")

    def stop_shards(self) -> None:
        """End every shard still running, groups and containers (its attempt was cut short)."""
        self.end_children()
        self.remove_containers()

    def suspend(self, detail: str) -> None:
        """End this executor without a final state: the job reads as continuable, and the
        record says why; the same submit starts an executor that continues it."""
        self.stop_shards()
        self.release_reserve()
        why = (
            f"stopped without a final state, as the store did not answer ({detail}); the "
            "same submit continues the job"
        )
        self.log(f"executor {why}")
        try:
            self.table.update(self.job_id, interruption=why)
        except NpaError as error:
            self.log(f"could not record why in the job record: {error.message}")

    def finish(
        self,
        state: JobState,
        detail: str | None,
        *,
        infrastructure: bool = False,
        actionable: bool = False,
    ) -> None:
        """Stop what still runs and record the final state: the job record first (the local
        truth readers go by), then the run's record in the store. A record that cannot be
        written is logged; the job then reads as FAILED_CONTROLLER once this process exits."""
        self.end_children()
        self.remove_containers()
        self.release_reserve()
        self.log(f"run ends {state.value}" + (f": {detail}" if detail else ""))
        try:
            self.table.update(
                self.job_id,
                state=state,
                ended_at=time.time(),
                failure_reason=detail if state is not JobState.SUCCEEDED else None,
                current_stage=None,
            )
        except NpaError as error:
            self.log(f"could not record the final state in the job record: {error.message}")
        if self.store is not None:
            try:
                self.recorder.ended(
                    state, detail, infrastructure=infrastructure, actionable=actionable
                )
                self.upload_logs(None)
            except NpaError as error:
                self.log(f"could not record the final state in the store: {error.message}")

    def remove_containers(self) -> None:
        """Remove the run's containers still there (a killed engine client leaves its container
        running); a failure is logged, never raised: the final state must still be written."""
        if self.containers is None:
            return
        try:
            removed = self.containers.engine.remove_labelled(self.submission.run_id)
        except NpaError as error:
            self.log(f"could not remove the run's containers: {error.message}")
            return
        if removed:
            self.log(f"removed containers still running: {', '.join(removed)}")

    # --- what earlier executors left -----------------------------------------------------------
    def reap_previous(self) -> None:
        """Stop every shard process an earlier executor of this run left behind, and refuse to
        go on while one is alive or another executor of the run is at work."""
        s = self.submission
        leftovers: list[ShardTree] = []
        for job_id in self.jobs_of_this_run():
            if job_id != self.job_id:
                holder = self.table.executor_holding(job_id)
                if holder is not None:
                    raise BackendError(
                        f"job {job_id} of run {s.run_id} is still executed by {holder}; "
                        "two executors never run one run",
                        fix=f"npa workbench workflow cancel {s.run_id} --project {s.project}",
                    )
            for _, tree in shard_trees(self.table.job_dir(job_id)):
                if tree.remains():
                    tree.signal(signal.SIGKILL)
                    leftovers.append(tree)
        if not leftovers:
            return
        self.log(f"stopped {len(leftovers)} shard process tree(s) an earlier executor left")
        alive = [(tree, tree.end(REAP_WAIT)) for tree in leftovers]
        alive = [(tree, members) for tree, members in alive if members]
        if alive:
            pids = ", ".join(str(m.pid) for _, members in alive for m in members)
            fixes = "; ".join(tree.fix() for tree, _ in alive)
            raise BackendError(
                f"processes of an earlier attempt of run {s.run_id} are still alive "
                f"(pids {pids}); npa will not run a stage twice at once",
                fix=f"{fixes}  # then rerun the same submit",
            )

    def jobs_of_this_run(self) -> list[int]:
        """This job and every other local job of the same run (a resume's earlier jobs)."""
        s = self.submission
        found = [self.job_id]
        try:
            names = [p.name for p in self.table.root.iterdir() if p.name.isdigit()]
        except OSError:
            return found
        for name in names:
            if int(name) == self.job_id:
                continue
            try:
                other = self.table.submission(int(name))
            except (OSError, ValueError, NpaError):
                continue  # an allocation cut short, or not a job npa can read: not this run's
            if (other.project, other.run_id) == (s.project, s.run_id):
                found.append(int(name))
        return found

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
        return self.patient(
            open_store(
                f"s3://{bucket}",
                endpoint_url=s.endpoint_url,
                region=s.region,
                profile=s.profile,
                paths=self.paths,
            )
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
        home = Path(contract.relocate(contract.HOME_DIR, str(root)))
        home.mkdir(mode=0o700)
        if runtime is not None:
            assert task.user is not None
            runtime.writable(outputs, task.user)
            runtime.writable(home, task.user)
            return root
        (root / "source").symlink_to(self.work / "source", target_is_directory=True)
        (root / "inputs").mkdir()
        for name, path in inputs.items():
            (root / "inputs" / name).symlink_to(path)
        return root

    def upload_outputs(
        self, task: LocalTask, shards: list[int], *, again: bool = False
    ) -> dict[str, int]:
        """Put what each shard of a wave left in its outputs into the store (shards in order:
        a file two shards both wrote is the later shard's); returns bytes stored per output.
        ``again``: an earlier try of this upload may have stored some objects already; those
        the store holds with the same content are not written a second time."""
        assert self.store is not None
        stored = dict.fromkeys((o.name for o in task.outputs), 0)
        for shard in shards:
            root = str(self.shard_root(task, shard))
            for out in task.outputs:
                local = Path(contract.relocate(out.path, root))
                if out.kind == "file":
                    files = [(out.key, local)] if local.is_file() else []
                elif local.is_dir():
                    found = sorted(p for p in local.rglob("*") if p.is_file())
                    files = [(f"{out.key}/{f.relative_to(local).as_posix()}", f) for f in found]
                else:
                    files = []
                for key, file in files:
                    data = file.read_bytes()
                    if not (again and self.holds(key, data)):
                        self.store.put(key, data)
                    stored[out.name] += len(data)
        return stored

    def holds(self, key: str, data: bytes) -> bool:
        """Whether the store already holds exactly ``data`` at ``key`` (by its MD5 entity tag;
        a store without one is written again)."""
        assert self.store is not None
        try:
            info = self.store.head(key)
        except ObjectAbsent:
            return False
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        return info.size == len(data) and info.etag == digest

    def upload_logs(self, stage: str | None) -> None:
        assert self.store is not None
        folder = self.logs / stage if stage else self.logs
        files = [folder / "supervisor.log"] if stage is None else sorted(folder.glob("*.log"))
        for file in files:
            if file.is_file():
                where = f"stages/{stage}/logs/{file.name}" if stage else "logs/supervisor.log"
                self.store.put(f"{self.submission.prefix}/{where}", self.redact_log(file))

    def redact_log(self, file: Path) -> bytes:
        """A shard's log (what the stage printed) as it is kept: without a credential, here
        and in the store. The file is rewritten when redaction changed it, so no copy on this
        machine keeps what the store does not."""
        raw = file.read_bytes()
        text = raw.decode("utf-8", errors="surrogateescape")
        clean = self.redact(text)
        if clean == text:
            return raw
        data = clean.encode("utf-8", errors="surrogateescape")
        atomic_write_bytes(file, data)
        return data

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

    # --- phase records (evidence: a failure to write one never fails a shard) ----------------
    def shard_ended(self, stage: str, wave: int, shard: int, code: int) -> None:
        """A shard's command ended: note when and how; a failed attempt's record goes now."""
        known = self.phases.get((stage, wave, shard))
        if known is None:
            return
        known.update(command_ended_at=utc_now(), exit_code=code)
        if code != 0:
            self.write_phase(stage, wave, shard, note="")

    @contextlib.contextmanager
    def phases_kept(self, stage: str, wave: int) -> Iterator[None]:
        """Whatever ends a wave's attempt, the records of its shards are written: those the
        wave's end did not write say why their outputs were not uploaded."""
        try:
            yield
        except Cancelled:
            self.write_phases(stage, wave, note="the run was cancelled")
            raise
        except BaseException:
            self.write_phases(stage, wave, note="the executor stopped before uploading")
            raise
        self.write_phases(stage, wave, note="the wave failed: its outputs were not uploaded")

    def write_phases(
        self, stage: str, wave: int, *, uploaded: bool = False, note: str = ""
    ) -> None:
        at = utc_now()
        for key in [k for k in self.phases if k[:2] == (stage, wave)]:
            if uploaded:
                self.phases[key]["uploaded_at"] = at
            self.write_phase(stage, wave, key[2], note=note)

    def write_phase(self, stage: str, wave: int, shard: int, *, note: str) -> None:
        known = self.phases.pop((stage, wave, shard), None)
        if known is None or self.store is None:
            return
        try:
            record = ShardPhases.model_validate(
                {**known, "stage": stage, "wave": wave, "shard": shard, "backend": "local",
                 "ended_at": utc_now(), "note": note}
            )  # fmt: skip
        except ValueError as error:
            self.log(f"stage {stage} wave {wave} shard {shard}: no phase record: {error}")
            return
        # One try, not the patient store's wait: an outage must not hold the wave up for this.
        store = self.store.inner if isinstance(self.store, PatientStore) else self.store
        failed = write_phases(store, self.submission.prefix, record)
        if failed:
            self.log(f"stage {stage} wave {wave} shard {shard}: phase record not stored: {failed}")

    # --- stages ------------------------------------------------------------------------------
    def runtime_for(self, task: LocalTask) -> ContainerRuntime | None:
        """The container runtime a task asks for (None: host processes); one per job."""
        if task.runtime != "container":
            return None
        if self.containers is None:
            assert task.engine is not None
            engine = find_engine(task.engine)
            assert engine is not None  # an explicit engine that does not work raised
            self.containers = ContainerRuntime(
                engine, self.submission.run_id, self.work / "source", self.work
            )
            removed = engine.remove_labelled(self.submission.run_id)
            if removed:
                self.log(f"removed containers an earlier executor left: {', '.join(removed)}")
            self.containers.readable(self.work / "source")
        return self.containers

    def run_stage(self, task: LocalTask, progress: StageProgress) -> None:
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
        try:
            contract.secret_values(task.secrets, os.environ)
        except NpaError as error:
            raise StageFailed(
                JobState.FAILED_SETUP, f"stage {task.stage}: {error.message} (fix: {error.fix})"
            ) from None
        inputs = self.fetch_inputs(task, runtime)
        budget = max(0, self.recorder.retry_budget(task.retries) - progress.retries_spent)
        adopted = set(self.submission.adopted_waves.get(task.stage, []))
        for wave in range(task.waves):
            if wave in adopted:
                self.log(f"stage {task.stage} wave {wave}: adopted from the earlier job")
                continue
            if wave in progress.succeeded_waves:
                self.log(f"stage {task.stage} wave {wave}: succeeded under an earlier executor")
                continue
            budget = self.run_wave_to_end(
                task, wave, inputs, runtime, budget, progress.waves.get(wave)
            )
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
        earlier: WaveProgress | None,
    ) -> int:
        """Run one wave until it succeeds or the recorder ends the job; returns the payload
        retries left. An attempt an earlier executor began and did not finish is continued."""
        shards = shards_of_wave(wave, task.parallel, task.shards)
        attempt = earlier.attempts if earlier is not None else 0
        cut_short = earlier is not None and earlier.state == "RUNNING" and attempt > 0
        while True:
            continued = cut_short  # an attempt already begun: some outputs may be stored
            if not cut_short:
                attempt += 1
            cut_short = False
            self.recorder.wave_started(task.stage, wave, shards, attempt)
            self.log(f"stage {task.stage} wave {wave} attempt {attempt}: shards {shards}")
            with self.phases_kept(task.stage, wave):
                codes = self.run_wave(task, wave, shards, attempt, inputs, runtime)
                if self.cancelled:
                    raise Cancelled()
                self.upload_logs(task.stage)
                if all(code == 0 for code in codes.values()):
                    stored = self.upload_outputs(task, shards, again=continued)
                    self.write_phases(task.stage, wave, uploaded=True)
                    self.recorder.wave_succeeded(task.stage, wave, shards, codes, attempt, stored)
                    return budget
            self.check_space(task.stage, wave)
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
            error = start_failure(engine, tail, task.image)
            # Words from the shard's log are the stage's own output: it may echo a credential.
            why = self.redact(error.message if error else _last_line(tail))
            hint = f" (fix: {error.fix})" if error and error.fix else ""
            return f"stage {task.stage} wave {wave} shard {shard}: {engine.name}: {why}{hint}"
        return None

    def check_space(self, stage: str, wave: int) -> None:
        """A wave that failed on a full disk failed for this machine, not for its code: end the
        job as the controller's failure, naming the folder and the fix (a payload retry would
        only fail the same way)."""
        try:
            stats = os.statvfs(self.work)
        except OSError:
            return
        if stats.f_bavail * stats.f_frsize >= MIN_FREE_BYTES:
            return
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        action = f"hold the outputs of stage {stage} wave {wave} in"
        raise local_state_error(full, action, self.work)

    def run_wave(
        self,
        task: LocalTask,
        wave: int,
        shards: list[int],
        attempt: int,
        inputs: dict[str, Path],
        runtime: ContainerRuntime | None,
    ) -> dict[int, int]:
        """Run one attempt of a wave, at most ``max_parallel`` shards at once; exit code per
        shard. Shards of this attempt that already ran to the end (under an executor that died
        since) are not run again."""
        assert self.death_fd is not None
        folder = ensure_private_dir(self.logs / task.stage)
        records = ensure_private_dir(
            self.job_dir / "shards" / task.stage / f"w{wave}" / f"a{attempt}"
        )
        codes = _recorded_exits(records, shards)
        if codes:
            self.log(f"stage {task.stage} wave {wave}: shards {sorted(codes)} already ended")
        limit = max(1, min(task.parallel, self.submission.max_parallel))
        waiting = [s for s in shards if s not in codes]
        running: dict[int, ShardProcess] = {}

        while waiting or running:
            while waiting and len(running) < limit and not self.cancelled:
                shard = waiting.pop(0)
                began = utc_now()
                root = self.prepare_shard(task, shard, inputs, runtime)
                prepared = utc_now()
                started = self.count_attempt(task, wave, shard)
                with open(folder / f"wave-{wave}-shard-{shard}.log", "ab") as log:
                    child = self.start_shard(
                        task, wave, shard, started, root, inputs, log, records / f"s{shard}.exit"
                    )
                self.phases[(task.stage, wave, shard)] = {
                    "attempt": started, "started_at": began, "inputs_at": prepared,
                    "command_started_at": utc_now(),
                }  # fmt: skip
                running[shard] = child
                self.children.append(child)
                atomic_write_text(records / f"s{shard}.pid", child.tree.record())
            if self.cancelled and not running:
                break
            if self.cancelled and time.monotonic() - self.cancelled_at > CANCEL_GRACE:
                self.signal_children(signal.SIGKILL)
            for shard, child in list(running.items()):
                if child.ended():  # counted once nothing of its group is left
                    codes[shard] = self.end_shard(child)
                    del running[shard]
                    self.shard_ended(task.stage, wave, shard, codes[shard])
            # Until a shard's wrapper exits (at once, where pidfds tell it), or a poll's time
            # (a cancel, its grace): each stage used to wait out a sleep or two of it.
            await_exit([child.popen.pid for child in running.values()], POLL_SECONDS)
        return codes

    def start_shard(
        self,
        task: LocalTask,
        wave: int,
        shard: int,
        attempt: int,
        root: Path,
        inputs: dict[str, Path],
        log: BinaryIO,
        exit_file: Path,
    ) -> ShardProcess:
        """Start one shard under the shard wrapper: the one place the two runtimes differ. In a
        container the contract's paths are mounts (and the container is removed by name if this
        executor dies); as a host process they are moved under the shard's root."""
        assert self.death_fd is not None
        secrets = contract.secret_values(task.secrets, os.environ)  # checked as the stage began
        env = shard_variables(task, wave, shard, attempt, secrets)
        what = f"stage {task.stage} wave {wave} shard {shard}"
        if self.containers is not None and task.runtime == "container":
            name = f"npa-{self.job_id}-{task.stage}-w{wave}-s{shard}-a{attempt}"
            engine = self.containers.engine
            remove = [engine.binary, "rm", "--force", name]
            popen = spawn_shard(
                self.containers.argv(task, name, env, root, inputs),
                cwd=root,
                # What the engine's client needs to run, and the values it hands the container
                # by name; the container sees nothing else of it.
                env=self.containers.client_env(env),
                log=log,
                exit_file=exit_file,
                death_fd=self.death_fd,
                on_death=remove,
            )
            return ShardProcess(what, popen, ProcessIdentity.of(popen.pid), exit_file, remove)
        cwd = contract.relocate(task.workdir, str(root))
        tree_cgroup = self.new_cgroup(what)
        try:
            popen = spawn_shard(
                ["/bin/sh", "-c", task.command],
                cwd=Path(cwd),
                env={**contract.host_env(env, str(root)), "PWD": cwd},
                log=log,
                exit_file=exit_file,
                death_fd=self.death_fd,
                tree_cgroup=tree_cgroup,
            )
        except BaseException:
            if tree_cgroup is not None:
                cgroup.end(tree_cgroup, REAP_WAIT)
            raise
        return ShardProcess(
            what, popen, ProcessIdentity.of(popen.pid), exit_file, cgroup=tree_cgroup
        )

    def new_cgroup(self, what: str) -> Path | None:
        """A cgroup of its own for the next shard, where this machine offers them (see
        :mod:`npa.backends.local.cgroup`); None (its process group only) otherwise."""
        if self.cgroup_base is None:
            return None
        self.cgroups_made += 1
        me = ProcessIdentity.current()
        try:
            return cgroup.create(self.cgroup_base, f"{me.pid}-{me.start}-{self.cgroups_made}")
        except OSError as exc:
            self.log(f"{what}: runs in its process group only (no cgroup: {exc})")
            return None


def shard_variables(
    task: LocalTask, wave: int, shard: int, attempt: int, secrets: dict[str, str]
) -> dict[str, str]:
    """Every variable npa gives one shard, on both runtimes: the stage's built environment
    (:func:`contract.stage_env`, in its task), the shard's three and the secrets' values. A
    container adds its image's ``PATH``; a host process gets :func:`contract.host_env`."""
    return {**task.env, **contract.shard_env(wave, shard, attempt), **secrets}


def _recorded_exits(records: Path, shards: list[int]) -> dict[int, int]:
    """The exit codes the shard wrappers recorded for this attempt."""
    codes: dict[int, int] = {}
    for shard in shards:
        with contextlib.suppress(OSError, ValueError):
            codes[shard] = int((records / f"s{shard}.exit").read_text().strip())
    return codes


class ContainerRuntime:
    """Stages in their images through one engine: mounts, the user, and the files the user
    must read or write."""

    def __init__(self, engine: ContainerEngine, run_id: str, source: Path, work: Path) -> None:
        self.engine = engine
        self.run_id = run_id
        self.source = source
        # docker's client reads its own configuration for each container it starts; npa gives it
        # one without the proxies it would pass on (docker_client_config).
        self.client_config = (
            docker_client_config(os.environ, work / "docker-client")
            if engine.name == "docker"
            else None
        )
        # Rootless podman maps the contract's user to the user running npa, so the files a stage
        # writes are npa's own; as root, npa hands the output folders to that user instead.
        self.root = os.geteuid() == 0

    def client_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment the engine's client runs in (:func:`client_env`), pointed at the
        configuration this runtime chose for it."""
        out = client_env(env)
        if self.client_config is not None:
            out["DOCKER_CONFIG"] = str(self.client_config)
        return out

    def argv(
        self,
        task: LocalTask,
        name: str,
        env: dict[str, str],
        root: Path,
        inputs: dict[str, Path],
    ) -> list[str]:
        """The engine command that runs one shard: exactly the variables ``env`` holds (the
        stage's, the shard's and its secrets), the contract's folders mounted, as the
        contract's user."""
        assert task.image is not None and task.user is not None
        mounts = [Mount(self.source, contract.SOURCE_DIR, read_only=True)]
        by_name = {i.name: i for i in task.inputs}
        mounts += [Mount(path, by_name[n].path, read_only=True) for n, path in inputs.items()]
        mounts.append(Mount(root / "outputs", contract.OUTPUTS_DIR))
        mounts.append(Mount(root / "home", contract.HOME_DIR))
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
        data = store.get(key)
        with refusals_named("write the input", target):
            target.write_bytes(data)
        return
    ensure_private_dir(target)
    for obj in store.list(key.rstrip("/") + "/"):
        dest = target / obj.key[len(key.rstrip("/")) + 1 :]
        ensure_private_dir(dest.parent)
        data = store.get(obj.key)
        with refusals_named("write the input", dest):
            dest.write_bytes(data)


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
            with refusals_named("write the input", target):
                target.write_bytes(data)
            return
    fetch(store, key, target, "prefix")


def _holds_data(path: Path) -> bool:
    if path.is_file():
        return True
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
