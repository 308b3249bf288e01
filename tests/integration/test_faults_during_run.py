"""The fault matrix: a store (moto behind the fault proxy) that fails while a local run is at
work, at a chosen moment, in a chosen way, for a chosen length.

Kinds: every request answered 500 (``error``), every connection dropped unanswered (``reset``),
every request left unanswered (``hang``). Moments, each an event, never a time: the count of a
shard's start (``wave-start``), a shard running (``mid-stage``), a wave's output upload
(``output-upload``), a write of the run's record (``state-record``). Lengths:

- ``short``: the store answers again after the executor asked 3 more times. The executor rides
  it out in the run (its store's patience): the run ends SUCCEEDED with no action.
- ``flap``: longer than the store's patience (8 s), so the executor stops the attempt's shards
  and records an infrastructure recovery once the store answers; the run goes on by itself.
- ``long``: it outlasts the patience (1 s) twice. The executor ends without a final state and
  the run reads as continuable; the command status prints continues it.

Every cell asserts: each shard ran to the end exactly once, each output object was written as
often as in a run without fault (never twice), no process of an earlier attempt of a shard was
alive when a later one started (each start of a shard leaves a background child and one that
ignores SIGTERM, and checks those of the shard's earlier starts by pid and start time:
:mod:`tests.harness.leftovers`; total's first attempt fails on purpose, so every cell has a
later attempt to check, besides those a fault causes), no process of the run is left, the run
ends SUCCEEDED only with its outputs, and what the user had to run was printed by npa.
36 cells: 4 moments x 3 kinds x 3 lengths with ``NPA_FAULT_MATRIX=full``; by default the 12 of
them that meet every pair of values (see :func:`matrix`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.leftovers import kill_recorded, recorded_alive, starts, violations
from tests.harness.procs import process_start, run_processes, wait_until
from tests.harness.s3 import S3Server
from tests.integration.store_proxy import ProxyState, store_proxy
from tests.integration.test_recovery import WF, World, local_jobs, no_traceback

pytestmark = pytest.mark.integration

BUCKET = "npa-faults"
KINDS = ["error", "reset", "hang"]
# What a request of each moment looks like: (method, part of the path, matching ones let through).
MOMENTS: dict[str, tuple[str, str, int]] = {
    "wave-start": ("PUT", "/stages/square/attempts/wave-1-shard-1", 0),
    "output-upload": ("PUT", "/stages/square/outputs/", 1),
    "state-record": ("PUT", "/npa-workflow/manifest.json", 8),
}
# How often a run without fault writes each output object (square's two waves both write it).
OUTPUT_WRITES = {
    "stages/generate/outputs/numbers/numbers.txt": 1,
    "stages/square/outputs/squares/squares.txt": 2,
    "stages/total/outputs/total.txt": 1,
}
PATIENCE = {"short": "120", "flap": "8", "long": "1"}
LENGTHS = list(PATIENCE)


class Faulty:
    """The world of test_recovery on an S3 store behind the fault proxy, with outages."""

    def __init__(self, world: World, proxy: ProxyState, s3: S3Server) -> None:
        self.w = world
        self.proxy = proxy
        self.s3 = s3
        self.asked_at_start = 0
        self.patience = PATIENCE["short"]

    def begin(self, kind: str) -> None:
        self.asked_at_start = self.asked()
        if kind == "error":
            self.proxy.fail_everything = True
        elif kind == "reset":
            self.proxy.drop_connections = True
        else:
            self.proxy.hang = True

    def end(self) -> None:
        self.proxy.fail_everything = self.proxy.drop_connections = self.proxy.hang = False
        self.proxy.clear()

    def asked(self) -> int:
        return sum(self.proxy.counts.values())

    def job_dir(self) -> Path:
        jobs = sorted((self.w.home / "local-jobs").iterdir())
        return [j for j in jobs if j.name.isdigit()][-1]

    def supervisor_log(self) -> str:
        path = self.job_dir() / "logs" / "supervisor.log"
        return path.read_text() if path.exists() else ""

    def executor_gone(self) -> bool:
        from npa.backends.local.jobs import LocalJobTable
        from npa.core.paths import NpaPaths

        table = LocalJobTable(NpaPaths(self.w.home))
        job_id = int(self.job_dir().name)
        return table.read(job_id).executor is not None and table.executor_holding(job_id) is None

    def writes_of(self, key: str) -> int:
        full = f"/{BUCKET}/npa/tiny-local/{self.w.run_id}/npa-workflow/{key}"
        return Counter(self.proxy.writes)[f"PUT {full}"]

    def total(self) -> str:
        key = f"npa/tiny-local/{self.w.run_id}/npa-workflow/stages/total/outputs/total.txt"
        body: bytes = self.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return body.decode().strip()


@pytest.fixture
def faulty(tmp_path: Path, npa_home: Path, s3: S3Server) -> Iterator[Faulty]:
    s3.client().create_bucket(Bucket=BUCKET)
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        # Each request of a silent store is given up after 4 s (the executor then asks again);
        # 2 s left a healthy answer on a loaded machine too little time (connect after 0.5 s).
        env = {**s3.env, "AWS_ENDPOINT_URL_S3": endpoint, "NPA_STORE_TIMEOUT_SECONDS": "4"}
        w = World(tmp_path, npa_home, leftovers=tmp_path / "leftovers", **env)
        r = w.npa("configure", "--project", "demo", "--store", f"s3://{BUCKET}/npa")
        assert r.code == 0, r.stderr
        f = Faulty(w, proxy, s3)
        yield f
        f.end()
        w.release()
        kill_recorded(tmp_path / "leftovers")
        for pid in run_processes(w.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_fault_at(f: Faulty, moment: str, kind: str) -> None:
    """Submit the run and start the outage at ``moment``."""
    w = f.w
    w.prepare()
    if moment == "mid-stage":
        w.hold("square-1")
    else:
        method, contains, skip = MOMENTS[moment]
        rule = f.proxy.rule(method, contains, "hold", skip=skip)
    r = w.submit("--json", env={"NPA_STORE_OUTAGE_SECONDS": f.patience})
    assert r.code == 0, r.stdout + r.stderr
    if moment == "mid-stage":
        wait_until(lambda: w.started("square-1-1"), "square's second wave started", timeout=120)
        f.begin(kind)
        w.release("square-1")
    else:
        assert rule.hit.wait(120), f"the run never reached {moment}"
        f.begin(kind)
        f.proxy.clear()  # the held request is dropped: the outage has begun


def end_fault_when_due(f: Faulty, length: str) -> None:
    if length == "short":
        wait_until(lambda: f.asked() >= f.asked_at_start + 3, "the executor asked 3 times", 120)
    elif length == "flap":
        wait_until(lambda: "the shards that ran were stopped" in f.supervisor_log(),
                   "the executor recorded the outage", timeout=120)  # fmt: skip
    else:
        wait_until(f.executor_gone, "the executor stopped without a final state", timeout=120)
    f.end()


def final_state(f: Faulty) -> tuple[dict[str, Any], list[str]]:
    """Follow the run to its end; a continuable stop is continued by the command status prints
    (what the user would run). Returns the final status and the commands run."""
    w = f.w
    ran: list[str] = []
    body = w.status()
    if body["state"] == "FAILED_CONTROLLER":
        assert "store did not answer" in body["failure_reason"], body
        command = body["next"][0]
        assert " --resume-run" not in command, command  # a plain submit, no manual flag
        again = w.run_printed(command)
        no_traceback(again)
        assert again.code == 0, again.stdout + again.stderr
        ran.append(command)
    return w.watch(), ran


def matrix() -> list[tuple[str, str, str]]:
    """Every (moment, kind, length) with ``NPA_FAULT_MATRIX=full`` (36 cells, about 20 minutes
    on one worker); otherwise 12 cells in which every pair of the three axes meets at least once
    (length = (moment + kind) mod 3), so each moment meets each kind and each length, and each
    kind each length."""
    moments = ["wave-start", "mid-stage", "output-upload", "state-record"]
    if os.environ.get("NPA_FAULT_MATRIX") == "full":
        return [(m, k, n) for m in moments for k in KINDS for n in LENGTHS]
    return [
        (m, k, LENGTHS[(i + j) % 3]) for i, m in enumerate(moments) for j, k in enumerate(KINDS)
    ]


def test_the_default_matrix_meets_every_pair() -> None:
    cells = matrix()
    for a, b in ((0, 1), (0, 2), (1, 2)):
        pairs = {(c[a], c[b]) for c in cells}
        assert len(pairs) == len({c[a] for c in cells}) * len({c[b] for c in cells}), (a, b)


@pytest.mark.parametrize(("moment", "kind", "length"), matrix())
def test_a_store_outage_during_a_run_loses_nothing_and_repeats_nothing(
    faulty: Faulty, moment: str, kind: str, length: str
) -> None:
    f = faulty
    f.patience = PATIENCE[length]
    start_fault_at(f, moment, kind)
    end_fault_when_due(f, length)
    final, ran = final_state(f)

    assert final["state"] == "SUCCEEDED", final
    assert f.total() == "338350"  # never SUCCEEDED without its outputs
    f.w.each_shard_done_once()
    for key, times in OUTPUT_WRITES.items():
        # A continued upload skips what the store already holds with the same content (square's
        # second wave writes what its first wrote): never more writes than without a fault.
        assert 1 <= f.writes_of(key) <= times, (key, f.proxy.writes)
    if length == "long":
        assert len(ran) == 1, ran  # the store never came back in time: the printed submit
    else:
        assert not ran, ran  # ridden out, or recovered, by the run itself
    recoveries = final["supervisor"]["infrastructure_recoveries"]
    assert recoveries == (1 if length == "flap" else 0), final["supervisor"]
    # No later start of a shard found a process of an earlier start alive; and the run read
    # final only once nothing any start left lives.
    leftovers = f.w.leftovers
    assert leftovers is not None
    assert violations(leftovers) == []
    assert recorded_alive(leftovers) == []
    # total's first attempt failed on purpose: its retry checked what the first one left.
    assert len(starts(leftovers, "total-0-0")) == 2
    wait_until(lambda: not run_processes(f.w.run_id), "no process of the run is left")


def test_the_leftover_check_catches_a_live_process_of_an_earlier_start(tmp_path: Path) -> None:
    """The per-cell check can fail: a second start of a shard while the first one's children
    live records them; once they are dead it records nothing, and a live process that merely
    has a recorded pid (another start time: the pid was reused) is not taken for one."""
    from tests.harness.leftovers import main

    folder = tmp_path / "leftovers"
    folder.mkdir()
    try:
        assert main([str(folder), "s"]) == 0 and violations(folder) == []
        first = recorded_alive(folder)
        assert len(first) == 2
        assert main([str(folder), "s"]) == 0
        caught = violations(folder)
        assert len(caught) == 2, caught
        for pid, tick in first:
            assert any(f"pid {pid} (start tick {tick}) of start 1 is alive" in v for v in caught)
        kill_recorded(folder)
        wait_until(lambda: recorded_alive(folder) == [], "the recorded processes are dead")
        me = process_start(os.getpid())
        assert me is not None
        (folder / "s.3").write_text(f"{os.getpid()} {me + 1}\n")  # this pid, another process
        assert main([str(folder), "s"]) == 0
        assert violations(folder) == caught  # nothing new
    finally:
        kill_recorded(folder)


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_outage_while_submit_stages_is_exit_4_and_its_rerun_goes_on(
    faulty: Faulty, kind: str
) -> None:
    f, w = faulty, faulty.w
    w.prepare()
    rule = f.proxy.rule("PUT", "/blobs/", "hold")  # the first write of the staged source
    argv = [sys.executable, "-m", "npa", *WF, "submit", str(w.spec), "--project", "demo",
            "--run-id", w.run_id, "--runtime", "process", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, env={**os.environ, **w.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert rule.hit.wait(120), "submit never staged"
    f.begin(kind)
    f.proxy.clear()
    out, err = proc.communicate(timeout=300)
    f.end()
    assert "Traceback" not in out + err, out + err
    assert proc.returncode == 4, out + err
    error = json.loads(out)["error"]
    assert not local_jobs(w)  # nothing launched
    # The outage is over: the rerun stages in the foreground with the default per-request
    # budget (the 4 s one is for the outage; a clean-clone run under load saw a healthy PUT's
    # answer take longer than its 2 s read half).
    w.recovers_with(error["details"]["rerun"], NPA_STORE_TIMEOUT_SECONDS="20")


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_outage_after_the_run_ended_is_unknown_never_absent(
    faulty: Faulty, kind: str
) -> None:
    f, w = faulty, faulty.w
    w.prepare()
    assert w.submit("--json").code == 0
    assert w.watch()["state"] == "SUCCEEDED"
    f.begin(kind)
    r = w.npa(*WF, "status", w.run_id, "--project", "demo", "--json", "--read-timeout", "3")
    no_traceback(r)
    assert r.code == 4, r.stdout + r.stderr
    assert r.json()["state"] == "VERIFICATION_UNAVAILABLE", r.stdout
    f.end()
    body = w.status()
    assert body["state"] == "SUCCEEDED", body
    assert f.total() == "338350"
    w.each_shard_done_once()
