"""A shard owns its process tree until it is gone, tried with real processes on the local
backend: stages that leave background children running (``sleep 300 &``, a writer that appends
a line to a file every 0.1 s and ignores SIGTERM, a child that calls ``setsid`` and ignores
SIGTERM) and a shard wrapper killed with SIGKILL; with a cgroup per shard where this machine
offers cgroup v2, and with process groups only.

Every background child writes its pid to a file, so a test checks the very processes the stage
started. The checks that matter are made the moment npa says a shard or run ended, without
waiting: npa counts a shard as ended only once its whole group is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import leftovers
from tests.harness.cli import CliResult, run_npa
from tests.harness.procs import pid_alive, run_processes, wait_until
from tests.harness.tools import in_ci

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_STARTUP", "FAILED_CONTROLLER"}
BUSYBOX = (
    "docker.io/library/busybox@sha256:"
    "2919d0172f7524b2d8df9e50066a682669e6d170ac0f6a49676d54358fe970b5"
)


def writer(log: Path, pids: Path, tag: str) -> str:
    """Shell that starts a background writer (SIGTERM ignored) appending ``tag`` to ``log``
    every 0.1 s, and a ``sleep 300``; both pids go to ``pids``."""
    return (
        f"( trap '' TERM; while :; do echo {tag} >> {log}; sleep 0.1; done ) & "
        f"echo $! >> {pids}; sleep 300 & echo $! >> {pids}; "
        f'until grep -q "^{tag}$" {log}; do sleep 0.02; done'
    )


def alive(pids: Path) -> list[int]:
    return [int(p) for p in pids.read_text().split() if pid_alive(int(p))]


@pytest.fixture
def marks(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The writers' file and the pid file; a failing test leaves none of its children."""
    log, pids = tmp_path / "writes", tmp_path / "pids"
    yield log, pids
    for pid in alive(pids) if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- the wrapper and the executor's end of a shard, without a run -----------------------------


def start(
    tmp_path: Path, command: str, exit_file: Path | None = None, tree_cgroup: Path | None = None
) -> Any:
    """One shard under the real wrapper, as the executor starts it; its ShardProcess."""
    from npa.backends.local.executor import ShardProcess, spawn_shard
    from npa.core.procs import ProcessIdentity

    death_r, death_w = os.pipe()
    exit_file = exit_file or tmp_path / "s0.exit"
    with open(tmp_path / "shard.log", "ab") as log:
        popen = spawn_shard(["/bin/sh", "-c", command], cwd=tmp_path, env=dict(os.environ),
                            log=log, exit_file=exit_file, death_fd=death_r,
                            tree_cgroup=tree_cgroup)  # fmt: skip
    os.close(death_r)
    proc = ShardProcess("test shard", popen, ProcessIdentity.of(popen.pid), exit_file,
                        cgroup=tree_cgroup)  # fmt: skip
    proc.death_w = death_w  # type: ignore[attr-defined]  # closed by the test: the executor is gone
    return proc


def wait_ended(proc: Any) -> None:
    wait_until(proc.ended, "the shard's wrapper exited")


@pytest.mark.parametrize("code", [0, 3])
def test_a_wrapper_whose_command_ends_kills_what_the_command_left_running(
    tmp_path: Path, marks: tuple[Path, Path], code: int
) -> None:
    from npa.core.procs import group_members

    log, pids = marks
    proc = start(tmp_path, f"{writer(log, pids, 'w')}; exit {code}")
    wait_ended(proc)
    # The wrapper recorded the command's status, then killed its own group: once the kernel has
    # delivered that SIGKILL nothing of the group is left, with no help from the executor.
    assert proc.exit_file.read_text().strip() == str(code)
    wait_until(lambda: not group_members(proc.leader), "the wrapper's group is gone", timeout=10)
    assert alive(pids) == []
    assert proc.end(30) == [] and proc.code() == code
    # The shard's log names what was killed: both children (and the writer's sleep, if any).
    line = (tmp_path / "shard.log").read_text().splitlines()[-1]
    assert line.startswith("npa: the stage's command ended; killing "), line
    for pid in pids.read_text().split():
        assert f"{pid} " in line.split("running: ", 1)[1], line
    os.close(proc.death_w)


