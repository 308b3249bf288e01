"""Supervision of a SkyPilot managed job after submit returns: the real CLI, moto's S3, the
kube fixture's /readyz, and the managed-jobs double (SkyPilot's own ManagedJobRecord and
ManagedJobStatus). The detached supervisor polls fast (NPA_SKYPILOT_POLL_SECONDS) and each
scenario counts exactly the jobs that were launched for the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.entry import WATCHER_MODULE
from tests.fakes.managed_jobs import fail_launch, job_tasks, locked_state, read_state
from tests.harness.kube import KubeCluster
from tests.harness.s3 import S3Server
from tests.integration import supervisors
from tests.integration.skypilot_world import make_world, manifest, run_npa, wait_for

pytestmark = [pytest.mark.integration]

BUCKET = "npa-runs"
# A supervisor that polls fast, and a readiness window that passes fast.
FAST = {
    "NPA_READYZ_WINDOW_SECONDS": "0.2",
    "NPA_READYZ_INTERVAL_SECONDS": "0.1",
    "NPA_SKYPILOT_POLL_SECONDS": "0.1",
}


@pytest.fixture
def world(
    s3: S3Server, kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    yield make_world(s3, kube, npa_home, tmp_path, bucket=BUCKET, env=dict(FAST))
    supervisors.stop_all(npa_home)


def submit(w: dict[str, Any], *extra: str) -> Any:
    r = run_npa(
        *("workbench", "workflow", "submit", str(w["spec"]), "--project", "team"),
        *("--run-id", w["run_id"], "--infra", f"k8s/{w['context']}", "--no-preflight-images"),
        *extra,
        "--json",
        env=w["env"],
    )
    assert r.code == 0, r.stdout + r.stderr
    return r.json()


def script(w: dict[str, Any], **changes: Any) -> None:
    with locked_state(w["state"]) as state:
        state.update(changes)


def set_status(w: dict[str, Any], job_id: int, status: str) -> None:
    with locked_state(w["state"]) as state:
        for job in state["jobs"]:
            if job["job_id"] == job_id:
                job["status"] = status


def test_a_stage_that_exits_0_without_its_outputs_fails_the_run(world: dict[str, Any]) -> None:
    # The task's command ended well but uploaded nothing: the stage has not succeeded, the job
    # is cancelled by id so no later stage runs on missing inputs.
    script(world, outcomes=["RUNNING"])
    submit(world)
    wait_for(world, lambda m: m["state"] == "RUNNING")
    with locked_state(world["state"]) as state:
        [job] = state["jobs"]
        tasks = job_tasks(job)
        tasks[0].update(status="SUCCEEDED", outputs=False)
        job["tasks"] = tasks
    m = wait_for(world, lambda m: m["state"] == "FAILED")
    assert exited(world)
    generate = m["stages"]["generate"]
    assert generate["state"] == "FAILED" and generate["classification"] == "payload"
    assert "numbers (missing)" in generate["detail"]
    [attempt] = m["supervisor"]["attempts"]
    assert attempt["failure"] == "missing-outputs" and "job 1 cancelled" in attempt["detail"]
    assert [j["status"] for j in jobs(world)] == ["CANCELLED"]
    assert read_state(world["state"])["launch_calls"] == 1


def jobs(w: dict[str, Any]) -> list[dict[str, Any]]:
    return list(read_state(w["state"])["jobs"])


def pid(w: dict[str, Any]) -> int | None:
    return supervisors.live_pid(w["home"], "team", w["run_id"])


def started(w: dict[str, Any], timeout: float = 120.0) -> int:
    """The supervisor's pid once it holds the run's lock (submit does not wait for that)."""
    deadline = time.monotonic() + timeout
    while (found := pid(w)) is None:
        assert time.monotonic() < deadline, "no supervisor took the run's lock"
        time.sleep(0.05)
    return found


def exited(w: dict[str, Any]) -> bool:
    return supervisors.wait_gone(w["home"], "team", w["run_id"])


def base(w: dict[str, Any]) -> str:
    return f"npa-tiny-local-{w['run_id']}"


def rename_reserved_run(w: dict[str, Any], tail: str) -> None:
    """Give the reserved run id the random tail ``tail``, as if the reservation had drawn it."""
    from npa.core.paths import NpaPaths

    record_path = NpaPaths(w["home"]).run_reservation("team", "tiny-local")
    record = json.loads(record_path.read_text())
    [entry] = record["runs"]
    renamed = w["run_id"].rsplit("-", 1)[0] + "-" + tail
    entry["run_id"] = renamed
    record_path.write_text(json.dumps(record))
    w["key"] = w["key"].replace(w["run_id"], renamed)
    w["run_id"] = renamed


# A drawn tail like "a94508" (one run in 160) ends like a relaunch's "-a<N>": the relaunch must
# still be named after the whole run id, and its launch journal must be its own.
@pytest.mark.parametrize("tail", ["drawn", "a94508", "a00001"])
def test_a_failed_controller_is_relaunched_under_the_same_run(
    world: dict[str, Any], tail: str
) -> None:
    if tail != "drawn":
        rename_reserved_run(world, tail)
    script(world, outcomes=["FAILED_CONTROLLER", "SUCCEEDED"])
    out = submit(world)
    assert out["job_id"] == 1
    m = wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert [j["job_name"] for j in jobs(world)] == [base(world), f"{base(world)}-a1"]
    assert m["run_id"] == world["run_id"] and m["job_id"] == 2
    assert m["job_name"] == f"{base(world)}-a1"
    sup = m["supervisor"]
    assert sup["classification"] == "transient_infrastructure" and sup["recovery"] == "retried"
    assert sup["infrastructure_recoveries"] == 1 and sup["payload_retries"] == 0
    assert sup["relaunches"] == 1 and sup["job_ids"] == [1, 2]
    assert [(a["what"], a["failure"]) for a in sup["attempts"]] == [("job 1", "FAILED_CONTROLLER")]
    assert m["launch_transaction"]["outcome"] == "launched"
    assert m["launch_transaction"]["reconcile"][0]["answer"] == "absent"
    receipt = json.loads(Path(out["receipt"]).read_text())
    assert receipt["job"]["job_id"] == "2"
    assert exited(world)


TEMPFAIL = "Job exited with exit code 75 (user program failure). Logs: sky jobs logs {}"


def test_a_task_that_ended_75_is_relaunched_as_infrastructure_not_payload(
    world: dict[str, Any],
) -> None:
    """The stage library ends a node 75 when the store stopped answering past its patience:
    the run goes on in a new job, counted against the infrastructure budget, not the stage's
    retries (it has none). Any other exit of the same job is the payload's."""
    script(world, outcomes=[["FAILED", TEMPFAIL.format(1)], "SUCCEEDED"])
    submit(world, "--retries", "0")
    m = wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    sup = m["supervisor"]
    assert sup["classification"] == "transient_infrastructure" and sup["recovery"] == "retried"
    assert sup["infrastructure_recoveries"] == 1 and sup["payload_retries"] == 0
    assert sup["job_ids"] == [1, 2] and m["job_name"] == f"{base(world)}-a1"
    assert exited(world)


