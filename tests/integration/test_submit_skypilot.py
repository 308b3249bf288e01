"""submit on the SkyPilot path: the real CLI, moto's S3, the kube fixture's /readyz, and the
managed-jobs double (SkyPilot's own ManagedJobRecord and ManagedJobStatus) at the backend
boundary. Every scenario ends with exactly one job for the run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from npa.backends.skypilot.tasks import documents
from tests.fakes.entry import CLI_MODULE
from tests.fakes.managed_jobs import read_state, write_state
from tests.harness.kube import KubeCluster
from tests.harness.s3 import S3Server
from tests.integration import supervisors
from tests.integration.skypilot_world import make_world, run_npa

pytestmark = pytest.mark.integration

BUCKET = "npa-runs"


@pytest.fixture
def world(
    s3: S3Server, kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    # A fast poll for the supervisor submit leaves behind.
    yield make_world(
        s3, kube, npa_home, tmp_path, bucket=BUCKET, env={"NPA_SKYPILOT_POLL_SECONDS": "0.2"}
    )
    supervisors.stop_all(npa_home)  # the fake's jobs never end, so their watchers would not


def argv(w: dict[str, Any]) -> list[str]:
    return [
        "workbench",
        "workflow",
        "submit",
        str(w["spec"]),
        "--project",
        "team",
        "--run-id",
        w["run_id"],
        "--infra",
        f"k8s/{w['context']}",
        "--no-preflight-images",
        "--json",
    ]


def submit(w: dict[str, Any]) -> Any:
    return run_npa(*argv(w), env=w["env"])


def script(w: dict[str, Any], **changes: Any) -> None:
    state = read_state(w["state"])
    state.update(changes)
    write_state(w["state"], state)


def jobs(w: dict[str, Any]) -> list[dict[str, Any]]:
    return list(read_state(w["state"])["jobs"])


def job_name(w: dict[str, Any]) -> str:
    return f"npa-tiny-local-{w['run_id']}"


def test_launch_probes_readyz_and_passes_the_context_kubeconfig(world: dict[str, Any]) -> None:
    r = submit(world)
    assert r.code == 0, r.stdout + r.stderr
    out = r.json()
    tx = out["launch_transaction"]
    probes = tx["readiness"][0]["probes"]
    assert len(probes) == 3 and all(p["ok"] and p["status"] == 200 for p in probes)
    assert probes[-1]["at"] - probes[0]["at"] >= 0.4
    assert tx["reconcile"][0]["answer"] == "absent" and tx["outcome"] == "launched"
    assert len(jobs(world)) == 1 and out["job_id"] == jobs(world)[0]["job_id"]
    # The stages chained into one managed job, in plan order, each task named for its stage.
    run = world["run_id"]
    assert [t["name"] for t in jobs(world)[0]["tasks"]] == [
        f"npa-{run}-generate-w0", f"npa-{run}-square-w0", f"npa-{run}-total-w0"
    ]  # fmt: skip
    assert read_state(world["state"])["kubeconfigs"] == [str(world["kubeconfig"])]
    # The supervisor's log quotes the backend's answers: only its owner may read it.
    (log,) = (world["home"] / "supervisors").glob("*/supervisor.log")
    assert log.stat().st_mode & 0o777 == 0o600


def test_an_existing_job_is_adopted_by_id(world: dict[str, Any]) -> None:
    script(
        world,
        next_id=8,
        jobs=[
            {
                "job_id": 7,
                "job_name": job_name(world),
                "status": "RUNNING",
                "tasks": 3,
                "submitted_at": 1.0,
            }
        ],
    )
    r = submit(world)
    assert r.code == 0, r.stdout + r.stderr
    out = r.json()
    assert out["outcome"] == "adopted" and out["job_id"] == 7
    assert read_state(world["state"])["launch_calls"] == 0


def test_transient_refusal_then_proven_absence_then_launch(world: dict[str, Any]) -> None:
    script(world, refuse=["ResourcesUnavailableError"])
    r = submit(world)
    assert r.code == 0, r.stdout + r.stderr
    tx = r.json()["launch_transaction"]
    assert [a["outcome"] for a in tx["attempts"]] == ["refused", "accepted"]
    assert [c["answer"] for c in tx["reconcile"]] == ["absent", "absent"]
    assert len(tx["readiness"]) == 2  # stability re-established before the retry
    assert len(jobs(world)) == 1


def test_ambiguous_queue_blocks_without_launching(world: dict[str, Any]) -> None:
    script(world, queue_error="ClusterNotUpError")
    r = submit(world)
    assert r.code == 4, r.stdout + r.stderr
    assert r.json()["error"]["kind"] == "ambiguous_existence"
    assert read_state(world["state"])["launch_calls"] == 0

    script(
        world,
        queue_error=None,
        jobs=[
            {
                "job_id": 3,
                "job_name": job_name(world),
                "status": "RUNNING",
                "tasks": 1,
                "submitted_at": 1.0,
            },
            {
                "job_id": 4,
                "job_name": job_name(world),
                "status": "PENDING",
                "tasks": 1,
                "submitted_at": 2.0,
            },
        ],
    )
    r = submit(world)
    assert r.code == 4 and "2 jobs are named" in r.json()["error"]["message"]
    assert read_state(world["state"])["launch_calls"] == 0


def test_the_same_refusal_three_times_is_failed_startup(world: dict[str, Any]) -> None:
    script(world, refuse=["ResourcesUnavailableError"] * 3)
    r = submit(world)
    assert r.code == 1, r.stdout + r.stderr
    assert "FAILED_STARTUP" in r.json()["error"]["message"]
    assert jobs(world) == []


@pytest.mark.parametrize("step", ["locked", "launch_requested", "launch_accepted"])
def test_sigkill_at_each_step_then_rerun_launches_exactly_one_job(
    world: dict[str, Any], step: str
) -> None:
    script(world, kill_at=step)
    first = submit(world)
    assert first.code == -9, first.stdout + first.stderr
    second = submit(world)
    assert second.code == 0, second.stdout + second.stderr
    assert len(jobs(world)) == 1
    assert read_state(world["state"])["launch_calls"] == 1
    receipt = json.loads(Path(second.json()["receipt"]).read_text())
    assert receipt["job"]["job_id"] == str(jobs(world)[0]["job_id"])


def test_two_concurrent_submits_launch_once(world: dict[str, Any]) -> None:
    import os

    env = {**os.environ, **world["env"]}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", CLI_MODULE, *argv(world)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ids = {json.loads(o)["job_id"] for o, _ in outs}
    assert len(ids) == 1 and len(jobs(world)) == 1
    assert sorted(json.loads(o)["outcome"] for o, _ in outs) == ["adopted", "launched"]


PINNED_A = "registry.example.com/team/a@sha256:" + "a" * 64
PINNED_B = "registry.example.com/team/b@sha256:" + "b" * 64
IMAGE_CHOICES = {
    "spec": (),
    "image": ("--image", PINNED_A),
    "override": ("--image-override", f"shell={PINNED_B}"),
    "both": ("--image", PINNED_A, "--image-override", f"shell={PINNED_B}"),
}


@pytest.mark.parametrize("choice", sorted(IMAGE_CHOICES))
def test_the_launched_tasks_are_what_render_shows_for_the_same_image_flags(
    world: dict[str, Any], tmp_path: Path, choice: str
) -> None:
    """Every image flag reaches the task on every path: with --no-preflight-images the chosen
    image is pinned from its own digest, exactly as render pins it for review."""
    flags = IMAGE_CHOICES[choice]
    r = run_npa(*argv(world), *flags, env=world["env"])
    assert r.code == 0, r.stdout + r.stderr
    (job,) = jobs(world)
    out = tmp_path / "review"
    review = run_npa(
        "workbench", "workflow", "render", str(world["spec"]), "--run-id", world["run_id"],
        "--project", "team", "--context", world["context"], "--out", str(out), *flags,
        env=world["env"],
    )  # fmt: skip
    assert review.code == 0, review.stdout + review.stderr
    # A stage's file holds its wave tasks in order; each launched task is one of them.
    reviewed = {
        yaml.safe_load(doc)["name"]: doc
        for path in out.glob("*.yaml")
        for doc in documents(path.read_text())
    }
    launched = {task["name"]: task["yaml"] for task in job["tasks"]}
    assert launched == reviewed
    wanted = {"spec": "busybox@sha256:", "image": PINNED_A, "override": PINNED_B, "both": PINNED_B}
    assert all(wanted[choice] in text for text in launched.values()), launched


def test_an_unpinned_chosen_image_is_refused_by_submit_as_by_render(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """Without preflight nothing resolves a tag: a chosen image without a digest cannot be
    launched, and submit says so as render does, before anything is launched."""
    flags = ("--image", "registry.example.com/team/a:v1")
    r = run_npa(*argv(world), *flags, env=world["env"])
    review = run_npa(
        "workbench", "workflow", "render", str(world["spec"]), "--run-id", world["run_id"],
        "--project", "team", "--context", world["context"], "--out", str(tmp_path / "review"),
        *flags, env=world["env"],
    )  # fmt: skip
    assert (r.code, review.code) == (2, 2), r.stdout + r.stderr + review.stderr
    assert "pinned by digest" in r.stderr + r.stdout and "pinned by digest" in review.stderr
    assert jobs(world) == []
