"""A real local SkyPilot API server (``sky api start``) on loopback, in its own HOME.

SkyPilot runs its server as a daemon of its own, so teardown stops it with ``sky api stop``;
the server gets a free port and a private HOME (its ``~/.sky``), so it never meets a user's
server or another test's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.harness.procs import free_port, port_is_open, stop_marked

SKY = Path(sys.executable).with_name("sky")


def _start(home: Path) -> tuple[dict[str, str], str]:
    port = str(api_server_port())
    env = {**os.environ, "HOME": str(home), "SKYPILOT_API_SERVER_LOCAL_PORT": port}
    env.pop("SKYPILOT_API_SERVER_ENDPOINT", None)
    try:
        started = subprocess.run(
            [str(SKY), "api", "start", "--host", "127.0.0.1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        if started.returncode == 0:
            return env, ""
        said = f"{started.stdout}{started.stderr}"
    except subprocess.TimeoutExpired:
        said = "sky api start did not return within 240 s"
    log = home / ".sky" / "api_server" / "server.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
    return env, f"{said}\nserver.log:\n{tail}"


@contextlib.contextmanager
def sky_api_server(workdir: Path) -> Iterator[dict[str, str]]:
    """Yield the environment (HOME, port) under which npa and sky reach the server."""
    failures = []
    # One retry on a fresh port and HOME absorbs a start-up that dies on a busy machine.
    for attempt in range(2):
        home = workdir / f"home-{attempt}"
        home.mkdir(parents=True)
        env, failure = _start(home)
        if not failure:
            break
        failures.append(failure)
        # `sky api start` can give up on a server that comes up later: stop what it started.
        stop_sky_processes(home, env)
    else:
        raise RuntimeError("sky api start failed twice:\n" + "\n----\n".join(failures))
    try:
        yield {
            "HOME": env["HOME"],
            "SKYPILOT_API_SERVER_LOCAL_PORT": env["SKYPILOT_API_SERVER_LOCAL_PORT"],
        }
    finally:
        stop_sky_processes(home, env)


def stop_sky_processes(home: Path, env: dict[str, str], grace: float = 20.0) -> None:
    """``sky api stop``, then SIGKILL whatever of SkyPilot's is still running with ``home``
    (the processes whose environment has that HOME: what SkyPilot started for this world)."""
    subprocess.run(
        [str(SKY), "api", "stop"],
        env={**os.environ, **env},
        capture_output=True,
        timeout=120,
        check=False,
    )
    stop_marked("HOME", {"HOME": str(home)}, grace)


def api_server_port() -> int:
    """A free port for SkyPilot's local API server whose request-queue port (which SkyPilot
    derives from it, in 50000-59999 where this machine's client sockets also live) is free too."""
    from sky.server.requests.queues import mp_queue

    for _ in range(50):
        port = free_port()
        before = os.environ.get("SKYPILOT_API_SERVER_LOCAL_PORT")
        os.environ["SKYPILOT_API_SERVER_LOCAL_PORT"] = str(port)
        try:
            queue = mp_queue.get_queue_manager_port()
        finally:
            if before is None:
                os.environ.pop("SKYPILOT_API_SERVER_LOCAL_PORT", None)
            else:
                os.environ["SKYPILOT_API_SERVER_LOCAL_PORT"] = before
        if not port_is_open(queue) and _bindable(queue):
            return port
    raise RuntimeError("no API server port whose queue port is free after 50 tries")


def _bindable(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
