"""No fixture leaves a process or a port behind, even when the test using it fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.procs import listeners, process_start, still_running, ticks_now

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _child_argv(tmp_path: Path, test: str = "test_use_every_service_then_fail") -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "basetemp"),
        f"{ROOT / 'tests' / 'integration' / 'probe_leftovers.py'}::{test}",
    ]


def _assert_nothing_left(seen: dict[str, Any], since: int) -> None:
    """No recorded process lives and nothing of the child's listens on a recorded port.

    Processes are compared by (pid, start), never by pid: pids wrap many times in one test run.
    A port counts as left when its listener is a recorded process, or a process that started
    after the child pytest did and is not this test's own (a child's service forking before
    it died); a port that another service of this session listens on, on another address, is
    that service's, not a leftover.
    """
    recorded = {tuple(identity) for identity in seen["pids"]}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(still_running(i) for i in seen["pids"]):
        time.sleep(0.1)
    alive = [pid for pid, start in seen["pids"] if still_running([pid, start])]
    assert alive == [], f"processes left running: {alive}"

    def ours(pid: int) -> bool:
        start = process_start(pid)
        if start is None:
            return False
        return (pid, start) in recorded or (start >= since and not _descends_from_me(pid))

    def left() -> dict[int, list[int]]:
        owners = {port: [p for p in listeners(port) if ours(p)] for port in seen["ports"]}
        return {port: pids for port, pids in owners.items() if pids}

    # A killed process's listening socket can outlive its pid by a moment while the kernel
    # finishes the exit; give the ports the same bounded wait as the processes.
    while time.monotonic() < deadline and left():
        time.sleep(0.1)
    open_ports = left()
    assert open_ports == {}, f"ports still listening: {open_ports}\n{_listeners(list(open_ports))}"


def _descends_from_me(pid: int) -> bool:
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            return False
    return False


def _listeners(ports: list[int]) -> str:
    """Who listens on ``ports`` now (a different process means the port was reused)."""
    try:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return "(ss not installed)"
    return "\n".join(line for line in out.splitlines() if any(f":{p} " in line for p in ports))


def test_failed_test_still_stops_every_service(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    since = ticks_now()
    child = subprocess.run(
        _child_argv(tmp_path),
        cwd=ROOT,
        env={**os.environ, "NPA_LEFTOVER_RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # The child's only test fails on purpose (exit 1); a skip or an error would be exit 0/2+.
    assert child.returncode == 1, child.stdout + child.stderr
    assert "1 failed" in child.stdout, child.stdout
    seen = json.loads(record.read_text())
    assert len(seen["pids"]) == 3 and len(seen["ports"]) >= 5
    _assert_nothing_left(seen, since)


def test_teardown_stops_the_supervisors_a_test_started(tmp_path: Path) -> None:
    """npa's local supervisor outlives its shell by design; the npa_home fixture stops it."""
    record = tmp_path / "record.json"
    since = ticks_now()
    child = subprocess.run(
        _child_argv(tmp_path, "test_start_a_long_local_run_then_fail"),
        cwd=ROOT,
        env={**os.environ, "NPA_LEFTOVER_RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 1 and "1 failed" in child.stdout, child.stdout + child.stderr
    seen = json.loads(record.read_text())
    assert len(seen["pids"]) >= 2  # the supervisor and the stage's process
    _assert_nothing_left(seen, since)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_test_run_still_stops_every_service(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM tears fixtures down; SIGKILL (no teardown at all) is caught by parent-death."""
    record = tmp_path / "record.json"
    since = ticks_now()
    child = subprocess.Popen(
        _child_argv(tmp_path),
        cwd=ROOT,
        env={**os.environ, "NPA_LEFTOVER_RECORD": str(record), "NPA_LEFTOVER_MODE": "hang"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while not record.exists() and time.monotonic() < deadline:
            assert child.poll() is None, "the child pytest ended before using its services"
            time.sleep(0.2)
        seen = json.loads(record.read_text())
        assert len(seen["pids"]) == 3 and len(seen["ports"]) >= 5
        child.send_signal(sig)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    _assert_nothing_left(seen, since)


def _assert_host_restored(seen: dict[str, dict[str, str]], ip_forward_before: str) -> None:
    """Everything the cluster changed outside its processes is undone."""
    from tests.harness.cluster_host import CGROUP_FS, SHARED, _live_members, mounts_under

    host = seen["cluster"]
    assert subprocess.run(["ip", "link", "show", host["bridge"]], capture_output=True).returncode
    nat = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True
    ).stdout
    assert host["chain"] not in nat, nat
    assert f'"{host["network"]}"' not in nat, nat
    assert mounts_under(Path(host["workdir"])) == []
    assert not (SHARED / host["id"]).exists()  # its sockets and the kubelet's state
    left = [h.name for h in CGROUP_FS.iterdir() if (h / host["cgroup_root"].lstrip("/")).exists()]
    assert left == [], f"cgroups left in {left}"
    results = Path("/var/lib/cni/results")
    assert not results.is_dir() or not list(results.glob(f"{host['network']}-*"))
    # ip_forward is shared with any other test cluster still running on this machine.
    if SHARED.is_dir():
        import fcntl

        with open(SHARED / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            others = _live_members(SHARED)
    else:
        others = []
    if not others:
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == ip_forward_before


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["fail", "sigkill"])
def test_the_cluster_leaves_nothing_on_the_host(tmp_path: Path, mode: str) -> None:
    """A failing test, or a test run killed with no teardown at all (its guardian then undoes
    the host changes), leaves no process, port, mount, network, rule or cgroup behind."""
    record = tmp_path / "record.json"
    since = ticks_now()
    ip_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    env = {**os.environ, "NPA_LEFTOVER_RECORD": str(record)}
    argv = _child_argv(tmp_path, "test_run_a_pod_on_the_cluster_then_fail")
    if mode == "fail":
        child = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=600, check=False)  # fmt: skip
        assert child.returncode == 1 and "1 failed" in child.stdout, child.stdout + child.stderr
    else:
        proc = subprocess.Popen(argv, cwd=ROOT, env={**env, "NPA_LEFTOVER_MODE": "hang"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 600
            while not record.exists() and time.monotonic() < deadline:
                assert proc.poll() is None, "the child pytest ended before using the cluster"
                time.sleep(0.5)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seen = json.loads(record.read_text())
    assert len(seen["pids"]) >= 8  # control plane, node, netcheck, a shim, the pod's processes
    # Undoing is the guardian's work after a SIGKILL: give it the same bounded wait.
    deadline = time.monotonic() + 60
    undone = Path(seen["cluster"]["workdir"]) / "undone.json"
    while not undone.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert undone.exists(), "the cluster's guardian never undid the host changes"
    _assert_nothing_left(seen, since)
    _assert_host_restored(seen, ip_forward)
