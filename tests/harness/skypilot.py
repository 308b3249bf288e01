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

from tests.harness.procs import free_port

SKY = Path(sys.executable).with_name("sky")


def _start(home: Path) -> tuple[dict[str, str], str]:
    env = {**os.environ, "HOME": str(home), "SKYPILOT_API_SERVER_LOCAL_PORT": str(free_port())}
    env.pop("SKYPILOT_API_SERVER_ENDPOINT", None)
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
    log = home / ".sky" / "api_server" / "server.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
    return env, f"{started.stdout}{started.stderr}\nserver.log:\n{tail}"


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
    else:
        raise RuntimeError("sky api start failed twice:\n" + "\n----\n".join(failures))
    try:
        yield {
            "HOME": env["HOME"],
            "SKYPILOT_API_SERVER_LOCAL_PORT": env["SKYPILOT_API_SERVER_LOCAL_PORT"],
        }
    finally:
        subprocess.run(
            [str(SKY), "api", "stop"], env=env, capture_output=True, timeout=120, check=False
        )