def test_a_task_that_ended_1_beside_a_75_fails_as_payload(world: dict[str, Any]) -> None:
    script(
        world, outcomes=[["FAILED", "Job exited with exit codes [75, 1] (user program failure)"]]
    )
    submit(world, "--retries", "0")
    m = wait_for(world, lambda m: m["state"] == "FAILED")
    sup = m["supervisor"]
    assert sup["classification"] == "payload" and sup["relaunches"] == 0, sup
    assert len(jobs(world)) == 1
    assert exited(world)


def test_failed_controller_beyond_the_budget_is_exhausted(world: dict[str, Any]) -> None:
    script(world, outcomes=["FAILED_CONTROLLER"] * 4)
    # A threshold above the budget: this is about the budget, not identical startup failures.
    submit(world, "--max-infrastructure-recoveries", "2", "--startup-failure-threshold", "5")
    m = wait_for(world, lambda m: m["state"] == "INFRASTRUCTURE_RECOVERY_EXHAUSTED")
    assert exited(world)
    assert len(jobs(world)) == 3  # the first job and two recoveries
    assert read_state(world["state"])["launch_calls"] == 3
    sup = m["supervisor"]
    assert sup["recovery"] == "exhausted" and sup["infrastructure_recoveries"] == 2
    assert [a["recovery"] for a in sup["attempts"]] == ["retried", "retried", "exhausted"]


