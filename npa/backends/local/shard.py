"""``python shard.py DEATH_FD EXIT_FILE [--on-death JSON] [--cgroup DIR] -- ARGV...``: run one
shard so it dies with its executor.

The executor starts this wrapper (by its file path, with ``-I -S``: it imports nothing but the
standard library, so it starts in milliseconds) as the leader of a new process group, and the
wrapper runs ARGV as a child in that group. ``DEATH_FD`` is the read end of a pipe whose only
write end the executor holds and never writes: the read returns end-of-file exactly when the
executor is gone, however it died (SIGKILL included), and the wrapper then runs the
``--on-death`` command (a JSON list: for a shard in a container, removing that container, which
the engine's killed client would leave running) and kills its whole group, itself with it. No
orphan stage process outlives its executor, on any system with pipes.

When the child ends, the wrapper records its exit status in EXIT_FILE (written to a temporary
file and renamed, so a reader sees all of it or nothing), then kills its whole group, itself
with it: whatever the command left running in the background ends with it, as Kubernetes kills
a container's remaining processes when its main process ends (a line in the shard's log names
them). The executor takes the shard's exit status from EXIT_FILE, and counts the shard as ended
only once it has seen the group gone; an executor that continues the job after its predecessor
died reads these files to know which shards already ran to the end. When the status cannot be
recorded (a full disk) the wrapper exits the way the child did and leaves the group to the
executor. SIGTERM (a cancel, sent to the whole group) reaches the child; the wrapper itself
waits for the child to end.

With ``--cgroup DIR`` (a cgroup the executor made for this shard: ``cgroup.py``) the wrapper
first moves itself into DIR, so everything the command starts is in it, also a process that
leaves the group with ``setsid``. Wherever the wrapper ends its group it first moves itself
back out and ends the cgroup (kills all in it, waits until it is empty, removes it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from types import ModuleType

# The shard's cgroup and the module that handles it (loaded by path: this wrapper imports
# nothing of npa), when the executor gave one.
CGROUP: str | None = None
_cgroups: ModuleType | None = None


def _load_cgroups() -> ModuleType:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgroup.py")
    spec = importlib.util.spec_from_file_location("npa_shard_cgroup", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _watch_executor(fd: int, on_death: list[str]) -> None:
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    if on_death:
        try:
            subprocess.run(on_death, stdin=subprocess.DEVNULL, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            sys.stderr.write(f"npa: {on_death[0]} could not clean up after the executor: {exc}\n")
    _end_cgroup()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _record(path: str, code: int) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as out:
        out.write(f"{code}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _end_cgroup() -> None:
    """End the shard's cgroup, if it has one: out of it first (a cgroup is removed only once
    empty), then :func:`cgroup.end`; what outlives 5 s is left to the executor."""
    if CGROUP is None or _cgroups is None:
        return
    try:
        _cgroups.leave(_cgroups.Path(CGROUP))
        left = _cgroups.end(_cgroups.Path(CGROUP), 5.0)
    except OSError as exc:
        sys.stderr.write(f"npa: could not end the shard's cgroup {CGROUP}: {exc}\n")
        return
    if left:
        sys.stderr.write(f"npa: still alive in {CGROUP} after SIGKILL: {left}\n")


def _others_in_group() -> list[str]:
    """``pid command`` of every other live process of this wrapper's group or cgroup."""
    me, group = os.getpid(), os.getpgrp()
    found: list[str] = []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    ours = set(_cgroups.members(_cgroups.Path(CGROUP))) if CGROUP and _cgroups else set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[-1].split()
            theirs = int(fields[2]) != group and pid not in ours
            if pid == me or fields[0] in ("Z", "X") or theirs:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
        found.append(f"{pid} {command[:80]}")
    return found


def _end_group() -> None:
    """Kill this wrapper's whole group and cgroup, itself with it (only when it leads the
    group)."""
    if os.getpgrp() != os.getpid():
        return
    others = _others_in_group()
    if others:
        sys.stderr.write(
            f"npa: the stage's command ended; killing {len(others)} process(es) it left "
            f"running: {'; '.join(others)}\n"
        )
        sys.stderr.flush()
    _end_cgroup()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    global CGROUP, _cgroups
    on_death: list[str] = []
    if len(argv) >= 4 and argv[2] == "--on-death":
        on_death = [str(word) for word in json.loads(argv[3])]
        argv = argv[:2] + argv[4:]
    if len(argv) >= 4 and argv[2] == "--cgroup":
        CGROUP = argv[3]
        argv = argv[:2] + argv[4:]
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write(
            "usage: shard.py DEATH_FD EXIT_FILE [--on-death JSON] [--cgroup DIR] -- ARGV...\n"
        )
        return 2
    death_fd, exit_file, command = int(argv[0]), argv[1], argv[3:]
    if CGROUP is not None:
        _cgroups = _load_cgroups()
        try:
            _cgroups.join(_cgroups.Path(CGROUP))
        except OSError as exc:
            sys.stderr.write(
                f"npa: could not move the shard into its cgroup {CGROUP}: {exc} (to run shards "
                "in process groups only: export NPA_LOCAL_CGROUPS=0, then submit again)\n"
            )
            return 2
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    threading.Thread(target=_watch_executor, args=(death_fd, on_death), daemon=True).start()
    child = subprocess.Popen(command, close_fds=True)
    code = child.wait()
    try:
        _record(exit_file, code)
    except OSError as exc:  # a full disk: a continuing executor runs this shard again
        sys.stderr.write(f"npa: could not record the exit status in {exit_file}: {exc}\n")
    else:
        _end_group()
    if code < 0:  # die of the same signal, so the executor sees what the stage saw
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
