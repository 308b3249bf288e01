"""Test tiers: every test belongs to exactly one, and a unit test cannot break its tier's rule.

A pytest plugin (tests/conftest.py loads it). The one definition of a tier:

- `unit`: `tests/unit/`; in process: no child process, no socket, no sleep;
- `integration`: `tests/integration/`; real services on loopback, CLI subprocesses;
- `cluster`: `tests/integration/test_cluster_skypilot.py`; the real single-node Kubernetes.

The folder declares the tier; a tier marker a test carries itself must agree with it, and a test
anywhere else has no tier: either stops the collection. Each collected test then carries its
tier's marker (``-m unit`` selects exactly the unit tier), the cluster tier is ordered first (one
xdist worker starts on it at once: it is the longest), and the time each tier took is printed at
the end. While a unit test runs (its fixtures too), starting a process, touching a socket or
sleeping fails it, whatever the code under test does with the exception it gets.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

TIERS = ("unit", "integration", "cluster")
UNIT_DIR = "tests/unit"
INTEGRATION_DIR = "tests/integration"
# Every cluster test shares the session's cluster and the jobs controller its first launch
# creates: they live in one file, which one xdist worker runs from top to bottom.
CLUSTER_MODULE = "tests/integration/test_cluster_skypilot.py"
# Markers that only mean something inside some tiers: opt_in (tests/conftest.py) keeps a slow
# test out of make test unless asked for; a unit test is never slow enough to need it.
TIER_ONLY_MARKERS = {"opt_in": ("integration", "cluster")}


class TierError(ValueError):
    """A test without a tier, or with a tier its declaration contradicts."""


def tier_of(path: str, markers: set[str]) -> str:
    """The tier of a test in ``path`` (relative to the repository, '/'-separated) that carries
    ``markers`` (its own and its module's). Raises TierError on a test with no tier or with a
    marker that names another tier."""
    parts = PurePosixPath(path)
    if path == CLUSTER_MODULE:
        tier = "cluster"
    elif parts.is_relative_to(UNIT_DIR):
        tier = "unit"
    elif parts.is_relative_to(INTEGRATION_DIR):
        tier = "integration"
    else:
        raise TierError(
            f"{path}: no tier (a test lives in {UNIT_DIR}/, {INTEGRATION_DIR}/ or "
            f"{CLUSTER_MODULE}; tests/tiers.py says what each may do)"
        )
    declared = markers & set(TIERS)
    if declared - {tier}:
        raise TierError(
            f"{path}: marked {', '.join(sorted(declared))} but lives in the {tier} tier "
            f"(move the test to the folder of its tier, or drop the marker)"
        )
    for marker, needs in TIER_ONLY_MARKERS.items():
        if marker in markers and tier not in needs:
            raise TierError(
                f"{path}: marked {marker}, which only the {' and '.join(needs)} tiers may carry"
            )
    return tier


def item_tier(item: pytest.Item) -> str:
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return tier_of(path, {mark.name for mark in item.iter_markers()})


# --- collection ---------------------------------------------------------------------------------


TIER_KEY = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    errors: list[str] = []
    for item in items:
        try:
            tier = item_tier(item)
        except TierError as error:
            errors.append(f"{item.nodeid}: {error}")
            continue
        item.stash[TIER_KEY] = tier
        item.add_marker(tier)
    if errors:
        raise pytest.UsageError("tests outside the tier rules:\n  " + "\n  ".join(errors))
    # Explicitly first: the cluster tier is the longest, and one worker runs it in order.
    items.sort(key=lambda item: item.stash[TIER_KEY] != "cluster")


# --- the unit tier's rule -----------------------------------------------------------------------


class TierViolation(RuntimeError):
    """Raised where a unit test starts a process, touches a socket or sleeps."""


@dataclass
class Guard:
    """What a unit test did that its tier forbids, while the guard is on."""

    allowed_threads: set[int] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    active: bool = False

    def refuse(self, what: str) -> None:
        # Threads alive before the test (a session service of an earlier integration test in
        # this worker) are not the test's doing.
        if self.active and threading.get_ident() not in self.allowed_threads:
            self.violations.append(what)
            raise TierViolation(
                f"a unit test may not {what} (tests/tiers.py): move it to {INTEGRATION_DIR}/"
            )


GUARD = Guard()


def _refusing(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        # What was started or reached, when the call says it: a program's argv or an address.
        subject = next((a for a in args if isinstance(a, str | bytes | list | tuple)), None)
        GUARD.refuse(what if subject is None else f"{what} ({str(subject)[:120]})")
        return original(*args, **kwargs)

    refused.__wrapped__ = original  # type: ignore[attr-defined]
    return refused


# (owner, attribute, what the test did): every way this interpreter starts a process or reaches
# another through a socket, and sleeping.
_GUARDED: list[tuple[Any, str, str]] = [
    (subprocess.Popen, "_execute_child", "start a process"),
    (_posixsubprocess, "fork_exec", "start a process"),
    *[
        (os, name, "start a process")
        for name in (
            "fork",
            "forkpty",
            "posix_spawn",
            "posix_spawnp",
            "system",
            "execv",
            "execve",
            "execvp",
            "execvpe",
        )
        if hasattr(os, name)
    ],
    *[
        (socket.socket, name, "use a socket")
        for name in ("connect", "connect_ex", "bind", "sendto", "listen")
    ],
    (time, "sleep", "sleep"),
]


@contextmanager
def unit_rules() -> Iterator[Guard]:
    """Forbid, in this process, what a unit test may not do; yields the record of attempts."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _GUARDED]
    for owner, name, what in _GUARDED:
        setattr(owner, name, _refusing(what, getattr(owner, name)))
    # Only threads alive now are exempt (a service an earlier test of this worker started),
    # and the main thread never is.
    main = threading.main_thread()
    GUARD.allowed_threads = {
        t.ident for t in threading.enumerate() if t is not main and t.ident is not None
    }
    GUARD.violations = []
    GUARD.active = True
    try:
        yield GUARD
    finally:
        GUARD.active = False
        for owner, name, original in saved:
            setattr(owner, name, original)


VIOLATIONS_KEY = pytest.StashKey[list[str]]()


def _guarded(item: pytest.Item) -> Iterator[None]:
    if item.stash.get(TIER_KEY, None) != "unit":
        return (yield)
    with unit_rules() as guard:
        item.stash[VIOLATIONS_KEY] = guard.violations
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # The last test of a worker also tears down the session's services (a SkyPilot server an
    # integration test started): that teardown is not the unit test's.
    if nextitem is None:
        return (yield)
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    violations = item.stash.get(VIOLATIONS_KEY, None)
    if violations:
        seen = sorted(set(violations))
        violations.clear()
        report.outcome = "failed"
        report.longrepr = (
            f"unit tier broken in {call.when}: the test tried to {', '.join(seen)}; a unit test "
            f"runs in process (tests/tiers.py): move it to {INTEGRATION_DIR}/ or keep the "
            "process, socket or sleep out of it"
        )
    return report


# --- property strength ---------------------------------------------------------------------------

# make check sets it: every property runs a small sample (the loop of minutes); make test runs
# each at the strength its test asks for.
FAST_ENV = "NPA_TEST_FAST"
FAST_EXAMPLES = 20


def fast() -> bool:
    return os.environ.get(FAST_ENV) == "1"


# make test runs two workers side by side on a machine that may have two cores: time is not
# what a property test checks, so no example fails for taking long, and no test is refused
# because generating its data was slow. Properties without an example count of their own run
# a small sample under make check too.
settings.register_profile("npa", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "npa-fast", parent=settings.get_profile("npa"), max_examples=FAST_EXAMPLES
)
settings.load_profile("npa-fast" if fast() else "npa")


def examples(count: int) -> int:
    """A property's example count: ``count``, or a small sample under make check."""
    return min(count, FAST_EXAMPLES) if fast() else count


# --- the time of each tier ----------------------------------------------------------------------


@dataclass
class TierTime:
    tests: int = 0
    failed: int = 0
    seconds: float = 0.0
    start: float | None = None
    stop: float | None = None


TIMES: dict[str, TierTime] = {}


def nodeid_tier(nodeid: str) -> str | None:
    """The tier of a reported test from its node id alone (reports crossing from xdist workers
    carry no item); the markers were checked at collection."""
    try:
        return tier_of(nodeid.split("::")[0], set())
    except TierError:
        return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = nodeid_tier(report.nodeid)
    if tier is None or getattr(report, "start", None) is None:
        return
    times = TIMES.setdefault(tier, TierTime())
    times.seconds += report.duration
    times.start = report.start if times.start is None else min(times.start, report.start)
    times.stop = report.stop if times.stop is None else max(times.stop, report.stop)
    if report.when == "call" or (report.when == "setup" and not report.passed):
        times.tests += 1
    if report.failed:
        times.failed += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMES or hasattr(terminalreporter.config, "workerinput"):
        return
    terminalreporter.section("time per tier")
    for tier in TIERS:
        times = TIMES.get(tier)
        if times is None or times.start is None or times.stop is None:
            continue
        terminalreporter.line(
            f"{tier:<12} {times.tests:>5} tests  {times.failed:>3} failed  "
            f"{times.seconds:>8.1f} s of test time  {times.stop - times.start:>8.1f} s from "
            "first start to last end"
        )
