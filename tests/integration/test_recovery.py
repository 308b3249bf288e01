"""Recovery that tells the truth, tried with real processes: the local executor and ``submit``
killed at chosen points, a store (moto behind the fault proxy) that fails or stops answering, a
small tmpfs filled to its last byte, and parts of NPA_HOME mounted read-only.

Every kill lands at an event (a shard started, the proxy holds a chosen request), never after a
time. Every shard of the workflow logs ``start`` and ``done`` lines to a file of its own, so a
test counts how often each one really ran. After each fault the test runs the command npa
printed, exactly as printed, and asserts: every shard ran to the end exactly once, no process
of the run is left, and no traceback reached the user.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import CliResult, run_npa
from tests.harness.disks import bind, fill, read_only, tmpfs
from tests.harness.leftovers import command as leftovers_command
from tests.harness.procs import pid_alive, run_processes, wait_until
from tests.harness.s3 import S3Server
from tests.integration.store_proxy import ProxyState, store_proxy

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
# The shards of the workflow below, by stage-wave-shard.
SHARDS = ["generate-0-0", "square-0-0", "square-1-1", "total-0-0"]


def write_spec(folder: Path, marks: Path, holds: Path, leftovers: Path | None = None) -> Path:
    """tiny-local with square in two waves of one shard; each shard logs start/done to
    ``marks/<stage>-<wave>-<shard>`` and waits while ``holds/<stage>-<wave>`` exists. With
    ``leftovers``, each shard first checks no earlier start of it left a live process and
    leaves background children of its own (:mod:`tests.harness.leftovers`), and total's first
    attempt then fails (exit 3; total has one retry), so at least one later attempt checks."""
    text = (EXAMPLES / "tiny-local.yaml").read_text()
    text = text.replace("      parallel: 2", "      parallel: 1")
    name = "$NPA_STAGE-$NPA_WAVE-$NPA_SHARD"
    check = ""
    if leftovers is not None:
        check = (
            f"{leftovers_command(leftovers, name)} && "
            'if [ "$NPA_STAGE-$NPA_ATTEMPT" = total-1 ]; then exit 3; fi && '
        )
        text = text.replace("\n  - name: total\n", "\n  - name: total\n    retries: 1\n")
    before = (
        f"{check}echo start >> {marks}/{name} && "
        f"while [ -e {holds}/$NPA_STAGE-$NPA_WAVE ]; do sleep 0.05; done && "
    )
    after = f" && echo done >> {marks}/{name}"
    lines = []
    for line in text.splitlines():
        if line.startswith("    command: >-"):
            lines.append(line)
            continue
        if line.startswith("    command: "):
            body = line.removeprefix("    command: ")
            line = f"    command: {json.dumps(before + body + after)}"
        elif line.startswith('      mkdir -p "$NPA_OUTPUT_SQUARES"'):
            line = "      " + before + line.strip()
        elif line.startswith("      awk '{ print $1 * $1 }'"):
            line = line + after
        lines.append(line)
    spec = folder / "tiny-local.yaml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


class World:
    """One NPA_HOME, the spec above, and what its shards did."""

    def __init__(
        self, tmp_path: Path, npa_home: Path, leftovers: Path | None = None, **env: str
    ) -> None:
        self.home = npa_home
        self.marks = tmp_path / "marks"
        self.holds = tmp_path / "holds"
        for d in (self.marks, self.holds, tmp_path / "workflow", leftovers):
            if d is not None:
                d.mkdir(exist_ok=True)
        self.leftovers = leftovers
        self.spec = write_spec(tmp_path / "workflow", self.marks, self.holds, leftovers)
        self.env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent), **env}
        self.run_id = ""

    def npa(self, *args: str, **extra: str) -> CliResult:
        return run_npa(*args, env={**self.env, **extra})

    def prepare(self) -> str:
        r = self.npa(*WF, "prepare-run", str(self.spec), "--project", "demo")
        assert r.code == 0, r.stderr
        self.run_id = r.stdout.strip()
        return self.run_id

    def submit(self, *extra: str, env: dict[str, str] | None = None) -> CliResult:
        return self.npa(*WF, "submit", str(self.spec), "--project", "demo",
                        "--run-id", self.run_id, "--runtime", "process", *extra,
                        **(env or {}))  # fmt: skip

    def launch(self, *held: str) -> int:
        """Reserve a run and submit it with the ``held`` waves waiting; the job id."""
        self.prepare()
        self.hold(*held)
        r = self.submit("--json")
        assert r.code == 0, r.stdout + r.stderr
        job_id: int = r.json()["job_id"]
        return job_id

    def status(self) -> Any:
        r = self.npa(*WF, "status", self.run_id, "--project", "demo", "--json")
        return r.json()

    def hold(self, *waves: str) -> None:
        for wave in waves:
            (self.holds / wave).touch()

    def release(self, *waves: str) -> None:
        for wave in waves or tuple(p.name for p in self.holds.iterdir()):
            (self.holds / wave).unlink(missing_ok=True)

    def marks_of(self, shard: str) -> Counter[str]:
        path = self.marks / shard
        return Counter(path.read_text().split()) if path.exists() else Counter()

    def started(self, shard: str) -> bool:
        return self.marks_of(shard)["start"] > 0

    def run_printed(self, command: str, **extra: str) -> CliResult:
        """Run a command npa printed, exactly as printed (it starts with ``npa``)."""
        argv = shlex.split(command)
        assert argv[0] == "npa", command
        return self.npa(*argv[1:], **extra)

    def recovers_with(self, command: str, **extra: str) -> None:
        """Run a recovery command npa printed: it succeeds, the run ends SUCCEEDED, and every
        shard ran to the end exactly once."""
        r = self.run_printed(command, **extra)
        no_traceback(r)
        assert r.code == 0, r.stdout + r.stderr
        final = self.watch()
        assert final["state"] == "SUCCEEDED", final
        self.each_shard_done_once()

    def watch(self) -> dict[str, Any]:
        r = self.npa(*WF, "status", self.run_id, "--project", "demo", "--watch",
                     "--interval", "0.2", "--json")  # fmt: skip
        final: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
        return final

    def each_shard_done_once(self) -> None:
        for shard in SHARDS:
            assert self.marks_of(shard)["done"] == 1, (shard, self.marks_of(shard))
        total = self.home / "store/tiny-local" / self.run_id / "npa-workflow"
        total = total / "stages/total/outputs/total.txt"
        if total.parent.parent.exists():  # the file store under NPA_HOME
            assert total.read_text().strip() == "338350"


def no_traceback(r: CliResult) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.fixture
def world(tmp_path: Path, npa_home: Path) -> World:
    return World(tmp_path, npa_home)


def executor_of(w: World, job_id: int) -> int:
    from npa.backends.local.jobs import LocalJobTable
    from npa.core.paths import NpaPaths

    table = LocalJobTable(NpaPaths(w.home))
    wait_until(lambda: table.executor_holding(job_id) is not None, "an executor holds the job")
    holder = table.executor_holding(job_id)
    assert holder is not None
    return holder.pid


@pytest.mark.parametrize("at", ["generate-0-0", "square-1-1"])
def test_a_killed_executor_is_continued_by_the_command_status_prints(world: World, at: str) -> None:
    w = world
    job_id = w.launch("generate-0", "square-0", "square-1", "total-0")
    # Let the stages before the kill point run, then kill the executor while `at` runs.
    for shard in SHARDS:
        wave = shard.rsplit("-", 1)[0]
        wait_until(lambda shard=shard: w.started(shard), f"{shard} started")  # type: ignore[misc]
        if shard == at:
            break
        w.release(wave)
    os.kill(executor_of(w, job_id), signal.SIGKILL)
    # Its shards die with it: nothing of the run is left running.
    wait_until(lambda: not run_processes(w.run_id), "no process of the run is left")

    body = w.status()
    assert body["state"] == "FAILED_CONTROLLER", body
    assert "exited without recording a final state" in body["failure_reason"], body
    # What status prints first continues the job: the plain submit of this run.
    plain = shlex.join(["npa", *WF, "submit", str(w.spec), "--project", "demo",
                        "--run-id", w.run_id, "--runtime", "process"])  # fmt: skip
    assert body["next"][0] == plain, body["next"]

    w.release()
    again = w.run_printed(body["next"][0])
    no_traceback(again)
    assert again.code == 0, again.stdout + again.stderr
    assert f"as local job {job_id}" in again.stdout  # the same job, continued
    final = w.watch()
    assert final["state"] == "SUCCEEDED", final
    w.each_shard_done_once()
    assert w.marks_of(at)["start"] == 2  # only the killed shard ran again
    assert sum(w.marks_of(s)["start"] for s in SHARDS) == len(SHARDS) + 1
    assert not run_processes(w.run_id)


BUCKET = "npa-recovery"


@pytest.fixture
def s3_world(tmp_path: Path, npa_home: Path, s3: S3Server) -> Iterator[tuple[World, ProxyState]]:
    """The same workflow on an S3 store (moto) reached through the fault proxy, by the CLI
    and by the executors it starts."""
    s3.client().create_bucket(Bucket=BUCKET)
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        w = World(tmp_path, npa_home, **{**s3.env, "AWS_ENDPOINT_URL_S3": endpoint})
        r = w.npa("configure", "--project", "demo", "--store", f"s3://{BUCKET}/npa")
        assert r.code == 0, r.stderr
        yield w, proxy
        w.release()
        # Executors still at work end with the run (a failing test must not leave them).
        for pid in run_processes(w.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def local_jobs(w: World) -> list[str]:
    root = w.home / "local-jobs"
    return sorted(p.name for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


# Where submit is killed: committing the staged source; writing the run's manifest before the
# launch (LAUNCHING); writing it after, with the job id.
KILL_POINTS = {
    "source-commit": ("/source/manifest.json", 0),
    "manifest-launching": ("/npa-workflow/manifest.json", 0),
    "manifest-launched": ("/npa-workflow/manifest.json", 1),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_submit_killed_at_a_manifest_write_is_finished_by_its_rerun(
    s3_world: tuple[World, ProxyState], point: str
) -> None:
    w, proxy = s3_world
    w.prepare()
    contains, skip = KILL_POINTS[point]
    rule = proxy.rule("PUT", contains, "hold", skip=skip)
    argv = [sys.executable, "-m", "npa", *WF, "submit", str(w.spec), "--project", "demo",
            "--run-id", w.run_id, "--runtime", "process", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, env={**os.environ, **w.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not rule.hit.wait(0.05):
        assert proc.poll() is None, f"submit ended before {point}: " + str(proc.communicate())
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    proxy.clear()

    again = w.submit("--json")
    no_traceback(again)
    assert again.code == 0, again.stdout + again.stderr
    assert again.json()["outcome"] in ("launched", "adopted"), again.stdout
    final = w.watch()
    assert final["state"] == "SUCCEEDED", final
    w.each_shard_done_once()
    assert sum(w.marks_of(s)["start"] for s in SHARDS) == len(SHARDS)
    assert len(local_jobs(w)) == 1  # launched exactly once
    wait_until(lambda: not run_processes(w.run_id), "no process of the run is left")


def test_a_store_that_fails_right_after_launch_is_recovered_by_the_rerun(
    s3_world: tuple[World, ProxyState],
) -> None:
    w, proxy = s3_world
    w.prepare()
    w.hold("generate-0")
    # The manifest write that records the job id answers 500: submit fails, the job exists.
    proxy.rule("PUT", "/npa-workflow/manifest.json", "fail", skip=1)
    first = w.submit("--json")
    no_traceback(first)
    proxy.clear()
    assert first.code == 4, first.stdout + first.stderr
    error = first.json()["error"]
    # The fix shows the object that failed as it is in the store, then the submit that records
    # the job (it exists) and follows it.
    manifest = f"s3://{BUCKET}/npa/tiny-local/{w.run_id}/npa-workflow/manifest.json"
    assert error["fix"].startswith(shlex.join(["aws", "s3", "cp", manifest, "-"])), error
    assert f" && {error['details']['rerun']}" in error["fix"], error
    w.release()
    w.recovers_with(error["details"]["rerun"])
    assert len(local_jobs(w)) == 1


def rerun_of(error: dict[str, Any]) -> str:
    """The command an OS-refusal error says to rerun once its fix is applied."""
    # npa's own files, or the file store's: either way the system refused, not the run.
    assert error["kind"] in ("local_state_unavailable", "store_unavailable"), error
    command: str = error["details"]["rerun"]
    assert f" && {command}" in error["fix"], error
    return command


@pytest.mark.parametrize(
    "folder", ["locks", "operations", "workflow-submissions", "runs", "local-jobs", "store", "."]
)
def test_a_read_only_part_of_npa_home_is_an_npa_error_whose_rerun_works(
    world: World, folder: str
) -> None:
    w = world
    w.prepare()
    target = (w.home / folder).resolve()
    with read_only(target):
        r = w.submit("--json")
        no_traceback(r)
        assert r.code == 4, r.stdout + r.stderr
        error = r.json()["error"]
        assert "Read-only file system" in error["message"], error
        assert str(target) in error["message"] and f"findmnt -T {target}" in error["fix"]
        # Records stay readable and tell the truth: nothing was launched.
        body = w.status()
        assert body["state"] == "NOT_SUBMITTED", body
    assert not local_jobs(w)
    w.recovers_with(rerun_of(error))


def test_a_read_only_cache_is_not_needed(world: World) -> None:
    w = world
    w.prepare()
    with read_only(w.home / "cache"):
        r = w.submit("--json")
        no_traceback(r)
        assert r.code == 0, r.stdout + r.stderr
        assert w.watch()["state"] == "SUCCEEDED"
    w.each_shard_done_once()


@pytest.fixture
def small_home(tmp_path: Path, npa_home: Path) -> Iterator[World]:
    """NPA_HOME on a 16 MiB tmpfs; its store folder on the real disk (so the quota gate, which
    asks the store's filesystem, still passes): npa's own records are what fills up."""
    npa_home.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "store-on-disk"
    outside.mkdir()
    with tmpfs(npa_home, "16m"), bind(outside, npa_home / "store"):
        w = World(tmp_path, npa_home)
        # The quota gate also measures the executor's disk (this tmpfs): stages that declare no
        # disk pass it, and what fills up is npa's own records, as the tests mean.
        w.spec.write_text(w.spec.read_text().replace("      disk_gib: 1\n", ""))
        yield w
        w.release()
        for pid in run_processes(w.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_full_disk_at_submit_is_an_npa_error_whose_rerun_works(small_home: World) -> None:
    w = small_home
    w.prepare()
    filler = fill(w.home)
    r = w.submit("--json")
    no_traceback(r)
    assert r.code == 4, r.stdout + r.stderr
    error = r.json()["error"]
    assert "No space left on device" in error["message"], error
    assert f"df -h {w.home}" in error["fix"], error
    body = w.status()
    assert body["state"] == "NOT_SUBMITTED", body  # no LAUNCHING without a job
    filler.unlink()
    w.recovers_with(rerun_of(error))


def test_a_disk_that_fills_mid_run_ends_the_job_recorded(small_home: World) -> None:
    w = small_home
    job_id = w.launch("square-0")
    wait_until(lambda: w.started("square-0-0"), "square's first wave started")
    filler = fill(w.home)
    w.release()
    final = w.watch()
    # A final state recorded, never a live-looking job; the executor's log has no traceback.
    # The machine failed, not the stage: the reason names the folder and the fix.
    assert final["state"] == "FAILED_CONTROLLER", final
    assert "No space left on device" in (final["failure_reason"] or ""), json.dumps(final)
    assert f"df -h {w.home}" in final["failure_reason"], final
    # A full disk does not pass by itself: a person must act, so it is not retried.
    assert final["supervisor"]["classification"] == "actionable_configuration", final
    job = json.loads((w.home / "local-jobs" / str(job_id) / "job.json").read_text())
    assert job["state"] == final["state"], job
    log = (w.home / "local-jobs" / str(job_id) / "logs" / "supervisor.log").read_text()
    assert "Traceback" not in log, log
    wait_until(lambda: not run_processes(w.run_id), "no process of the run is left")
    filler.unlink()
    resume = next((n for n in final["next"] if "--resume-run" in n), None)
    assert resume is not None, json.dumps(final, indent=1)
    again = w.run_printed(resume)
    no_traceback(again)
    assert again.code == 0, again.stdout + again.stderr
    assert w.watch()["state"] == "SUCCEEDED"
    assert w.marks_of("generate-0-0")["done"] == 1  # what had succeeded is not run again
    assert all(w.marks_of(s)["done"] >= 1 for s in SHARDS)


def _executor_killed_in_generate(w: World) -> int:
    """Launch the run, SIGKILL its executor while generate's first shard runs, and wait until
    nothing of the run is left; the job's id."""
    job_id = w.launch("generate-0")
    wait_until(lambda: w.started("generate-0-0"), "generate started")
    os.kill(executor_of(w, job_id), signal.SIGKILL)
    wait_until(lambda: not run_processes(w.run_id), "no process of the run is left")
    return job_id


def test_cancel_stops_what_runs_and_reports_what_it_saw(world: World) -> None:
    w = world
    job_id = _executor_killed_in_generate(w)
    # The plain submit continues the job under a new executor, which runs generate again.
    again = w.submit("--json")
    assert again.code == 0 and again.json()["job_id"] == job_id, again.stdout + again.stderr
    wait_until(lambda: w.marks_of("generate-0-0")["start"] == 2, "generate started again")
    second = executor_of(w, job_id)

    c = w.npa(*WF, "cancel", w.run_id, "--project", "demo", "--json")
    no_traceback(c)
    assert c.code == 0, c.stdout + c.stderr
    body = c.json()
    # What cancel saw after signalling the live executor, not the request it made.
    assert (body["outcome"], body["job_state"]) == ("cancelled", "CANCELLED"), body
    assert not run_processes(w.run_id)  # the executor and its stage are gone when it returns
    assert not pid_alive(second)
    assert w.marks_of("generate-0-0")["done"] == 0  # stopped, not waited out
    assert w.status()["state"] == "CANCELLED"
    # A plain rerun never runs a cancelled job again.
    ended = w.submit("--json")
    assert ended.code == 1 and ended.json()["outcome"] == "ended", ended.stdout
    assert not run_processes(w.run_id) and w.marks_of("generate-0-0")["start"] == 2


def test_cancel_of_a_job_whose_executor_died_records_it_cancelled(world: World) -> None:
    w = world
    job_id = _executor_killed_in_generate(w)
    c = w.npa(*WF, "cancel", w.run_id, "--project", "demo", "--json")
    assert c.code == 0, c.stdout + c.stderr
    assert (c.json()["outcome"], c.json()["job_state"]) == ("cancelled", "CANCELLED"), c.stdout
    job = json.loads((w.home / "local-jobs" / str(job_id) / "job.json").read_text())
    assert job["state"] == "CANCELLED"


@pytest.mark.parametrize("phase", ["gates", "staging", "launch"])
def test_a_store_that_stops_answering_fails_in_bounded_time_with_exit_4(
    s3_world: tuple[World, ProxyState], phase: str
) -> None:
    w, proxy = s3_world
    w.prepare()
    if phase == "gates":
        proxy.hang = True  # from the first request on
    else:  # the first write of staging, or the run's first manifest write
        contains = "/blobs/" if phase == "staging" else "/npa-workflow/manifest.json"
        proxy.rule("PUT", contains, "hold")
    started = time.monotonic()
    # The 2 s budget is for the submit that meets the silent store. The recovery below runs
    # with the default budget: under a loaded CI machine a healthy store answered one request
    # of the recovery's executor in more than 2 s, and the run then failed as it should.
    r = w.submit("--json", env={"NPA_STORE_TIMEOUT_SECONDS": "2"})
    spent = time.monotonic() - started
    proxy.hang = False
    proxy.clear()
    no_traceback(r)
    assert r.code == 4, r.stdout + r.stderr
    # A bound, not a speed: the store's own budget is 2 s; nothing waits 60 s or retries forever.
    assert spent < 45, spent
    error = r.json()["error"]
    assert not local_jobs(w)  # nothing launched
    body = w.status()
    assert body["state"] in ("NOT_SUBMITTED", "PLAN_ONLY"), body
    # The fix ends with the submit that goes on once the store answers: run it as printed.
    w.recovers_with(error["details"]["rerun"])
