"""Test configuration: the real-service harness and a check that it left nothing running."""

from __future__ import annotations

import gc
import os
import secrets
import signal
from types import FrameType
from typing import Any

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
from tests.harness.procs import LIVE, pid_alive, stop_marked

# Every test's tier, the unit tier's rule, the cluster tier first and the time of each tier.
pytest_plugins = ["tests.tiers"]

SESSION_MARK = "NPA_TEST_SESSION"


@pytest.fixture(autouse=True)
def _collector_unfrozen() -> Any:
    """A command run in this process freezes what it built (npa.core.collector): a CLI process
    then exits. A test worker lives on, so what a test froze is handed back to the collector."""
    yield
    gc.unfreeze()


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout, `timeout`, kill) tears fixtures down as Ctrl-C
    # does, so the services it started are stopped rather than orphaned.
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    # Tests press Ctrl-C on CLI children (SIGINT). A suite started in the background by a
    # non-interactive shell, or under nohup, inherits SIGINT ignored, and an ignored signal
    # stays ignored across exec: the child would never see it. Handled here, it is reset to
    # its default in every child.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Text output is as wide as $COLUMNS says (npa.core.table). pytest-xdist's workers start
    # with COLUMNS=80 and LINES=24, and a shell may export its own: a test's CLI child must see
    # what a pipe sees (rows that never wrap) whoever runs the suite, unless the test sets one.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    # Every process this session starts, however detached (a daemon SkyPilot's CLI forks, a
    # server a failed start left running), inherits this mark: what still carries it when the
    # session ends was left behind. A fresh mark per process, so each xdist worker has its own.
    os.environ[SESSION_MARK] = secrets.token_hex(8)


# Tests too slow for every `make test` on CI's two cores (each passed on the real services and
# cluster): they run only when asked for, by this variable (`make test-all`) or by naming the
# marker in -m. The skip reason says how; docs/development.md lists them.
OPT_IN_ENV = "NPA_TEST_OPT_IN"
OPT_IN_MARK = "opt_in"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(OPT_IN_ENV) == "1" or OPT_IN_MARK in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(
        reason=f"opt-in: {OPT_IN_ENV}=1 (make test-all) or -m {OPT_IN_MARK} runs it "
        "(docs/development.md says why)"
    )
    for item in items:
        if item.get_closest_marker(OPT_IN_MARK) is not None:
            item.add_marker(skip)


# Under pytest-xdist (make test) each worker runs its own fixtures: a worker reports what its
# harness left running to the controller, which fails the run (a worker's own exit status is
# not the run's).
WORKER_LEFTOVERS: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    WORKER_LEFTOVERS.extend(getattr(node, "workeroutput", {}).get("npa_leftovers", []))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = [f"{p.name} (pid {pid})" for pid, p in LIVE.items() if pid_alive(pid)]
    leftovers += [
        f"{name} (pid {pid}, killed)" for pid, name in stop_marked(SESSION_MARK, os.environ)
    ]
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["npa_leftovers"] = leftovers
    leftovers += WORKER_LEFTOVERS
    if leftovers:
        session.config.get_terminal_writer().line(
            "harness left processes running: " + ", ".join(leftovers), red=True
        )
        session.exitstatus = 1
