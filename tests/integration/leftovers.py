"""What the no-leftovers tests share: a child pytest that uses the harness and records what it
started (``probe_leftovers.py``), and the checks that nothing of it outlived it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.harness.procs import listeners, process_start, still_running

ROOT = Path(__file__).resolve().parents[2]


def child_argv(tmp_path: Path, test: str = "test_use_every_service_then_fail") -> list[str]:
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


def assert_nothing_left(seen: dict[str, Any], since: int) -> None:
    """No recorded process lives and nothing of the child's listens on a recorded port.

    Processes are compared by (pid, start), never by pid: pids wrap many times in one test run.
    A port counts as left when its listener is a recorded process, or a process that started
    after the child pytest did and is not the suite's own (a child's service forking before it
    died); a port that another service of this session listens on (on another address, or
    started meanwhile by another xdist worker) is that service's, not a leftover.
    """
    recorded = {tuple(identity) for identity in seen["pids"]}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(still_running(i) for i in seen["pids"]):
        time.sleep(0.1)
    alive = [pid for pid, start in seen["pids"] if still_running([pid, start])]
    assert alive == [], f"processes left running: {alive}"

    suite = _suite_root()

    def ours(pid: int) -> bool:
        start = process_start(pid)
        if start is None:
            return False
        return (pid, start) in recorded or (start >= since and not _descends_from(pid, suite))

    def left() -> dict[int, list[int]]:
        owners = {port: [p for p in listeners(port) if ours(p)] for port in seen["ports"]}
        return {port: pids for port, pids in owners.items() if pids}

    # A killed process's listening socket can outlive its pid by a moment while the kernel
    # finishes the exit; give the ports the same bounded wait as the processes.
    while time.monotonic() < deadline and left():
        time.sleep(0.1)
    open_ports = left()
    assert open_ports == {}, f"ports still listening: {open_ports}\n{_listeners(list(open_ports))}"


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _suite_root() -> int:
    """The outermost pytest process above this one: this process, or the pytest-xdist
    controller whose workers run other tests beside this one."""
    root, pid = os.getpid(), _parent(os.getpid())
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            break
        if b"pytest" in argv:
            root = pid
        pid = _parent(pid)
    return root


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or below it: a process of this test suite (this test, or a
    service another worker started meanwhile), where the child's orphans hang from init."""
    while pid > 1:
        if pid == ancestor:
            return True
        pid = _parent(pid)
    return False


def _listeners(ports: list[int]) -> str:
    """Who listens on ``ports`` now (a different process means the port was reused)."""
    try:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return "(ss not installed)"
    return "\n".join(line for line in out.splitlines() if any(f":{p} " in line for p in ports))


def assert_host_restored(seen: dict[str, dict[str, str]], ip_forward_before: str) -> None:
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
