"""SkyPilot managed jobs for real: npa's CLI, SkyPilot 0.14.1 and its jobs controller, on the
single-node cluster that runs pods, with moto's S3 on the cluster's gateway as the run store.
No fake anywhere: the kubelet, the scheduler and SkyPilot decide everything these tests read.

The session shares one jobs controller (a pod SkyPilot creates on the first launch, as it does
for a user); the first test here is therefore the first launch on a fresh cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.s3 import SECRET_KEY
from tests.harness.skypilot_cluster import SkyCluster
from tests.integration.clusterworld import (
    WF,
    follow,
    numbers_stages,
    prepare,
    status,
    submit,
    terminal,
    write_spec,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def test_a_first_run_on_a_fresh_cluster_goes_through_to_its_outputs(
    sky_cluster: SkyCluster, tmp_path: Path
) -> None:
    world = sky_cluster
    # No jobs controller yet: SkyPilot's queue answers ClusterNotUpError, which is absence.
    queue = world.sky("jobs", "queue")
    assert "No in-progress managed jobs" in queue.stdout + queue.stderr, (
        "this test must be the session's first launch: " + queue.stdout + queue.stderr
    )
    spec = write_spec(
        tmp_path / "wf" / "numbers.yaml",
        "e2e-numbers",
        world.cluster.images["sky-runtime"],
        numbers_stages(),
    )
    run_id = prepare(world, spec)
    submitted = submit(world, spec, run_id)
    assert submitted.code == 0, submitted.stdout + submitted.stderr
    result = submitted.json()
    tx = result["launch_transaction"]
    assert [r["answer"] for r in tx["reconcile"]] == ["absent"]
    assert tx["outcome"] == "launched" and result["job_id"] == tx["launched_job_id"]
    gates = {g["name"]: g for g in result["gates"]}
    assert gates["namespace"]["status"] == "ok"
    # The unattested runtime image was probed, in the project's namespace, and passed.
    assert gates["images"]["status"] == "ok", gates

    answer, seen = follow(world, run_id, terminal, timeout=900)
    assert answer["state"] == "SUCCEEDED", json.dumps(answer, indent=1)
    assert "RUNNING" in seen or "SUCCEEDED" in seen
    assert [s["state"] for s in answer["stages"].values()] == ["SUCCEEDED", "SUCCEEDED"]

    prefix = f"runs/e2e-numbers/{run_id}/npa-workflow/stages"
    keys = world.store_keys(prefix)
    assert keys[f"{prefix}/generate/outputs/numbers/numbers.txt"] > 0
    total = world.s3.client().get_object(
        Bucket=world.bucket, Key=f"{prefix}/total/outputs/total.txt"
    )
    assert total["Body"].read().decode().strip() == "55"

    logs = world.npa(*WF, "logs", run_id, "--project", world.project, "--stage", "generate")
    assert logs.code == 0 and "generating" in logs.stdout, logs.stdout + logs.stderr
    assert "summing" not in logs.stdout
    artifacts = world.npa(*WF, "artifacts", run_id, "--project", world.project, "--json")
    assert artifacts.code == 0, artifacts.stdout + artifacts.stderr
    listed = world.npa(*WF, "list", "--project", world.project, "--json").json()
    [row] = [r for r in listed["runs"] if r["run_id"] == run_id]
    assert row["recorded_state"] == "SUCCEEDED" and row["job_id"] == result["job_id"]

    # The readiness evidence the launch relied on is in its journal.
    journal = world.npa_home / "operations" / f"launch.{world.project}.{run_id}.jsonl"
    steps = [json.loads(line) for line in journal.read_text().splitlines()]
    readiness = [s for s in steps if s["step"] == "readiness"]
    assert readiness and readiness[0]["status"] == "done"
    assert readiness[0]["readiness"]["stable"] is True

    # The store's credentials reached the pods through the Secret alone: no file npa wrote,
    # no task it rendered and no SkyPilot state holds the secret key.
    for root in (world.npa_home, world.home / ".sky"):
        for path in root.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000:
                assert SECRET_KEY.encode() not in path.read_bytes(), path
    secret = world.cluster.kubectl(
        "get", "secret", "npa-store", "-n", world.namespace, "-o", "json"
    )
    assert secret.returncode == 0, secret.stderr
    assert "AWS_ENDPOINT_URL_S3" in json.loads(secret.stdout)["data"]
    again = status(world, run_id)
    assert again["state"] == "SUCCEEDED" and again["trustworthy"] is True
