"""A second job the backend made for one launch request (SkyPilot's API server retries a request
internally while the jobs controller is locked) is found under the run's names and cancelled by
its id, by the supervisor and by ``cancel``; the run's own job is never touched. The real CLI and
supervisor, moto's S3, and the managed-jobs double scripted with ``twins``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fakes.managed_jobs import locked_state, read_state
from tests.integration.skypilot_world import manifest, run_npa, wait_for
from tests.integration.test_supervise_skypilot import (
    base,
    exited,
    jobs,
    script,
    set_status,
    submit,
)
from tests.integration.test_supervise_skypilot import world as world  # the fixture

pytestmark = [pytest.mark.integration]


def alive(w: dict[str, Any]) -> list[int]:
    done = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_CONTROLLER", "FAILED_SETUP"}
    return [j["job_id"] for j in jobs(w) if j["status"] not in done]


def test_a_twin_of_the_first_launch_is_cancelled_by_id_and_the_run_goes_on(
    world: dict[str, Any],
) -> None:
    script(world, outcomes=["RUNNING"], twins=[1])
    out = submit(world)
    assert out["job_id"] == 1  # the request's job; job 2 is the twin no request names
    # The stray is looked for at the first poll, before the job's RUNNING is mirrored.
    m = wait_for(world, lambda m: bool(m["supervisor"]["strays"]) and m["state"] == "RUNNING")
    [stray] = m["supervisor"]["strays"]
    assert (stray["job_id"], stray["job_name"], stray["state"], stray["by"]) == (
        2, base(world), "PENDING", "supervisor",
    )  # fmt: skip
    assert m["job_id"] == 1 and m["state"] == "RUNNING"
    assert alive(world) == [1]
    shown = run_npa(*("workbench", "workflow", "status", world["run_id"], "--project", "team"),
                    env=world["env"])  # fmt: skip
    assert "stray job 2 (" in shown.stdout and "cancelled by supervisor" in shown.stdout, shown
    set_status(world, 1, "SUCCEEDED")
    m = wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert exited(world)
    assert [(j["job_id"], j["status"]) for j in jobs(world)] == [(1, "SUCCEEDED"), (2, "CANCELLED")]
    assert read_state(world["state"])["launch_calls"] == 1


def test_a_twin_of_a_relaunch_is_cancelled_before_the_verdict(world: dict[str, Any]) -> None:
    # The relaunch (-a1, launch call 2) gets a twin; its own job succeeds at once. The run's
    # verdict is reached only after the twin is ended: no job of the run outlives it.
    script(world, outcomes=["FAILED_CONTROLLER", "SUCCEEDED"], twins=[2])
    submit(world)
    m = wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert exited(world)
    relaunch = f"{base(world)}-a1"
    assert [(j["job_id"], j["job_name"], j["status"]) for j in jobs(world)] == [
        (1, base(world), "FAILED_CONTROLLER"),
        (2, relaunch, "SUCCEEDED"),
        (3, relaunch, "CANCELLED"),
    ]
    assert m["job_id"] == 2 and m["supervisor"]["job_ids"] == [1, 2]
    assert [(s["job_id"], s["job_name"]) for s in m["supervisor"]["strays"]] == [(3, relaunch)]
    assert not alive(world)


def test_cancel_ends_every_job_of_the_run_and_says_which(world: dict[str, Any]) -> None:
    world["env"]["NPA_STRAY_CHECK_SECONDS"] = "3600"  # the supervisor looks once, at its start
    script(world, outcomes=["RUNNING"])
    submit(world)
    wait_for(world, lambda m: m["state"] == "RUNNING")
    calls = read_state(world["state"])["queue_calls"]
    deadline = time.monotonic() + 120
    while read_state(world["state"])["queue_calls"] < calls + 2:  # polls after its first look
        assert time.monotonic() < deadline, "the supervisor stopped polling"
        time.sleep(0.05)
    with locked_state(world["state"]) as state:  # a twin the supervisor has not looked for yet
        [job] = state["jobs"]
        state["jobs"].append({**job, "job_id": 7, "status": "PENDING"})
    r = run_npa(*("workbench", "workflow", "cancel", world["run_id"], "--project", "team"),
                env=world["env"])  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert "run " in r.stdout and "(job 1): cancelled" in r.stdout, r.stdout
    assert [(j["job_id"], j["status"]) for j in jobs(world)] == [(1, "CANCELLED"), (7, "CANCELLED")]
    m = wait_for(world, lambda m: m["state"] == "CANCELLED")
    # Recorded once. The supervisor may have ended it first: once job 1 is CANCELLED its poll
    # looks for strays before its verdict (under the load rehearsal of 2026-12-05 it did, before
    # cancel's own look), and cancelling by id twice is one cancel. Whoever recorded first is
    # kept. Either cancel says it cancelled job 7, or the supervisor had (and recorded it).
    [stray] = m["supervisor"]["strays"]
    assert stray["job_id"] == 7 and stray["by"] in ("cancel", "supervisor"), stray
    assert "also cancelled job 7" in r.stdout or stray["by"] == "supervisor", (stray, r.stdout)
    again = run_npa(*("workbench", "workflow", "cancel", world["run_id"], "--project", "team",
                      "--json"), env=world["env"])  # fmt: skip
    assert again.code == 0 and again.json()["strays"] == [], again.stdout  # repeat-safe
    assert manifest(world)["supervisor"]["strays"][0]["job_id"] == 7