def test_a_killed_wrapper_s_group_is_ended_and_proven_gone_by_the_executor(
    tmp_path: Path, marks: tuple[Path, Path]
) -> None:
    log, pids = marks
    proc = start(tmp_path, f"{writer(log, pids, 'w')}; exec sleep 600")
    wait_until(lambda: len(pids.read_text().split()) == 2 if pids.exists() else False,
               "the stage started its children")  # fmt: skip
    wait_until(log.exists, "the writer writes")
    os.kill(proc.popen.pid, signal.SIGKILL)
    wait_ended(proc)
    assert len(alive(pids)) == 2  # the killed wrapper ended nothing of its group
    began = time.monotonic()
    assert proc.end(30) == []
    took = time.monotonic() - began
    # end() returns only once the group is gone: checked at once, not waited for.
    assert alive(pids) == []
    assert proc.popen.returncode == -9 and proc.code() == -9  # no status was recorded
    assert not proc.exit_file.exists()
    print(f"group kill and proof of a killed wrapper's group: {took * 1000:.0f} ms")
    os.close(proc.death_w)


def test_a_wrapper_whose_status_cannot_be_recorded_leaves_its_group_to_the_executor(
    tmp_path: Path, marks: tuple[Path, Path]
) -> None:
    """No record (here its folder does not exist; on a full disk, likewise): the wrapper exits
    the way its command did, a continuing executor would run the shard again, and the executor
    ends the group."""
    log, pids = marks
    proc = start(tmp_path, f"{writer(log, pids, 'w')}; exit 4", tmp_path / "gone" / "s0.exit")
    wait_ended(proc)
    assert len(alive(pids)) == 2
    assert proc.end(30) == [] and alive(pids) == []
    assert proc.popen.returncode == 4 and proc.code() == 4
    assert "could not record the exit status" in (tmp_path / "shard.log").read_text()
    os.close(proc.death_w)


# --- whole runs --------------------------------------------------------------------------------


class Run:
    """One NPA_HOME and a one-stage workflow ``groups`` whose stage ``work`` runs ``command``
    as host processes."""

    def __init__(self, tmp_path: Path, npa_home: Path, command: str, retries: int = 0) -> None:
        self.home = npa_home
        self.env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
        folder = tmp_path / "workflow"
        folder.mkdir()
        self.spec = folder / "groups.yaml"
        self.spec.write_text(
            "apiVersion: npa/v1\nkind: Workflow\nmetadata:\n  name: groups\n"
            f"tools:\n  shell:\n    image: {BUSYBOX}\n"
            "stages:\n  - name: work\n    tool: shell\n"
            f"    command: {json.dumps(command)}\n"
            "    outputs:\n      - name: out\n        path: out.txt\n        kind: file\n"
            f"    retries: {retries}\n"
            "    resources:\n      cpus: 1\n      disk_gib: 1\n"
        )
        self.run_id = ""
        self.job_id = 0

    def npa(self, *args: str) -> CliResult:
        return run_npa(*args, env=self.env)

    def submit(self) -> None:
        r = self.npa(*WF, "prepare-run", str(self.spec), "--project", "demo")
        assert r.code == 0, r.stderr
        self.run_id = r.stdout.strip()
        r = self.npa(*WF, "submit", str(self.spec), "--project", "demo", "--run-id", self.run_id,
                     "--runtime", "process", "--json")  # fmt: skip
        assert r.code == 0, r.stdout + r.stderr
        self.job_id = r.json()["job_id"]

    @property
    def job_dir(self) -> Path:
        return self.home / "local-jobs" / str(self.job_id)

    def manifest(self) -> dict[str, Any]:
        path = self.home / "store" / "groups" / self.run_id / "npa-workflow" / "manifest.json"
        return json.loads(path.read_text())  # type: ignore[no-any-return]

    def final(self) -> dict[str, Any]:
        """The manifest as soon as it records a final state."""
        wait_until(lambda: self.manifest()["state"] in TERMINAL, "the run ends", timeout=300)
        return self.manifest()

    def supervisor_log(self) -> str:
        return (self.job_dir / "logs" / "supervisor.log").read_text()

    def wrapper(self, attempt: int) -> int:
        record = self.job_dir / "shards" / "work" / "w0" / f"a{attempt}" / "s0.pid"
        wait_until(record.exists, f"attempt {attempt}'s wrapper is recorded")
        return int(record.read_text().split()[0])


def lines_after(log: Path, marker: str) -> list[str]:
    lines = log.read_text().split()
    return lines[lines.index(marker) + 1 :]