def test_identical_controller_failures_end_the_run_failed_startup(world: dict[str, Any]) -> None:
    # The same fault on three successive jobs (ids and pids differ): the controller cannot
    # bring the job up, whatever budget is left for infrastructure recoveries.
    died = "Controller process {} exited abnormally (exit code 137) at 2026-11-29 10:0{}:00"
    script(
        world,
        outcomes=[["FAILED_CONTROLLER", died.format(4100 + i, i)] for i in range(5)],
    )
    submit(world, "--max-infrastructure-recoveries", "10")
    m = wait_for(world, lambda m: m["state"] == "FAILED_STARTUP")
    assert exited(world)
    assert len(jobs(world)) == 3 and read_state(world["state"])["launch_calls"] == 3
    sup = m["supervisor"]
    assert sup["startup_failures"] == 3 and sup["infrastructure_recoveries"] == 2
    assert [a["recovery"] for a in sup["attempts"]] == ["retried", "retried", "stopped"]
    assert all(a["startup"] for a in sup["attempts"])
    assert len({a["failure"] for a in sup["attempts"]}) == 1
    assert sup["attempts"][0]["failure"].startswith("FAILED_CONTROLLER: Controller process N ")
    status = run_npa(
        *("workbench", "workflow", "status", world["run_id"], "--project", "team", "--json"),
        env=world["env"],
    )
    assert status.json()["state"] == "FAILED_STARTUP", status.stdout + status.stderr


NO_ROOM = (
    "sky.exceptions.ResourcesUnavailableError: Failed to acquire resources in all zones in "
    "kubernetes/ctx-{}. Insufficient CPU capacity: 1 node lacks 3.0 CPUs"
)


def test_launches_the_controller_keeps_failing_are_shown_then_end_the_run_failed_startup(
    world: dict[str, Any],
) -> None:
    """A task the cluster has no room for: SkyPilot's controller fails the launch, waits and
    tries again for ever, with the job PENDING, no failure reason and no pod. Status shows the
    controller's reason while it retries; the identical failure at the threshold ends the run
    FAILED_STARTUP and cancels the job by id."""
    submit(world, "--startup-failure-threshold", "3")
    started(world)
    fail_launch(world["state"], 1, NO_ROOM.format(1))
    fail_launch(world["state"], 1, NO_ROOM.format(2))
    m = wait_for(world, lambda m: m["supervisor"]["startup_failures"] == 2)
    assert m["state"] == "PENDING" and [j["status"] for j in jobs(world)] == ["PENDING"]
    status = run_npa(
        *("workbench", "workflow", "status", world["run_id"], "--project", "team", "--json"),
        env=world["env"],
    )
    answer = status.json()
    assert status.code == 0 and answer["state"] == "PENDING", status.stdout + status.stderr
    assert [f["attempt"] for f in answer["launch_failures"]] == [1, 2]
    assert answer["launch_failures"][-1]["error"] == NO_ROOM.format(2)  # no stray parenthesis
    [source] = [s for s in answer["sources"] if s["source"] == "launch-attempts"]
    assert source["answer"] == "found" and "2 failed launches" in source["detail"]
    assert answer["next"][0] == source["fix"] and "--controller 1" in source["fix"]
    assert any("gpus --context" in n for n in answer["next"]), answer["next"]
    generate = answer["stages"]["generate"]
    assert generate["state"] == "PENDING" and generate["detail"] == "Job is in backoff"
    text = run_npa(
        *("workbench", "workflow", "status", world["run_id"], "--project", "team"),
        env=world["env"],
    )
    assert "launch: 2 failed launches so far" in text.stdout, text.stdout

    fail_launch(world["state"], 1, NO_ROOM.format(3))
    m = wait_for(world, lambda m: m["state"] == "FAILED_STARTUP")
    assert exited(world)
    assert [j["status"] for j in jobs(world)] == ["CANCELLED"]
    assert read_state(world["state"])["launch_calls"] == 1
    sup = m["supervisor"]
    assert [a["what"] for a in sup["attempts"]] == [f"job 1 launch {i}" for i in (1, 2, 3)]
    assert [a["recovery"] for a in sup["attempts"]] == ["adopted", "adopted", "stopped"]
    assert len({a["failure"] for a in sup["attempts"]}) == 1
    assert "job 1 cancelled" in sup["attempts"][-1]["detail"]
    generate = m["stages"]["generate"]
    assert generate["state"] == "FAILED_STARTUP" and "Insufficient CPU" in generate["detail"]


