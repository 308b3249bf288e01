"""A shard's own cgroup (v2), where this machine lets npa make one: the container of every
process the shard starts, including those that leave its process group (``setsid``).

A process group is left by one system call; a cgroup is not (moving a process out needs write
access to the cgroups on both sides, which a stage's command has no reason to use). So where the
executor may make cgroups (a cgroup v2 hierarchy, and its own cgroup there writable: root, or a
subtree delegated to the user), each shard gets one, ``npa-local-<executor pid>-<executor
start>-<n>`` beside nothing but npa's own, and the shard's wrapper moves itself into it before
it starts the stage's command. :func:`end` is the one way a shard's cgroup ends: kill everything
in it (``cgroup.kill`` where the kernel has it, else SIGKILL to each pid until none is left),
wait until it is empty, and remove it. The kernel refuses to remove a cgroup with a live
process in it, so a removed cgroup is proof that nothing of the shard lives.

Elsewhere (no cgroup v2, a read-only or foreign hierarchy, ``NPA_LOCAL_CGROUPS=0``) shards run
in process groups only, as before. Only the standard library is used here: the shard wrapper
(``shard.py``, started with ``python -I -S``) loads this file by its path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

PREFIX = "npa-local-"
# Set to 0 to run shards in process groups only, even where cgroups are available.
SWITCH = "NPA_LOCAL_CGROUPS"


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 directory, from the mount table and /proc/self/cgroup."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    mount = None
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) > 4:
            mount, root = Path(fields[4]), fields[3]
            break
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    if mount is None or own is None:
        return None
    # In a cgroup namespace the mount's root is the namespace's; the path is relative to it.
    relative = own if root == "/" or not own.startswith(root) else own[len(root) :]
    return mount / relative.lstrip("/")


def place(tag: str) -> tuple[Path | None, str]:
    """Where this process may make shard cgroups (its own cgroup v2 directory, proven by making
    and removing ``npa-local-<tag>-probe`` there), and one line saying what shards run in."""
    if os.environ.get(SWITCH) == "0":
        return None, f"shards run in process groups ({SWITCH}=0)"
    base = _own_cgroup()
    if base is None:
        return None, "shards run in process groups (this machine has no cgroup v2 hierarchy)"
    probe = base / f"{PREFIX}{tag}-probe"
    try:
        probe.mkdir()
        # Only a non-root cgroup has cgroup.kill: the probe says whether the kernel has it.
        kill = "cgroup.kill" if (probe / "cgroup.kill").exists() else "SIGKILL to each process"
        probe.rmdir()
    except OSError as exc:
        why = exc.strerror or str(exc)
        return None, f"shards run in process groups (cannot make cgroups in {base}: {why})"
    return base, f"shards run in cgroups of their own under {base} (ended by {kill})"


def create(base: Path, name: str) -> Path:
    path = base / f"{PREFIX}{name}"
    path.mkdir()
    return path


def join(cgroup: Path, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) into ``cgroup``."""
    (cgroup / "cgroup.procs").write_text(f"{pid}\n")


def leave(cgroup: Path) -> None:
    """Move the calling process out of ``cgroup`` into its parent (so it can end it)."""
    join(cgroup.parent)


def members(cgroup: Path) -> list[int]:
    """The pids in ``cgroup`` ([] once it is gone)."""
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def signal_all(cgroup: Path, sig: int) -> None:
    for pid in members(cgroup):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _remove(cgroup: Path) -> bool:
    """Remove ``cgroup``; True once it is gone (False while the kernel says it is busy)."""
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError:  # busy (a process just leaving), or not ours to remove: the caller says
        return False
    return True


def end(cgroup: Path, wait: float, poll: float = 0.05, *, kill_file: bool = True) -> list[int]:
    """End a shard's tree: kill every process in ``cgroup``, again while any lives, until the
    cgroup is empty and removed or ``wait`` seconds have passed; the pids still in it then
    ([]: nothing is, and the cgroup is removed unless the kernel kept refusing that).
    ``kill_file=False`` sends SIGKILL to each pid as on a kernel without ``cgroup.kill``."""
    deadline = time.monotonic() + wait
    pause = 0.005
    kill = cgroup / "cgroup.kill"
    while True:
        pids = members(cgroup)
        if not pids and _remove(cgroup):
            return []
        if time.monotonic() >= deadline:
            return pids
        try:
            if not kill_file:
                raise FileNotFoundError(kill)
            kill.write_text("1\n")
        except OSError:  # a kernel before 5.14 (or the cgroup just went)
            signal_all(cgroup, signal.SIGKILL)
        time.sleep(pause)
        pause = min(pause * 2, poll)