def test_a_wave_retry_starts_only_once_the_failed_attempt_s_children_are_gone(
    tmp_path: Path, npa_home: Path, marks: tuple[Path, Path]
) -> None:
    log, pids = marks
    command = (
        f"echo start$NPA_ATTEMPT >> {log}; {writer(log, pids, 'w$NPA_ATTEMPT')}; "
        '[ "$NPA_ATTEMPT" = 1 ] && exit 1; echo done > "$NPA_OUTPUT_OUT"'
    )
    run = Run(tmp_path, npa_home, command, retries=1)
    run.submit()
    final = run.final()
    # Checked the moment the run reads SUCCEEDED: nothing either attempt started still lives.
    assert alive(pids) == [] and run_processes(run.run_id) == []
    assert final["state"] == "SUCCEEDED", final
    assert len(pids.read_text().split()) == 4  # two children per attempt
    # Attempt 1's writer never wrote once attempt 2 had started.
    after = lines_after(log, "start2")
    assert "w1" not in after, log.read_text()
    assert "w2" in after
    shard_log = (run.job_dir / "logs" / "work" / "wave-0-shard-0.log").read_text()
    assert shard_log.count("npa: the stage's command ended; killing ") == 2, shard_log
    size = log.stat().st_size
    wait_until(lambda: run.npa(*WF, "status", run.run_id, "--project", "demo").code == 0,
               "status reads the run")  # fmt: skip
    assert log.stat().st_size == size  # nothing wrote after the run ended


def test_a_shard_wrapper_killed_with_sigkill_has_its_group_ended_before_the_retry(
    tmp_path: Path, npa_home: Path, marks: tuple[Path, Path]
) -> None:
    log, pids = marks
    command = (
        f"echo start$NPA_ATTEMPT >> {log}; {writer(log, pids, 'w$NPA_ATTEMPT')}; "
        '[ "$NPA_ATTEMPT" = 1 ] && while :; do sleep 0.1; done; echo done > "$NPA_OUTPUT_OUT"'
    )
    run = Run(tmp_path, npa_home, command, retries=1)
    run.submit()
    wrapper = run.wrapper(1)
    wait_until(lambda: log.exists() and "w1" in log.read_text().split(), "attempt 1's writer")
    os.kill(wrapper, signal.SIGKILL)
    final = run.final()
    assert alive(pids) == [] and run_processes(run.run_id) == []
    assert final["state"] == "SUCCEEDED", final
    assert "w1" not in lines_after(log, "start2"), log.read_text()
    text = run.supervisor_log()
    # The executor, not the killed wrapper, ended attempt 1's group: the sh, the writer, the
    # sleep 300 and the writer's own sleep.
    ended = [line for line in text.splitlines() if "its wrapper ended with" in line]
    assert len(ended) == 1 and "shard 0" in ended[0], text
    print(ended[0].split(": ", 1)[1])


@pytest.mark.parametrize("ignores", ["a child", "the whole stage"])
def test_cancel_ends_children_that_ignore_sigterm(
    tmp_path: Path, npa_home: Path, marks: tuple[Path, Path], ignores: str
) -> None:
    log, pids = marks
    trap = "trap '' TERM; " if ignores == "the whole stage" else ""
    command = f"{trap}{writer(log, pids, 'w')}; while :; do sleep 0.1; done"
    run = Run(tmp_path, npa_home, command)
    run.submit()
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, "the stage runs")
    began = time.monotonic()
    r = run.npa(*WF, "cancel", run.run_id, "--project", "demo", "--json")
    took = time.monotonic() - began
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["outcome"] == "cancelled", r.stdout
    # cancel returns once the job is seen stopped: nothing of the stage is left.
    assert alive(pids) == [] and run_processes(run.run_id) == []
    assert run.final()["state"] == "CANCELLED"
    record = run.job_dir / "shards" / "work" / "w0" / "a1" / "s0.exit"
    if ignores == "a child":  # SIGTERM ended the stage's shell at once
        assert record.read_text().strip() == "-15"
        assert took < 10, took
    else:  # the stage (and its wrapper with it) is killed once the 10 s grace has passed
        assert not record.exists()
        assert took >= 10, took
    print(f"cancel with {ignores} ignoring SIGTERM took {took:.1f} s")


def test_a_killed_executor_ends_children_that_ignore_sigterm(
    tmp_path: Path, npa_home: Path, marks: tuple[Path, Path]
) -> None:
    from npa.backends.local.jobs import LocalJobTable
    from npa.core.paths import NpaPaths

    log, pids = marks
    run = Run(tmp_path, npa_home, f"{writer(log, pids, 'w')}; while :; do sleep 0.1; done")
    run.submit()
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, "the stage runs")
    holder = LocalJobTable(NpaPaths(npa_home)).executor_holding(run.job_id)
    assert holder is not None
    os.kill(holder.pid, signal.SIGKILL)
    wait_until(lambda: alive(pids) == [], "the stage's children die with their executor")
    wait_until(lambda: run_processes(run.run_id) == [], "nothing of the run is left")