def test_different_launch_failures_do_not_reach_the_threshold(world: dict[str, Any]) -> None:
    submit(world, "--startup-failure-threshold", "2")
    started(world)
    for error in ("CloudError: catalog unreachable", NO_ROOM.format(1), "CloudError: quota"):
        fail_launch(world["state"], 1, error)
    m = wait_for(world, lambda m: m["supervisor"]["startup_failures"] == 3)
    assert m["state"] == "PENDING" and [j["status"] for j in jobs(world)] == ["PENDING"]
    assert pid(world) is not None  # still watching a job that may yet start


# What containerd answers through the kubelet when the registry is not reachable (transient:
# counted against the threshold), and when the registry says the image is not there
# (actionable configuration: the run stops at once).
UNREACHABLE = (
    'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": failed to '
    'resolve reference "{image}": failed to do request: Head "https://registry.example/v2/npa/'
    'absent/manifests/sha256:0": dial tcp 10.0.0.5:443: i/o timeout'
)
NOT_THERE = (
    'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to '
    'resolve reference "{image}": {image}: not found'
)


def pull_failure_event(
    kube: KubeCluster,
    pod: str,
    image: str,
    answer: str = UNREACHABLE,
    *,
    uid: str | None = None,
    name: str | None = None,
    message: str | None = None,
) -> str:
    """The event a kubelet records for a pod that cannot pull its image (``message`` replaces
    its text); the pod itself may be gone (SkyPilot deletes it), its events stay. Returns the
    event's name."""
    import datetime
    import uuid

    from kubernetes import client

    name = name or f"{pod}.{uuid.uuid4().hex[:8]}"
    now = datetime.datetime.now(datetime.UTC)
    kube.core().create_namespaced_event(
        "npa-team",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace="npa-team"),
            involved_object=client.V1ObjectReference(
                kind="Pod", name=pod, namespace="npa-team", uid=uid or str(uuid.uuid4())
            ),
            reason="Failed",
            message=message or f'Failed to pull image "{image}": ' + answer.format(image=image),
            type="Warning",
            count=1,
            first_timestamp=now,
            last_timestamp=now,
        ),
    )
    return name


def test_a_pod_that_cannot_start_is_counted_once_not_again_as_a_failed_launch(
    world: dict[str, Any],
) -> None:
    """SkyPilot's controller fails the launch of a task whose pod cannot pull its image: one
    fault, seen in the pod's events and in the controller's log. Counted from both sides (two
    signatures) the run of identical failures would restart at each alternation and never reach
    the threshold; the pods' reason is counted, the launches never are, even on a poll that
    reads no pod event."""
    from sky.jobs.utils import generate_managed_job_cluster_name

    submit(world, "--startup-failure-threshold", "2")
    started(world)
    [job] = jobs(world)
    task = job_tasks(job)[0]["name"]
    cluster = generate_managed_job_cluster_name(task, 1)
    image = "registry.example/npa/absent@sha256:" + "0" * 64
    kube = world["kube"]
    first = pull_failure_event(kube, f"{cluster}-head-aaaaa", image)
    wait_for(world, lambda m: m["supervisor"]["startup_failures"] == 1)
    fail_launch(world["state"], 1, f"sky.exceptions.ResourcesUnavailableError: {image}: pull")
    # The event expires (or a poll cannot read it): the launch failure stays uncounted.
    kube.core().delete_namespaced_event(first, "npa-team")
    polls = read_state(world["state"])["queue_calls"]
    wait_for(world, lambda m: read_state(world["state"])["queue_calls"] > polls + 10)
    assert manifest(world)["supervisor"]["startup_failures"] == 1
    pull_failure_event(kube, f"{cluster}-head-bbbbb", image)
    m = wait_for(world, lambda m: m["state"] == "FAILED_STARTUP")
    assert exited(world)
    sup = m["supervisor"]
    assert [a["what"].split(" (")[0] for a in sup["attempts"]] == [
        f"job 1 pod {cluster}-head-aaaaa",
        f"job 1 pod {cluster}-head-bbbbb",
    ]
    assert [j["status"] for j in jobs(world)] == ["CANCELLED"]


