"""The host changes a test cluster makes, recorded as they happen and undone from the record.

A cluster changes the host outside its work directory: a bridge, iptables rules, cgroups, a
sysctl, mounts, and the containerd shims and container processes that outlive the process that
started them. Each change is written to ``host.json`` in the cluster's work directory before it
is made, so :func:`undo` can reverse exactly what was done, from any process, even after the
test run that made it was killed.

A guardian process (``python -m tests.harness.cluster_host WORKDIR``) is started before the
first change, in a session of its own so that nothing which stops the test run stops it too.
It waits for its stdin to close, which happens when the fixture finishes *or* when the test run
dies, and then runs :func:`undo`. Teardown therefore has one path for a passing run, a failing
one, SIGTERM and SIGKILL.

Several clusters may run on one machine at once (two test sessions): every name, subnet,
chain and cgroup carries the cluster's own id, and what the clusters share (the ip_forward
sysctl, host directories the kubelet and containerd insist on) is restored by the last one to
leave, under a machine-wide lock in ``/run/npa-test-clusters``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

SHARED = Path("/run/npa-test-clusters")
CGROUP_FS = Path("/sys/fs/cgroup")
# Host paths the kubelet, containerd and the CNI library create outside any configurable root.
SHARED_HOST_PATHS = (
    "/var/lib/cni",
    "/var/log/containers",
    "/var/lib/kubelet",
    "/run/containerd",
)
RECORD = "host.json"
UNDONE = "undone.json"


@dataclass
class HostRecord:
    """What one cluster changed on the host; written before each change is made."""

    cluster_id: str
    workdir: str
    bridge: str
    subnet: str
    gateway: str
    network: str  # the CNI network name
    chain: str  # the cluster's own iptables nat chain
    cgroup_root: str  # e.g. /npa-ab12cd, in every cgroup v1 hierarchy
    containerd_socket: str
    # (pid, start time in clock ticks) of every process the harness started for the cluster
    processes: list[tuple[int, int]] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)  # the changes made so far

    def save(self) -> None:
        path = Path(self.workdir) / RECORD
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    def did(self, step: str) -> None:
        """Record that ``step`` is about to be made (undo tolerates a step that never was)."""
        if step not in self.steps:
            self.steps.append(step)
        self.save()

    def started(self, pid: int) -> None:
        self.processes.append((pid, start_time(pid) or 0))
        self.save()

    @classmethod
    def load(cls, workdir: Path) -> HostRecord:
        data = json.loads((workdir / RECORD).read_text())
        data["processes"] = [tuple(p) for p in data.get("processes", [])]
        return cls(**data)


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None when it is gone): a pid with a
    different start time is another process that reused the number."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def run(*argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


# --- what several clusters share ------------------------------------------------------------


@contextlib.contextmanager
def shared_lock() -> Iterator[Path]:
    """The machine-wide lock under which clusters join and leave."""
    SHARED.mkdir(mode=0o700, exist_ok=True)
    with open(SHARED / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield SHARED


def _live_members(shared: Path, but: str | None = None) -> list[str]:
    """Ids of clusters whose member lock is held (their guardian is alive)."""
    live = []
    for lock in shared.glob("member.*.lock"):
        member = lock.name.split(".")[1]
        if member == but:
            continue
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                live.append(member)
                continue
        lock.unlink(missing_ok=True)  # its guardian is gone: a stale membership
    return live


def join(cluster_id: str) -> int:
    """Register a cluster; the first one records what the host looked like. Returns the fd of
    the member lock, which the guardian holds for the cluster's life."""
    with shared_lock() as shared:
        if not _live_members(shared):
            before = {
                "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
                "absent": [p for p in SHARED_HOST_PATHS if not os.path.lexists(p)],
            }
            (shared / "before.json").write_text(json.dumps(before))
        fd = os.open(shared / f"member.{cluster_id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd


def leave(cluster_id: str) -> list[str]:
    """Unregister; the last cluster to leave restores what they shared. Returns what it did."""
    done: list[str] = []
    with shared_lock() as shared:
        (shared / f"member.{cluster_id}.lock").unlink(missing_ok=True)
        if _live_members(shared, but=cluster_id):
            return done
        before_file = shared / "before.json"
        if not before_file.exists():
            return done
        before = json.loads(before_file.read_text())
        Path("/proc/sys/net/ipv4/ip_forward").write_text(before["ip_forward"] + "\n")
        done.append(f"ip_forward restored to {before['ip_forward']}")
        for path in before["absent"]:
            if os.path.lexists(path):
                _unmount_under(Path(path))
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"removed {path}")
        before_file.unlink()
    return done


# --- undoing one cluster ----------------------------------------------------------------------


def _kill_recorded(record: HostRecord) -> list[int]:
    killed = []
    for pid, started in record.processes:
        if started and start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def _shims(socket: str) -> list[int]:
    """containerd shims serving the cluster's containerds (they detach from them and outlive
    them): every node's socket lies in the folder of the first node's."""
    folder = str(Path(socket).parent).encode() + b"/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"containerd-shim-runc-v2")
            and any(arg.startswith(folder) for arg in argv)
        ):
            found.append(int(proc.name))
    return found