# --- a cgroup per shard ------------------------------------------------------------------------


@pytest.fixture
def shard_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A shard cgroup, as the executor makes one (see :func:`cgroup_base`); a failing test
    leaves neither its processes nor the cgroup."""
    from npa.backends.local import cgroup

    made = cgroup.create(cgroup_base(), f"test-{os.getpid()}-{tmp_path.name}")
    yield made
    cgroup.end(made, 10)
    assert not made.exists()


def escapee(folder: Path) -> str:
    """Shell that starts, through :mod:`tests.harness.leftovers`, a ``sleep`` child, one that
    ignores SIGTERM and one that calls setsid (out of the shard's process group) and ignores
    SIGTERM, and waits until they are recorded."""
    return leftovers.command(folder, "s", setsid=True)


@pytest.mark.parametrize("ending", ["the command exits", "the wrapper is killed",
                                    "the executor dies"])  # fmt: skip
def test_a_shard_s_cgroup_ends_what_left_its_group_with_setsid(
    tmp_path: Path, shard_cgroup: Path, ending: str
) -> None:
    folder = tmp_path / "left"
    folder.mkdir()
    proc = None
    try:
        tail = "exit 0" if ending == "the command exits" else "exec sleep 600"
        proc = start(tmp_path, f"{escapee(folder)}; {tail}", tree_cgroup=shard_cgroup)
        wait_until(lambda: leftovers.starts(folder, "s") != [], "the children are recorded")
        started = leftovers.identities_in(leftovers.starts(folder, "s")[0])
        assert len(started) == 3
        setsid_pid = started[2][0]
        assert os.getpgid(setsid_pid) == setsid_pid  # it left the shard's group...
        if ending != "the command exits":
            assert setsid_pid in cgroup_members(shard_cgroup)  # ...not the shard's cgroup
        if ending == "the wrapper is killed":
            os.kill(proc.popen.pid, signal.SIGKILL)
        elif ending == "the executor dies":
            os.close(proc.death_w)
        wait_ended(proc)
        if ending != "the wrapper is killed":
            # The wrapper ended the cgroup itself, before it exited: nothing is left, and the
            # cgroup is gone, without the executor's help.
            assert leftovers.recorded_alive(folder) == []
            assert not shard_cgroup.exists()
        assert proc.end(30) == []
        # end() returns once the cgroup is empty and removed: checked at once.
        assert leftovers.recorded_alive(folder) == [] and not shard_cgroup.exists()
    finally:
        leftovers.kill_recorded(folder)
        if proc is not None and ending != "the executor dies":
            os.close(proc.death_w)


def cgroup_members(path: Path) -> list[int]:
    from npa.backends.local import cgroup

    return cgroup.members(path)


@pytest.mark.parametrize("kill_file", [True, False], ids=["cgroup.kill", "sigkill-each"])
def test_ending_a_cgroup_kills_all_in_it_and_removes_it(
    tmp_path: Path, shard_cgroup: Path, kill_file: bool
) -> None:
    """Both ways of killing (``cgroup.kill``, and SIGKILL to each pid as on a kernel without
    it) end processes that ignore SIGTERM and left their group, and the cgroup is removed."""
    from npa.backends.local import cgroup

    folder = tmp_path / "left"
    folder.mkdir()
    shell = subprocess.Popen(["/bin/sh", "-c", f"echo $$ > {shard_cgroup}/cgroup.procs && "
                              f"{escapee(folder)} && exec sleep 600"])  # fmt: skip
    try:
        wait_until(lambda: leftovers.starts(folder, "s") != [], "the children are recorded")
        recorded = leftovers.identities_in(leftovers.starts(folder, "s")[0])
        assert {shell.pid, *(pid for pid, _ in recorded)} <= set(cgroup.members(shard_cgroup))
        began = time.monotonic()
        assert cgroup.end(shard_cgroup, 10, kill_file=kill_file) == []
        took = time.monotonic() - began
        assert not shard_cgroup.exists() and leftovers.recorded_alive(folder) == []
        shell.wait(10)
        print(f"ending a cgroup ({'cgroup.kill' if kill_file else 'SIGKILL each'}): "
              f"{took * 1000:.0f} ms")  # fmt: skip
    finally:
        leftovers.kill_recorded(folder)
        shell.kill()
        shell.wait()


@pytest.mark.parametrize("cgroups", ["on", "off"])
def test_a_wave_retry_starts_only_once_a_setsid_child_of_the_failed_attempt_is_gone(
    tmp_path: Path, npa_home: Path, cgroups: str
) -> None:
    """With a cgroup per shard, attempt 2 finds nothing of attempt 1 alive, also the child that
    left the group with setsid; with process groups only (``NPA_LOCAL_CGROUPS=0``) that child
    is still alive when attempt 2 starts, which the same check catches. The supervisor log says
    which one ran the shards, and no cgroup of the run is left."""
    from npa.backends.local.executor import shard_trees

    if cgroups == "on":
        cgroup_base()
    folder = tmp_path / "left"
    folder.mkdir()
    command = (
        f"{leftovers.command(folder, 'work', setsid=True)}; "
        '[ "$NPA_ATTEMPT" = 1 ] && exit 1; echo done > "$NPA_OUTPUT_OUT"'
    )
    run = Run(tmp_path, npa_home, command, retries=1)
    if cgroups == "off":
        run.env["NPA_LOCAL_CGROUPS"] = "0"
    try:
        run.submit()
        final = run.final()
        assert final["state"] == "SUCCEEDED", final
        assert len(leftovers.starts(folder, "work")) == 2
        text = run.supervisor_log()
        trees = [tree for _, tree in shard_trees(run.job_dir)]
        assert len(trees) == 2
        if cgroups == "on":
            assert leftovers.violations(folder) == []
            assert leftovers.recorded_alive(folder) == []  # checked the moment it read final
            assert "shards run in cgroups of their own under " in text, text
            assert all(t.cgroup is not None and not t.cgroup.exists() for t in trees), trees
        else:
            caught = leftovers.violations(folder)
            assert len(caught) == 1 and "of start 1 is alive" in caught[0], caught
            assert "shards run in process groups (NPA_LOCAL_CGROUPS=0)" in text, text
            assert all(t.cgroup is None for t in trees), trees
    finally:
        leftovers.kill_recorded(folder)


def cgroup_base() -> Path:
    """Where this process may make shard cgroups. A machine without a writable cgroup v2 skips
    the test on a developer's machine (the backend falls back to process groups there, which
    the ``off`` cases cover), and fails it under CI=true: CI runs as root on a machine that has
    one, so a skip there would hide a broken cgroup path."""
    from npa.backends.local import cgroup

    base, how = cgroup.place(f"test-{os.getpid()}")
    if base is None:
        if in_ci():
            pytest.fail(f"no shard cgroups under CI: {how}", pytrace=False)
        pytest.skip(how)
    return base


@pytest.mark.parametrize("ending", ["cancel", "a killed executor"])
def test_a_setsid_child_that_ignores_sigterm_ends_with_its_run(
    tmp_path: Path, npa_home: Path, ending: str
) -> None:
    """With a cgroup per shard, cancel and the executor's death end also the stage's child that
    left its group with setsid and ignores SIGTERM, and remove the shard's cgroup."""
    from npa.backends.local.executor import shard_trees
    from npa.backends.local.jobs import LocalJobTable
    from npa.core.paths import NpaPaths

    cgroup_base()
    folder = tmp_path / "left"
    folder.mkdir()
    run = Run(tmp_path, npa_home, f"{leftovers.command(folder, 'work', setsid=True)}; "
                                  "while :; do sleep 0.1; done")  # fmt: skip
    try:
        run.submit()
        wait_until(lambda: leftovers.starts(folder, "work") != [], "the stage left its children")
        assert len(leftovers.recorded_alive(folder)) == 3
        if ending == "cancel":
            r = run.npa(*WF, "cancel", run.run_id, "--project", "demo", "--json")
            assert r.code == 0 and r.json()["outcome"] == "cancelled", r.stdout + r.stderr
            # cancel returns once the job is seen stopped: checked at once.
            assert leftovers.recorded_alive(folder) == []
        else:
            holder = LocalJobTable(NpaPaths(npa_home)).executor_holding(run.job_id)
            assert holder is not None
            os.kill(holder.pid, signal.SIGKILL)
            wait_until(lambda: leftovers.recorded_alive(folder) == [],
                       "the stage's children die with their executor")  # fmt: skip
        trees = [tree for _, tree in shard_trees(run.job_dir)]
        assert len(trees) == 1 and trees[0].cgroup is not None
        wait_until(lambda: not trees[0].cgroup.exists(), "the shard's cgroup is removed")  # type: ignore[union-attr]
    finally:
        leftovers.kill_recorded(folder)
