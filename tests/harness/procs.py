"""Start and stop the real services the tests use, leaving nothing behind.

Every service process runs in its own process group, logs to a file the test can show on
failure, and is registered so teardown can stop it (SIGTERM, then SIGKILL) even when a test or a
start-up fails half-way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# Every process the harness started and has not yet reaped; a session-end check reads it.
LIVE: dict[int, ManagedProcess] = {}


_PR_SET_PDEATHSIG = 1


def _detach_and_die_with_parent() -> None:
    """Run in the child before exec: own process group, and SIGKILL when the test run dies.

    The process group lets teardown stop a service and its children together; the parent-death
    signal stops it even when pytest itself is killed and no teardown runs.
    """
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return process_start(pid) is not None


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (None once it is gone or a zombie).

    A pid alone names a process only while it lives: the kernel hands it out again (here pids
    wrap at 32768, many times in one test run), so a leftover check compares (pid, start).
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def ticks_now() -> int:
    """Now, in the clock ticks of :func:`process_start`."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def identities(pids: Sequence[int]) -> list[list[int]]:
    """[pid, start] of each live pid: what a later leftover check compares."""
    return [[pid, start] for pid in pids if (start := process_start(pid)) is not None]


def still_running(identity: Sequence[int]) -> bool:
    """True while the very process of ``identity`` ([pid, start]) lives, not a pid's reuse."""
    pid, start = identity
    return process_start(pid) == start


def listeners(port: int) -> list[int]:
    """The pids of every process with a listening TCP socket on ``port``, any address."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{cols[9]}]")
    owners: list[int] = []
    if not inodes:
        return owners
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                owners.append(int(entry.name))
    return owners


def run_processes(run_id: str) -> list[int]:
    """The live processes of one npa run (found by the NPA_RUN_ID their environment carries):
    what must be gone once the run is stopped."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if f"NPA_RUN_ID={run_id}".encode() in environ and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for an event; the timeout only bounds a test that would otherwise hang."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@dataclass
class ManagedProcess:
    """One service process and the log it writes."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    ports: list[int] = field(default_factory=list)
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            list(self.argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            preexec_fn=_detach_and_die_with_parent,
        )
        LIVE[self.popen.pid] = self
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_running(self) -> None:
        assert self.popen is not None
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(
                f"{self.name} exited with code {code} during start-up:\n{self.log_tail()}"
            )

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it is true; fail with the service log if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_running()
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not {what} after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.popen is not None:
            pid = self.popen.pid
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
                try:
                    self.popen.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    self.popen.wait(timeout=grace)
            # Children that outlived the leader still belong to the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            LIVE.pop(pid, None)
        if self._log is not None:
            self._log.close()
            self._log = None


@contextlib.contextmanager
def running(proc: ManagedProcess) -> Iterator[ManagedProcess]:
    """Start ``proc`` and stop it when the block ends, however it ends."""
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def http_status(url: str, *, timeout: float = 2.0, context: object | None = None) -> int:
    """The HTTP status of a GET to ``url`` (error statuses included)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # type: ignore[arg-type]
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def stop_lock_holders(root: Path, patterns: Sequence[str]) -> list[int]:
    """Stop (SIGTERM, then SIGKILL) whoever holds the flock of a file under ``root``.

    npa's detached supervisors hold such a lock (with their pid written in it) for their whole
    life and are meant to outlive the shell that started them; a test's teardown uses this to
    stop the ones its commands started. A lock nobody holds is left alone, so a stale pid in
    it is never killed.
    """
    import fcntl

    holders = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    continue  # nobody holds it
                except OSError:
                    pass
                # The holder's pid comes first (an executor adds its start time after it).
                text = os.pread(fd, 64, 0).decode(errors="replace").split()[:1]
            finally:
                os.close(fd)
            if text and text[0].isdigit() and pid_alive(int(text[0])):
                holders.append(int(text[0]))
    # SIGTERM first: a local supervisor then stops the stage processes it started.
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in holders:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(pid_alive(p) for p in holders):
            time.sleep(0.05)
    return holders


def marked_processes(name: str, value: str) -> dict[int, str]:
    """pid -> command of the live processes (this one excluded) whose environment holds
    ``name=value``."""
    wanted = f"{name}={value}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip()
                found[int(proc.name)] = command.decode(errors="replace")[:120]
        except OSError:  # gone, or a zombie
            continue
    return found


def stop_marked(name: str, env: Mapping[str, str], grace: float = 15.0) -> list[tuple[int, str]]:
    """The processes still marked with ``env[name]`` once ``grace`` seconds have let those
    already stopping finish; each is SIGKILLed, so a failing run leaves the machine clean."""
    value = env.get(name)
    if not value:
        return []
    deadline = time.monotonic() + grace
    left = marked_processes(name, value)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked_processes(name, value)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return sorted(left.items())