def test_an_image_the_registry_does_not_have_stops_the_run_at_its_first_sight(
    world: dict[str, Any],
) -> None:
    """The registry's "not found" is a configuration fault: asking again gets the same answer.
    With a threshold of 5 the run still ends at the first pod that shows it, classified
    actionable_configuration; only the run's own job (by its recorded id) is cancelled, and
    status names the image check, not the same launch again."""
    from sky.jobs.utils import generate_managed_job_cluster_name

    submit(world, "--startup-failure-threshold", "5")
    started(world)
    with locked_state(world["state"]) as state:  # another run's job, which must stay as it is
        other = state["next_id"]
        state["next_id"] += 1
        state["jobs"].append(
            {"job_id": other, "job_name": "npa-other-run", "status": "PENDING", "tasks": 1,
             "submitted_at": time.time()}
        )  # fmt: skip
    [job] = [j for j in jobs(world) if j["job_id"] != other]
    cluster = generate_managed_job_cluster_name(job_tasks(job)[0]["name"], job["job_id"])
    image = "registry.example/npa/absent@sha256:" + "0" * 64
    # The kubelet records the pull's answer, then "Error: ErrImagePull" (which says nothing of
    # it); named so that the second lists first, the pod must still read as the first says.
    pod, uid = f"{cluster}-head-aaaaa", str(uuid.uuid4())
    pull_failure_event(world["kube"], pod, image, NOT_THERE, uid=uid, name=f"{pod}.1")
    pull_failure_event(world["kube"], pod, image, uid=uid, name=f"{pod}.0",
                       message="Error: ErrImagePull")  # fmt: skip
    m = wait_for(world, lambda m: m["state"] == "FAILED_STARTUP")
    assert exited(world)
    sup = m["supervisor"]
    [attempt] = sup["attempts"]  # one sight, no counting towards the threshold
    assert sup["classification"] == "actionable_configuration" and sup["recovery"] == "stopped"
    assert sup["startup_failures"] == 1 and sup["job_ids"] == [job["job_id"]]
    assert attempt["classification"] == "actionable_configuration" and attempt["startup"]
    assert "no such image" in attempt["detail"]
    assert f"job {job['job_id']} cancelled" in attempt["detail"]
    stage = m["stages"][attempt["stage"]]
    assert stage["state"] == "FAILED_STARTUP"
    assert stage["classification"] == "actionable_configuration"
    assert {j["job_id"]: j["status"] for j in jobs(world)} == {
        job["job_id"]: "CANCELLED",
        other: "PENDING",
    }
    assert read_state(world["state"])["launch_calls"] == 1  # nothing relaunched
    r = run_npa("workbench", "workflow", "status", world["run_id"], "--project", "team", "--json",
                env=world["env"])  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    answer = r.json()
    assert answer["state"] == "FAILED_STARTUP", answer
    preflight = f"npa workbench workflow preflight-images {world['spec']} --project team --json"
    assert answer["next"] == [preflight], answer["next"]
    text = run_npa(*("workbench", "workflow", "status", world["run_id"], "--project", "team"),
                   env=world["env"])  # fmt: skip
    assert f"next: {preflight}" in text.stdout and "--resume-run" not in text.stdout


def test_a_job_in_no_backoff_never_reads_the_controller_log(world: dict[str, Any]) -> None:
    script(world, outcomes=["STARTING"])
    submit(world)
    started(world)
    polls = read_state(world["state"])["queue_calls"]
    wait_for(world, lambda m: read_state(world["state"])["queue_calls"] > polls + 5)
    assert read_state(world["state"]).get("controller_log_calls", []) == []


def test_different_controller_failures_are_not_identical(world: dict[str, Any]) -> None:
    reasons = ["node lost", "controller pod evicted", "node lost", "out of memory"]
    script(world, outcomes=[["FAILED_CONTROLLER", r] for r in reasons])
    submit(world, "--max-infrastructure-recoveries", "3")
    m = wait_for(world, lambda m: m["state"] == "INFRASTRUCTURE_RECOVERY_EXHAUSTED")
    assert exited(world)
    assert len(jobs(world)) == 4
    sup = m["supervisor"]
    assert sup["startup_failures"] == 4
    assert [a["recovery"] for a in sup["attempts"]] == ["retried"] * 3 + ["exhausted"]


