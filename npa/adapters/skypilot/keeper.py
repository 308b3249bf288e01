"""The local SkyPilot API server that ``submit`` starts, kept so that it leaves nothing behind.

SkyPilot's SDK starts a local API server on its own when none answers. That server runs its
requests in worker processes which ignore SIGTERM while idle (by design: a stray SIGTERM must
not break the pool), so a server stopped with SIGTERM, or one whose main process dies, leaves
them running for good.

npa never lets the SDK start a server implicitly (it sets SkyPilot's own
``SKYPILOT_DISABLE_LOCAL_API_SERVER`` around its calls). Only ``submit`` starts one, through the
keeper: ``python -m npa.adapters.skypilot.keeper``, a small detached process that has SkyPilot
start its server as the keeper's child, becomes the subreaper of everything under it, and waits.
When the server ends, however it ends (``sky api stop``, SIGTERM, a crash), the keeper SIGKILLs
whatever the server left (its process group and every orphan reparented to the keeper), then
exits. A SIGTERM to the keeper is passed on to the server, with the same ending.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from npa.adapters.skypilot.api import (
    NO_LOCAL_SERVER_ENV,
    ApiServerDown,
    configured_server_url,
    is_local,
    server_reachable,
)

_PR_SET_CHILD_SUBREAPER = 36
START_TIMEOUT = 180.0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _group(pgid: int) -> list[int]:
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                members.append(int(proc.name))
    return members


def _sweep(server_group: int) -> None:
    """SIGKILL what the server left (its group, and orphans now our children) until none."""
    me = os.getpid()
    for _ in range(100):
        left = [p for p in {*_group(server_group), *_children(me)} if p != me]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass


def keep() -> int:
    """Start the server (SkyPilot's own start-up) as our child and outlive it by a sweep."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    os.environ.pop(NO_LOCAL_SERVER_ENV, None)
    from sky.server import common

    common.check_server_healthy_or_start_fn()
    server = next(
        (
            pid
            for pid in _children(os.getpid())
            if b"sky.server.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ),
        None,
    )
    if server is None:  # another process started it first: it is not ours to keep
        print("a server was already running; nothing to keep", flush=True)
        return 0
    print(f"keeping the SkyPilot API server, pid {server}", flush=True)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    while True:
        try:
            os.waitpid(server, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            break
    _sweep(server)
    print(f"the server (pid {server}) ended; what it left was stopped", flush=True)
    return 0


def server_kubeconfig(placed: list[Path]) -> str:
    """``KUBECONFIG`` for a server npa starts: the kubeconfigs provisioning placed, then the
    user's own. SkyPilot's server validates a launch's contexts in its own process, with its
    own kubeconfig, so every context npa launches into must be in it."""
    own = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    entries = [str(p) for p in placed] + [e for e in own.split(os.pathsep) if e]
    return os.pathsep.join(dict.fromkeys(e for e in entries if Path(e).is_file()))


def ensure_local_server(log: Path, placed: list[Path], timeout: float = START_TIMEOUT) -> str:
    """The configured server's URL, after starting it through the keeper (with ``placed``, the
    kubeconfigs provisioning placed, in its ``KUBECONFIG``) when it is local and does not
    answer. Raises :class:`ApiServerDown` when it cannot be reached."""
    url = configured_server_url()
    if server_reachable(url):
        return url
    if not is_local(url):
        raise ApiServerDown(url)
    from npa.core.fsio import FILE_MODE, ensure_private_dir

    ensure_private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    with os.fdopen(fd, "ab") as out:
        env = {**os.environ, "KUBECONFIG": server_kubeconfig(placed)}
        if not env["KUBECONFIG"]:
            env.pop("KUBECONFIG")
        keeper = subprocess.Popen(
            [sys.executable, "-m", "npa.adapters.skypilot.keeper"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server_reachable(url):
            return url
        if keeper.poll() is not None and not server_reachable(url):
            break
        time.sleep(0.5)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else ""
    raise ApiServerDown(url, f"starting it failed; {log}: {tail}")


if __name__ == "__main__":
    raise SystemExit(keep())