def cgroup_dirs(root: str) -> list[Path]:
    """The cluster's cgroup directory in every hierarchy that has it."""
    rel = root.lstrip("/")
    return [h / rel for h in sorted(CGROUP_FS.iterdir()) if (h / rel).is_dir()]


def _cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs(root):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def _kill_cgroup(root: str, timeout: float = 10.0) -> int:
    """SIGKILL every process in the cluster's cgroups (the containers) until none is left."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _cgroup_pids(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.1)
    return len(killed)


def _remove_cgroups(root: str) -> None:
    for top in cgroup_dirs(root):
        # Deepest first: a cgroup can be removed only once its children are.
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        for _ in range(50):
            try:
                top.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)  # the last task is still leaving


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    prefix = str(path).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == str(path) or point.startswith(prefix):
                points.append(point)
    return sorted(set(points), key=lambda p: -len(p))


def _unmount_under(path: Path) -> int:
    points = mounts_under(path)
    for point in points:
        run("umount", "-l", point)
    return len(points)


def postrouting_chain(record: HostRecord) -> str:
    """The cluster's own nat chain that POSTROUTING jumps to (traffic between pods left
    unmasqueraded); :attr:`HostRecord.chain` is the one PREROUTING jumps to."""
    return f"{record.chain}-P"


def _nat_rules() -> list[str]:
    return run("iptables", "-w", "-t", "nat", "-S").stdout.splitlines()


def _remove_iptables(record: HostRecord) -> list[str]:
    """Our own chain and its jump, and the per-container masquerade chains the CNI bridge
    plugin made for our network (their jumps carry the network name in a comment)."""
    done = []
    marker = f'name: \\"{record.network}\\"'
    chains = set()
    for rule in _nat_rules():
        if not rule.startswith("-A "):
            continue
        target = re.search(r" -j (\S+)", rule)
        jumps = (f"-j {record.chain}", f"-j {postrouting_chain(record)}")
        jumped = any(rule.endswith(jump) or f"{jump} " in rule for jump in jumps)
        ours = jumped or marker in rule or f'name: "{record.network}"' in rule
        if ours:
            args = ["iptables", "-w", "-t", "nat", "-D", *_split_rule(rule[3:])]
            if run(*args).returncode == 0:
                done.append(f"deleted nat rule: {rule}")
            if target and target.group(1).startswith("CNI-"):
                chains.add(target.group(1))
    chains.update((record.chain, postrouting_chain(record)))
    existing = {r.split()[1] for r in _nat_rules() if r.startswith("-N ")}
    for chain in sorted(chains & existing):
        run("iptables", "-w", "-t", "nat", "-F", chain)
        if run("iptables", "-w", "-t", "nat", "-X", chain).returncode == 0:
            done.append(f"deleted nat chain {chain}")
    return done


def _split_rule(text: str) -> list[str]:
    import shlex

    return shlex.split(text)


def undo(workdir: Path, held: HostRecord | None = None) -> dict[str, object]:
    """Reverse every host change the cluster in ``workdir`` recorded. Idempotent. ``held`` is
    the record as the guardian read it at its start, for a work directory that is gone by the
    end (another pytest session's cleanup of numbered tmp folders can remove it once the
    session that made it has exited): its names (bridge, chains, cgroup root, socket folder)
    are all the undo needs; the processes die with the test run that started them."""
    try:
        record = HostRecord.load(workdir)
    except FileNotFoundError:
        if held is None:
            raise
        record = held
    report: dict[str, object] = {"cluster": record.cluster_id}
    report["killed_processes"] = _kill_recorded(record)
    shims = _shims(record.containerd_socket)
    for pid in shims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    report["killed_shims"] = shims
    report["killed_in_cgroups"] = _kill_cgroup(record.cgroup_root)
    rundir = Path(record.containerd_socket).parent  # the cluster's short folder of sockets
    report["unmounted"] = _unmount_under(rundir) + _unmount_under(Path(record.workdir))
    report["iptables"] = _remove_iptables(record)
    if run("ip", "link", "show", record.bridge).returncode == 0:
        run("ip", "link", "del", record.bridge)
        report["bridge"] = f"deleted {record.bridge}"
    results = Path("/var/lib/cni/results")
    if results.is_dir():
        for cached in results.glob(f"{record.network}-*"):
            cached.unlink(missing_ok=True)
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(record.workdir):
                    link.unlink()
    _remove_cgroups(record.cgroup_root)
    shutil.rmtree(rundir, ignore_errors=True)
    report["shared"] = leave(record.cluster_id)
    with contextlib.suppress(FileNotFoundError):
        (workdir / UNDONE).write_text(json.dumps(report, indent=1))
    return report


def guard(workdir: Path) -> int:
    """The guardian: hold the cluster's membership, wait for stdin to close, undo."""
    record = HostRecord.load(workdir)
    fd = join(record.cluster_id)
    sys.stdout.write("joined\n")
    sys.stdout.flush()
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os.close(fd)  # release the membership before leave() looks at the others
        undo(workdir, held=record)
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through guard(), which undoes on the way out


if __name__ == "__main__":
    # Ctrl-C in the terminal reaches the whole foreground group; the test run's own teardown
    # then closes our stdin, so the guardian ignores the interrupt itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    raise SystemExit(guard(Path(sys.argv[1])))