def test_payload_failure_is_retried_only_within_retries(world: dict[str, Any]) -> None:
    script(world, outcomes=["FAILED", "FAILED", "SUCCEEDED"])
    submit(world, "--retries", "1")
    m = wait_for(world, lambda m: m["state"] == "FAILED")
    assert exited(world)
    assert len(jobs(world)) == 2
    sup = m["supervisor"]
    assert sup["classification"] == "payload" and sup["recovery"] == "stopped"
    assert sup["payload_retries"] == 1 and sup["infrastructure_recoveries"] == 0
    assert [a["classification"] for a in sup["attempts"]] == ["payload", "payload"]
    failed = [s for s in m["stages"].values() if s["state"] == "FAILED"]
    assert failed and failed[0]["classification"] == "payload"


def test_each_stage_has_its_own_payload_retries(world: dict[str, Any]) -> None:
    # --retries 1 allows one retry per stage: generate's retry does not spend square's.
    script(
        world,
        outcomes=[
            {"status": "FAILED", "tasks": ["FAILED", "CANCELLED", "CANCELLED"]},
            {"status": "FAILED", "tasks": ["SUCCEEDED", "FAILED", "CANCELLED"]},
            {"status": "FAILED", "tasks": ["SUCCEEDED", "FAILED", "CANCELLED"]},
            "SUCCEEDED",
        ],
    )
    submit(world, "--retries", "1")
    m = wait_for(world, lambda m: m["state"] == "FAILED")
    assert exited(world)
    # A relaunch runs the whole pipeline again (only submit --resume-run adopts stages).
    assert [len(j["tasks"]) for j in jobs(world)] == [3, 3, 3]
    sup = m["supervisor"]
    assert sup["payload_retries"] == 2
    assert [(a["stage"], a["recovery"]) for a in sup["attempts"]] == [
        ("generate", "retried"),
        ("square", "retried"),
        ("square", "stopped"),
    ]
    assert m["stages"]["generate"]["state"] == "SUCCEEDED"
    assert m["stages"]["square"]["state"] == "FAILED"


def test_actionable_configuration_stops_with_that_job_only(world: dict[str, Any]) -> None:
    script(world, outcomes=["FAILED_SETUP"])
    submit(world, "--retries", "3")
    m = wait_for(world, lambda m: m["state"] == "FAILED_SETUP")
    assert exited(world) and len(jobs(world)) == 1
    last = m["supervisor"]["attempts"][-1]
    assert last["classification"] == "actionable_configuration" and last["recovery"] == "stopped"
    assert "only this job ended" in last["detail"]


def test_an_unavailable_queue_is_unknown_and_blocks_relaunch(world: dict[str, Any]) -> None:
    script(world, outcomes=["RUNNING"])
    submit(world)
    wait_for(world, lambda m: m["state"] == "RUNNING")
    script(world, queue_error="ClusterNotUpError")
    m = wait_for(world, lambda m: m["supervisor"]["classification"] == "unknown")
    assert m["supervisor"]["recovery"] == "blocked"
    assert m["state"] == "RUNNING" and m["job_id"] == 1  # unknown is never "absent"
    polled = read_state(world["state"]).get("queue_calls", 0)
    deadline = time.monotonic() + 120
    while read_state(world["state"]).get("queue_calls", 0) < polled + 3:  # three polls, queue down
        assert time.monotonic() < deadline, "the supervisor stopped polling the queue"
        time.sleep(0.05)
    m = manifest(world)
    assert len(m["supervisor"]["attempts"]) == 1  # recorded once per episode
    assert read_state(world["state"])["launch_calls"] == 1 and pid(world) is not None
    assert all(a["what"] == "job 1" for a in m["supervisor"]["attempts"])
    script(world, queue_error=None)
    set_status(world, 1, "SUCCEEDED")
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert exited(world) and len(jobs(world)) == 1


