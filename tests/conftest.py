"""Test configuration: the real-service harness and a check that it left nothing running."""

from __future__ import annotations

import os
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


# Cluster tests that are not yet reliable (or too slow) for every `make test`: they run only when
# asked for, by this variable or by naming the marker in -m (docs/development.md says why).
OPT_IN_ENV = "NPA_CLUSTER_OPT_IN"
OPT_IN_MARK = "cluster_opt_in"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(OPT_IN_ENV) == "1" or OPT_IN_MARK in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(
        reason=f"opt-in cluster test: {OPT_IN_ENV}=1 or -m {OPT_IN_MARK} runs it "
        "(docs/development.md: what is missing)"
    )
    for item in items:
        if item.get_closest_marker(OPT_IN_MARK) is not None:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = [f"{p.name} (pid {pid})" for pid, p in LIVE.items() if pid_alive(pid)]
    if leftovers:
        session.config.get_terminal_writer().line(
            "harness left processes running: " + ", ".join(leftovers), red=True
        )
        session.exitstatus = 1
