"""Test configuration: the real-service harness and a check that it left nothing running."""

from __future__ import annotations

import signal
from types import FrameType

import pytest

from tests.harness.fixtures import (  # noqa: F401 - fixtures are used by name
    cluster,
    kube,
    kube_server,
    npa_home,
    pulumi_backend,
    registry,
    registry_server,
    s3,
    s3_server,
    sky_cluster,
    sky_server,
)
from tests.harness.procs import LIVE, pid_alive


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout, `timeout`, kill) tears fixtures down as Ctrl-C
    # does, so the services it started are stopped rather than orphaned.
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = [f"{p.name} (pid {pid})" for pid, p in LIVE.items() if pid_alive(pid)]
    if leftovers:
        session.config.get_terminal_writer().line(
            "harness left processes running: " + ", ".join(leftovers), red=True
        )
        session.exitstatus = 1