def test_a_killed_supervisor_is_reattached_by_a_rerun(world: dict[str, Any]) -> None:
    script(world, outcomes=["RUNNING"])
    submit(world)
    wait_for(world, lambda m: m["state"] == "RUNNING")
    first = started(world)
    assert first > 0
    os.kill(first, signal.SIGKILL)
    assert exited(world)
    again = submit(world)
    assert again["outcome"] == "adopted" and again["job_id"] == 1
    second = started(world)
    assert second != first
    assert read_state(world["state"])["launch_calls"] == 1
    set_status(world, 1, "SUCCEEDED")
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert exited(world) and len(jobs(world)) == 1


def test_a_second_supervisor_never_acts_on_the_same_run(world: dict[str, Any]) -> None:
    script(world, outcomes=["RUNNING"])
    submit(world)
    first = started(world)
    again = submit(world)  # a live supervisor is kept, not doubled
    assert again["outcome"] == "adopted" and pid(world) == first
    directory = world["home"] / "supervisors" / f"team.{world['run_id']}"
    extra = subprocess.run(
        [sys.executable, "-m", WATCHER_MODULE, str(directory)],
        env={**os.environ, **world["env"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert extra.returncode == 0 and "another supervisor holds this run" in extra.stdout
    assert pid(world) == first
    set_status(world, 1, "SUCCEEDED")
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert exited(world)


def test_a_supervisor_killed_mid_relaunch_leaves_one_attempt(world: dict[str, Any]) -> None:
    script(world, outcomes=["RUNNING", "RUNNING"])
    submit(world)
    first = started(world)
    script(world, kill_at="launch_requested")  # the supervisor's relaunch, not submit's launch
    set_status(world, 1, "FAILED_CONTROLLER")
    assert exited(world)
    m = manifest(world)
    assert m["state"] == "LAUNCHING" and m["job_id"] is None
    assert m["job_name"] == f"{base(world)}-a1"
    again = submit(world)  # resolves the attempt's request from its journal: no new launch
    assert again["job_id"] == 2 and again["job_name"] == f"{base(world)}-a1"
    assert started(world) != first
    set_status(world, 2, "SUCCEEDED")
    m = wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert exited(world)
    assert [j["job_name"] for j in jobs(world)] == [base(world), f"{base(world)}-a1"]
    assert read_state(world["state"])["launch_calls"] == 2
    assert m["supervisor"]["infrastructure_recoveries"] == 1


def test_a_job_that_ended_unjudged_is_not_the_runs_state_and_a_watch_says_so(
    world: dict[str, Any],
) -> None:
    """The job ends while no supervisor runs: the run's state stays npa's record (the job's end
    is shown beside it), a watch ends at once with the command that brings a supervisor back,
    and once that supervisor has judged the job the run has its verdict."""
    script(world, outcomes=["RUNNING"])
    submit(world)
    wait_for(world, lambda m: m["state"] == "RUNNING")
    os.kill(started(world), signal.SIGKILL)
    assert exited(world)
    set_status(world, 1, "SUCCEEDED")
    ask = ("workbench", "workflow", "status", world["run_id"], "--project", "team", "--json")
    now = run_npa(*ask, env=world["env"])
    assert now.code == 0, now.stdout + now.stderr
    answer = now.json()
    assert (answer["state"], answer["job_state"]) == ("RUNNING", "SUCCEEDED"), answer
    assert answer["verdict_pending"] and answer["supervised"] is False
    assert "verdict" in answer["reason"] and "no supervisor" in answer["reason"]
    assert answer["next"][0].startswith("npa workbench workflow submit "), answer["next"]
    watched = run_npa(*ask, "--watch", "--interval", "0.2", env=world["env"], timeout=120)
    events = [json.loads(line) for line in watched.stdout.splitlines() if line.strip()]
    assert watched.code == 1, watched.stdout + watched.stderr
    assert events[-1]["state"] == "RUNNING" and events[-1]["supervised"] is False
    assert "SUCCEEDED" not in [e["after"] for e in events[:-1] if e.get("event") == "state"]
    # The job's end is evidence, printed as the job's event.
    assert any(e.get("event") == "job" and e["after"] == "SUCCEEDED" for e in events[:-1])
    # The same submit brings a supervisor back; it judges the ended job, launching nothing.
    assert submit(world)["outcome"] == "adopted"
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    done = run_npa(*ask, "--watch", "--interval", "0.2", env=world["env"], timeout=120)
    assert done.code == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["state"] == "SUCCEEDED"
    assert read_state(world["state"])["launch_calls"] == 1
