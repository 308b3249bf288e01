"""Test configuration: the real-service harness and a check that it left nothing running."""

from __future__ import annotations

import pytest

from tests.harness.fixtures import (  # noqa: F401 - fixtures are used by name
    kube,
    kube_server,
    npa_home,
    pulumi_backend,
    registry,
    registry_server,
    s3,
    s3_server,
)
from tests.harness.procs import LIVE, pid_alive


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = [f"{p.name} (pid {pid})" for pid, p in LIVE.items() if pid_alive(pid)]
    if leftovers:
        session.config.get_terminal_writer().line(
            "harness left processes running: " + ", ".join(leftovers), red=True
        )
        session.exitstatus = 1
