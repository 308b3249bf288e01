"""``status --watch`` held against the store and SkyPilot's queue at each moment it printed.

A watch line is true when what it says held when the poll behind it was answered. The test side
has two witnesses that do not go through npa:

- the store: a thread reads the run's manifest from moto once a second and keeps every answer
  with the time it got it (the manifest is npa's verdict: the state, the job it names, each
  stage's record);
- SkyPilot's queue: read once the watch has ended, with every job's (and task's) submitted,
  started and ended times, which SkyPilot stamps itself as the job moves.

:func:`untrue_lines` then checks every line the watch printed against both. A final state may
never be printed before the store holds it ("ahead of the verdict"); a live state must be one
the queue shows the run's job in at that time; a job line must name a job of the run in the
state the queue's times give it. "At that moment" is a window, not an instant: from the
moment the poll behind the line began asking (each event says when: ``asked_from``) to the
line's arrival plus the sampler's period (``AHEAD``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from npa.core.layout import job_name, manifest_key, relaunch_suffix, run_prefix
from npa.runs.reading import CUT_SHORT
from tests.harness.skypilot_cluster import SkyCluster
from tests.integration.clusterworld import TERMINAL, WF

# SkyPilot stamps a task's end when the task ends; its queue says the job ended only once the
# jobs controller notices, which on the cluster came 40-50 s later (2026-12-04: ended 13:39:03,
# RUNNING in the queue at 13:39:13, FAILED at 13:39:54).
NOTICED = 120.0
AHEAD = 2.5  # the sampler's period (1 s), one GET, and the seconds-precision of a line's time
STALE = 90.0  # how old a poll's answer can be, for a line that does not say when it asked
RELAUNCHES = tuple(f".a{n}" for n in range(1, 10))
LIVE_JOB = frozenset({"PENDING", "STARTING", "RUNNING", "RECOVERING", "SUBMITTED", "CANCELLING"})


@dataclass(frozen=True)
class Sample:
    """One read of the manifest: when, and what it said (``state`` None: not written yet)."""

    t: float
    state: str | None
    job_id: int | None = None
    stages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Printed:
    """One line of ``status --watch --json``, with the time the test read it."""

    arrived: float
    event: dict[str, Any]

    @property
    def at(self) -> float:
        return datetime.fromisoformat(self.event["at"]).timestamp()

    @property
    def lo(self) -> float:
        """The earliest moment the line can speak of: when its poll began asking (less the
        sampler's period), or ``STALE`` before its time for a line that does not say."""
        asked = self.event.get("asked_from")
        if asked is None:
            return self.at - STALE
        return datetime.fromisoformat(asked).timestamp() - 1.0


@dataclass(frozen=True)
class Task:
    """One task (a stage, or a wave of one) of a job, with SkyPilot's own times."""

    status: str
    start_at: float | None  # SkyPilot stamps it when the task first turns RUNNING
    end_at: float | None


@dataclass
class Job:
    """A job of the run as SkyPilot's queue has it: its tasks, and its status over them (the
    first that did not succeed)."""

    job_id: int
    name: str
    status: str
    submitted_at: float | None
    tasks: list[Task] = field(default_factory=list)

    def live_from(self, lo: float) -> bool:
        """A task of the job had not ended by ``lo``."""
        return any(t.end_at is None or t.end_at >= lo for t in self.tasks)


@dataclass
class Watched:
    code: int
    lines: list[Printed]
    samples: list[Sample]
    jobs: dict[int, Job] = field(default_factory=dict)
    stderr: str = ""

    @property
    def events(self) -> list[dict[str, Any]]:
        return [p.event for p in self.lines]

    def run_states(self) -> list[str]:
        return [p.event["after"] for p in self.lines if p.event.get("event") == "state"]

    def store_states(self) -> list[str | None]:
        """The manifest's states in the order the sampler saw them, each once per stretch."""
        out: list[str | None] = []
        for s in self.samples:
            if not out or out[-1] != s.state:
                out.append(s.state)
        return out

    def explain(self) -> str:
        jobs = {j: vars(job) for j, job in self.jobs.items()}
        return (
            f"exit {self.code}\nprinted:\n"
            + "\n".join(f"  +{p.arrived:.1f} {json.dumps(p.event)[:400]}" for p in self.lines)
            + f"\nstore states: {self.store_states()}\njobs: {json.dumps(jobs, default=str)}\n"
            + self.stderr[-2000:]
        )


class ManifestSampler(threading.Thread):
    """Reads the manifest once a second until stopped."""

    def __init__(self, world: SkyCluster, key: str) -> None:
        super().__init__(daemon=True)
        self.world, self.key = world, key
        self.samples: list[Sample] = []
        self.stop = threading.Event()

    def run(self) -> None:
        client = self.world.s3.client()
        while not self.stop.is_set():
            try:
                body = client.get_object(Bucket=self.world.bucket, Key=self.key)["Body"].read()
                m = json.loads(body)
                sample = Sample(
                    time.time(),
                    m["state"],
                    m.get("job_id"),
                    tuple(sorted((n, s.get("state", "")) for n, s in m.get("stages", {}).items())),
                )
            except client.exceptions.NoSuchKey:
                sample = Sample(time.time(), None)
            except Exception:  # the store is moto on loopback; a hiccup only costs a sample
                sample = None
            if sample is not None:
                self.samples.append(sample)
            self.stop.wait(1.0)


def watch_checked(
    world: SkyCluster, workflow: str, run_id: str, *, timeout: float = 1500, interval: int = 10
) -> Watched:
    """``status --watch --json`` to its end, with the manifest sampled beside it and the
    queue read after it."""
    # The run's prefix as status gives it (the store URI may carry a prefix of its own).
    where = world.npa(*WF, "status", run_id, "--project", world.project, "--json", "--cached")
    prefix_uri = where.json().get("run_prefix") or run_prefix(workflow, run_id)
    prefix = prefix_uri.removeprefix(f"s3://{world.bucket}/")
    sampler = ManifestSampler(world, manifest_key(prefix))
    sampler.start()
    argv = [sys.executable, "-m", "npa", *WF, "status", run_id, "--project", world.project,
            "--watch", "--json", "--interval", str(interval)]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **world.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[Printed] = []
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip():
                lines.append(Printed(time.time(), json.loads(line)))
        code = proc.wait()
    finally:
        killer.cancel()
        sampler.stop.set()
        sampler.join(10)
        drain.join(10)
    # One more read after the end: the verdict the watch ended on is in the store now.
    watched = Watched(code, lines, list(sampler.samples), stderr="".join(stderr))
    watched.jobs = queue_jobs(world, job_name(workflow, run_id))
    return watched


def queue_jobs(world: SkyCluster, base: str) -> dict[int, Job]:
    """Every job SkyPilot's queue holds named ``base`` or a relaunch of it (``base-aN``), with
    its times, read through SkyPilot's own client."""
    code = (
        "import json, sky\n"
        "recs, *_ = sky.get(sky.jobs.queue_v2(refresh=False, all_users=True, fields=None))\n"
        "def val(v):\n"
        "    return getattr(v, 'value', v)\n"
        "print(json.dumps([{k: val(getattr(r, k, None)) for k in ('job_id', 'job_name', "
        "'task_name', 'status', 'submitted_at', 'start_at', 'end_at')} for r in recs], "
        "default=str))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **world.env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    jobs: dict[int, Job] = {}
    rows = [r for r in json.loads(out.stdout.strip().splitlines()[-1])
            if relaunch_suffix(str(r["job_name"]), base) in ("", *RELAUNCHES)]  # fmt: skip
    for r in rows:
        job_id = int(r["job_id"])
        job = jobs.setdefault(job_id, Job(job_id, r["job_name"], "", None))
        times = {k: None if r[k] is None else float(r[k]) for k in ("start_at", "end_at")}
        job.tasks.append(Task(str(r["status"]), times["start_at"], times["end_at"]))
        if r["submitted_at"] is not None:
            sub = float(r["submitted_at"])
            job.submitted_at = sub if job.submitted_at is None else min(job.submitted_at, sub)
    for job in jobs.values():
        statuses = [t.status for t in job.tasks]
        job.status = next((s for s in statuses if s != "SUCCEEDED"), statuses[-1])
    return jobs


def untrue_lines(w: Watched) -> list[str]:
    """Every printed line that was not true when its poll was answered, with why."""
    truth = _Truth(w)
    return truth.run_lines() + truth.job_lines() + truth.stage_lines()


@dataclass
class _Truth:
    w: Watched

    def store_had(self, pred: Any, lo: float, hi: float) -> bool:
        return any(pred(s) for s in self.w.samples if lo <= s.t <= hi)

    def job_in(self, job: Job, state: str, lo: float, arrived: float) -> bool:
        """Whether SkyPilot's times put ``job`` in ``state`` at some moment of a poll that
        began at ``lo`` and printed at ``arrived``. A job of several tasks is PENDING again
        between them, so the live states are read per task."""
        hi = arrived + AHEAD
        # SkyPilot stamps submitted_at as the job leaves PENDING (sky/jobs/state.py: NULL until
        # STARTING); a job is in its queue, PENDING, before that (2026-12-04: a relaunch's job
        # was found PENDING 15 s before its submitted_at).
        if job.submitted_at is not None and job.submitted_at > hi and state != "PENDING":
            return False
        if state in TERMINAL:
            ends = [t.end_at for t in job.tasks if t.end_at is not None]
            running = any(t.start_at is not None and t.end_at is None for t in job.tasks)
            return bool(ends) and max(ends) <= hi and not running
        lo -= NOTICED  # a live state may be reported until the controller notices the end
        if state == "RUNNING":
            return any(
                t.start_at is not None and t.start_at <= hi and (t.end_at is None or t.end_at >= lo)
                for t in job.tasks
            )
        if state in ("PENDING", "STARTING"):
            return any(
                (t.start_at is None or t.start_at >= lo) and (t.end_at is None or t.end_at >= lo)
                for t in job.tasks
            )
        return job.live_from(lo)  # RECOVERING, CANCELLING...: any moment before its end

    def run_lines(self) -> list[str]:
        bad: list[str] = []
        states = [p for p in self.w.lines if p.event.get("event") == "state"]
        for i, p in enumerate(states):
            why = self._run_line(p, last=i == len(states) - 1)
            if why:
                bad.append(f"run line {i} ({p.event['after']} at {p.event['at']}): {why}")
        samples = self.w.samples
        if states and samples and states[-1].event["after"] != samples[-1].state:
            ended = states[-1].event["after"]
            bad.append(f"the watch ended on {ended}, the store on {samples[-1].state}")
        return bad

    def _run_line(self, p: Printed, *, last: bool) -> str:
        s, lo, arrived = p.event["after"], p.lo, p.arrived
        if s in TERMINAL:
            if not self.store_had(lambda x: x.state == s, 0, arrived + AHEAD):
                return "printed before the store recorded it (ahead of the verdict)"
            return "" if last else "a final state followed by another state"
        if s == "LAUNCHING":
            had = self.store_had(lambda x: x.state == "LAUNCHING", lo, arrived + AHEAD)
            return "" if had else "the store did not record LAUNCHING then"
        if s == "MANIFEST_PENDING":
            had = self.store_had(lambda x: x.state is None, lo, arrived + AHEAD)
            return "" if had else "the manifest was already there"
        if s not in LIVE_JOB:
            return f"a healthy run never shows {s}"
        first_final = next((x.t for x in self.w.samples if x.state in TERMINAL), None)
        if first_final is not None and first_final < lo:
            return "the store had the verdict long before"
        in_queue = any(self.job_in(j, s, lo, arrived) for j in self.w.jobs.values())
        in_store = self.store_had(lambda x: x.state == s, lo, arrived + AHEAD)
        return "" if in_queue or in_store else f"neither a job of the run nor the store was {s}"

    def job_lines(self) -> list[str]:
        bad: list[str] = []
        for i, p in enumerate(e for e in self.w.lines if e.event.get("event") == "job"):
            j, job_id, lo = p.event["after"], p.event.get("job_id"), p.lo
            where = f"job line {i} (job {job_id} {j} at {p.event['at']})"
            job = self.w.jobs.get(int(job_id)) if job_id is not None else None
            if job is None:
                bad.append(f"{where}: no job of the run has that id in SkyPilot's queue")
                continue
            if not self.job_in(job, j, lo, p.arrived):
                bad.append(f"{where}: SkyPilot's times say otherwise ({vars(job)})")
            if j in TERMINAL and job.status != j:
                bad.append(f"{where}: SkyPilot's queue ends that job {job.status}")
            # Status finds a job by the run's name before the manifest records its id (a
            # launch or relaunch being adopted): a manifest naming no job yet contradicts nothing.
            hi = p.arrived + AHEAD
            named = self.store_had(lambda x, job_id=job_id: x.job_id in (job_id, None), lo, hi)
            if not named:
                bad.append(f"{where}: the store named another job then")
        return bad

    def stage_lines(self) -> list[str]:
        """A stage's final state is the store's record, or the evidence of a task SkyPilot
        ended so (a stage's attempt fails before npa decides its retry), or, for CANCELLED, the
        readers' rule for a final run (npa/runs/reading.py): a stage whose record is not final
        reads CANCELLED once the store holds the run's final state."""
        bad: list[str] = []
        tasks = [t for j in self.w.jobs.values() for t in j.tasks]
        for i, p in enumerate(e for e in self.w.lines if e.event.get("event") == "stage"):
            stage, st, hi = p.event["stage"], p.event["after"], p.arrived + AHEAD
            if st not in TERMINAL:
                continue
            stored = self.store_had(lambda x, stage=stage, st=st: (stage, st) in x.stages, 0, hi)
            ended = any(t.status == st and t.end_at is not None and t.end_at <= hi for t in tasks)

            def cut(x: Sample, stage: str = stage) -> bool:
                return x.state in TERMINAL and dict(x.stages).get(stage) not in TERMINAL

            cut_short = st == CUT_SHORT and self.store_had(cut, 0, hi)
            if not (stored or ended or cut_short):
                bad.append(f"stage line {i} ({stage} {st}): neither the store nor a task had it")
        return bad
