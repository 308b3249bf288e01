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

import json
import os
import shlex
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import CliResult, run_npa
from tests.harness.procs import run_processes, wait_until

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
# The shards of the workflow below, by stage-wave-shard.
SHARDS = ["generate-0-0", "square-0-0", "square-1-1", "total-0-0"]


def write_spec(folder: Path, marks: Path, holds: Path) -> Path:
    """tiny-local with square in two waves of one shard; each shard logs start/done to
    ``marks/<stage>-<wave>-<shard>`` and waits while ``holds/<stage>-<wave>`` exists."""
    text = (EXAMPLES / "tiny-local.yaml").read_text()
    text = text.replace("      parallel: 2", "      parallel: 1")
    name = "$NPA_STAGE-$NPA_WAVE-$NPA_SHARD"
    before = (
        f"echo start >> {marks}/{name} && "
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

    def __init__(self, tmp_path: Path, npa_home: Path, **env: str) -> None:
        self.home = npa_home
        self.marks = tmp_path / "marks"
        self.holds = tmp_path / "holds"
        for d in (self.marks, self.holds, tmp_path / "workflow"):
            d.mkdir(exist_ok=True)
        self.spec = write_spec(tmp_path / "workflow", self.marks, self.holds)
        self.env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent), **env}
        self.run_id = ""

    def npa(self, *args: str, **extra: str) -> CliResult:
        return run_npa(*args, env={**self.env, **extra})

    def prepare(self) -> str:
        r = self.npa(*WF, "prepare-run", str(self.spec), "--project", "demo")
        assert r.code == 0, r.stderr
        self.run_id = r.stdout.strip()
        return self.run_id

    def submit(self, *extra: str) -> CliResult:
        return self.npa(*WF, "submit", str(self.spec), "--project", "demo",
                        "--run-id", self.run_id, *extra)  # fmt: skip

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

    def run_printed(self, command: str) -> CliResult:
        """Run a command npa printed, exactly as printed (it starts with ``npa``)."""
        argv = shlex.split(command)
        assert argv[0] == "npa", command
        return self.npa(*argv[1:])

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
    w.prepare()
    w.hold("generate-0", "square-0", "square-1", "total-0")
    r = w.submit("--json")
    assert r.code == 0, r.stdout + r.stderr
    job_id = r.json()["job_id"]
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
                        "--run-id", w.run_id])  # fmt: skip
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
