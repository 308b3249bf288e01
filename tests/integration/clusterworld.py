"""Specs and steps the end-to-end tests on the real cluster share: write a spec for the
cluster's runtime image, reserve and submit a run as a user would, and follow it with
``status`` until something holds."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from npa.backends.phases import ShardPhases
from npa.core.layout import attempts_folder
from tests.harness.cli import CliResult
from tests.harness.skypilot_cluster import SkyCluster
from tests.integration.flagmatrix import Moved

WF = ("workbench", "workflow")
# The stage contract of docs/spec.md: inputs and outputs are local paths on every backend.
GENERATE = 'set -e; echo generating; seq 1 10 > "$NPA_OUTPUT_NUMBERS/numbers.txt"'
TOTAL = (
    "set -e; echo summing; "
    'awk \'{ s += $1 } END { print s }\' "$NPA_INPUT_NUMBERS/numbers.txt" > "$NPA_OUTPUT_TOTAL"'
)


def stage(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tool": "runtime",
        "command": command,
        "resources": {"cpus": 0.5, "memory_gib": 1, "disk_gib": 1},
        **extra,
    }


def numbers_stages() -> list[dict[str, Any]]:
    """Two stages: generate writes 1..10, total sums what generate stored (55)."""
    return [
        stage("generate", GENERATE, outputs=[{"name": "numbers", "path": "numbers/"}]),
        stage(
            "total",
            TOTAL,
            inputs=[{"name": "numbers", "from": "generate.numbers"}],
            outputs=[{"name": "total", "path": "total.txt", "kind": "file"}],
        ),
    ]


def write_spec(
    path: Path, name: str, image: str, stages: list[dict[str, Any]], **tool: Any
) -> Path:
    doc = {
        "apiVersion": "npa/v1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "tools": {"runtime": {"image": image, **tool}},
        "stages": stages,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def prepare(world: SkyCluster, spec: Path) -> str:
    r = world.npa(*WF, "prepare-run", str(spec), "--project", world.project)
    assert r.code == 0, r.stdout + r.stderr
    return r.stdout.strip()


def submit(world: SkyCluster, spec: Path, run_id: str, *extra: str, **env: str) -> CliResult:
    return world.npa(
        *WF, "submit", str(spec), "--project", world.project, "--run-id", run_id,
        "--infra", f"k8s/{world.context}", "--json", *extra, **env,
    )  # fmt: skip


def cancel(world: SkyCluster, run_id: str) -> dict[str, Any]:
    """``cancel`` as the on-call engineer runs it where the cancel is not what a test is about:
    a job still running once SkyPilot's controller had its while (``still_running``, exit 1)
    must say so with the command that tries again, and that command is followed once."""
    argv = (*WF, "cancel", run_id, "--project", world.project, "--json")
    r = world.npa(*argv)
    if r.code == 1 and r.json()["outcome"] == "still_running":
        again = f"npa workbench workflow cancel {run_id} --project {world.project}"
        assert again in r.json()["next"], r.stdout
        r = world.npa(*argv)
    assert r.code == 0, r.stdout + r.stderr
    outcome: dict[str, Any] = r.json()
    return outcome


def status(world: SkyCluster, run_id: str) -> dict[str, Any]:
    # status asks the API server, the queue and the pods; on a loaded 2-core machine one answer
    # took more than 120 s.
    r = world.npa(*WF, "status", run_id, "--project", world.project, "--json", timeout=300)
    assert r.code in (0, 4), r.stdout + r.stderr
    data: dict[str, Any] = r.json()
    return data


def follow(
    world: SkyCluster,
    run_id: str,
    until: Callable[[dict[str, Any]], bool],
    timeout: float = 600,
    interval: float = 12,
) -> tuple[dict[str, Any], list[str]]:
    """``status`` until ``until`` holds; returns the last answer and every state seen.

    Each ``status`` is a process that loads SkyPilot's client and a queue request that runs
    SkyPilot's code in the controller pod: several CPU-seconds. Asked every 3 s, with the
    supervisor polling as often, they kept both of CI's cores busy on their own."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        answer = status(world, run_id)
        if not seen or seen[-1] != answer["state"]:
            seen.append(answer["state"])
        if until(answer):
            return answer, seen
        assert time.monotonic() < deadline, (
            f"run {run_id} never got there; states seen {seen}; last:\n"
            + json.dumps(answer, indent=1)
            + "\n"
            + diagnose(world)
        )
        time.sleep(interval)


def terminal(answer: dict[str, Any]) -> bool:
    """The run is over and its supervisor has recorded its verdict in the manifest. The backend
    says a job ended a few seconds before that (and says CANCELLED for a job the supervisor
    cancelled because the run FAILED), so a test that stopped at the first ended answer would
    read the job's state, not the run's."""
    return answer["state"] in TERMINAL and answer.get("last_known_state") == answer["state"]


TERMINAL = frozenset(
    {
        "SUCCEEDED",
        "CANCELLED",
        "FAILED",
        "FAILED_SETUP",
        "FAILED_PRECHECKS",
        "FAILED_NO_RESOURCE",
        "FAILED_CONTROLLER",
        "FAILED_STARTUP",
        "INFRASTRUCTURE_RECOVERY_EXHAUSTED",
    }
)


def diagnose(world: SkyCluster) -> str:
    """What the cluster and SkyPilot say, for a failure message."""
    pods = world.cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout
    events = world.cluster.kubectl(
        "get", "events", "-n", world.namespace, "--sort-by=.lastTimestamp"
    ).stdout
    queue = world.sky("jobs", "queue", "--all").stdout
    return f"pods:\n{pods}\nevents:\n{events[-4000:]}\nsky jobs queue:\n{queue[-4000:]}"


def launched_tasks(world: SkyCluster, job_id: int) -> dict[str, dict[str, Any]]:
    """Task name -> the task document SkyPilot holds for job ``job_id`` (its queue's
    ``user_yaml``: the text npa launched, as SkyPilot's jobs controller keeps it), read through
    SkyPilot's own client."""
    import subprocess
    import sys

    code = (
        "import json, sky\n"
        f"recs, *_ = sky.get(sky.jobs.queue_v2(refresh=False, all_users=True, job_ids=[{job_id}],"
        " fields=['job_id', 'task_id', 'user_yaml']))\n"
        "print(json.dumps(sorted({r.user_yaml for r in recs if r.user_yaml})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **world.env}, capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    [text] = json.loads(out.stdout.strip().splitlines()[-1])
    docs = [d for d in yaml.safe_load_all(text) if d]
    # The first document names the pipeline; each one after it is a task.
    return {d["name"]: d for d in docs[1:]}


def rendered_tasks(
    world: SkyCluster, spec: Path, run_id: str, out: Path, *flags: str
) -> dict[str, dict[str, Any]]:
    """Task name -> the task document ``render --run-id`` shows for the run with ``flags``:
    what a person reviews before the same submit."""
    r = world.npa(*WF, "render", str(spec), "--run-id", run_id, "--project", world.project,
                  "--infra", f"k8s/{world.context}", "--out", str(out), *flags)  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    docs = [d for path in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text())]
    return {d["name"]: d for d in docs if d}


def phase_records(world: SkyCluster, workflow: str, run_id: str, name: str) -> list[ShardPhases]:
    """The phase records the stage's pods wrote into the run store (the stage library's EXIT
    trap), parsed with the model the report reads, by wave, shard and attempt. An object in the
    attempts folder that looks like a record but is not one fails the caller."""
    folder = attempts_folder(f"runs/{workflow}/{run_id}/npa-workflow", name)
    client = world.s3.client()
    records = []
    for key in world.store_keys(folder):
        if key.endswith(".json"):
            body = client.get_object(Bucket=world.bucket, Key=key)["Body"].read()
            records.append(ShardPhases.model_validate_json(body))
    return sorted(records, key=lambda r: (r.wave, r.shard, r.attempt))


def in_order(record: ShardPhases) -> bool:
    """Each phase the record reached is no earlier than the one before it."""
    marks = [record.started_at, record.inputs_at, record.command_started_at]
    marks += [record.command_ended_at, record.uploaded_at, record.ended_at]
    reached = [m for m in marks if m is not None]
    return reached == sorted(reached)


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def moved_runtime(world: SkyCluster, roles: tuple[str, ...]) -> dict[str, Moved]:
    """For each role, a repository of the cluster's registry whose tag v1 was pushed twice
    (moved once): each push is the cluster's runtime image with one label more in its config,
    its layers shared by a cross-repository mount, so both digests run as the runtime does and
    differ only in that label. Role -> the repository and its old and current digests."""
    import uuid

    import requests

    host, ref = world.cluster.registry, world.cluster.images["sky-runtime"]
    source, digest = ref.removeprefix(f"{host}/").split("@")
    base = f"http://{host}/v2"
    out = {}
    with requests.Session() as http:
        got = http.get(
            f"{base}/{source}/manifests/{digest}", headers={"Accept": OCI_MANIFEST}, timeout=30
        )
        got.raise_for_status()
        manifest = got.json()
        config = http.get(f"{base}/{source}/blobs/{manifest['config']['digest']}", timeout=60)
        config.raise_for_status()
        for role in roles:
            repository = f"npa/flags-{role}-{uuid.uuid4().hex[:8]}"
            for layer in manifest["layers"]:
                mounted = http.post(
                    f"{base}/{repository}/blobs/uploads/",
                    params={"mount": layer["digest"], "from": source},
                    timeout=60,
                )
                assert mounted.status_code == 201, (mounted.status_code, mounted.text)
            old, current = (
                _push_labelled(
                    http, f"{base}/{repository}", manifest, config.json(), f"{role} {age}"
                )
                for age in ("old", "current")
            )
            out[role] = Moved(f"{host}/{repository}", old, current)
    return out


def _push_labelled(
    http: Any, repo_url: str, manifest: dict[str, Any], image_config: dict[str, Any], age: str
) -> str:
    """Push ``manifest`` as tag v1 of ``repo_url`` with the label ``npa.test/age: age`` added
    to its config; returns the digest the registry answers."""
    labels = {**(image_config["config"].get("Labels") or {}), "npa.test/age": age}
    body = json.dumps({**image_config, "config": {**image_config["config"], "Labels": labels}})
    config_digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    start = http.post(f"{repo_url}/blobs/uploads/", timeout=30)
    start.raise_for_status()
    location = start.headers["Location"]
    if location.startswith("/"):
        location = repo_url.split("/v2/")[0] + location
    put = http.put(
        location,
        params={"digest": config_digest},
        data=body.encode(),
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    put.raise_for_status()
    config = {**manifest["config"], "digest": config_digest, "size": len(body.encode())}
    pushed = http.put(
        f"{repo_url}/manifests/v1",
        data=json.dumps({**manifest, "config": config}).encode(),
        headers={"Content-Type": OCI_MANIFEST},
        timeout=30,
    )
    pushed.raise_for_status()
    return str(pushed.headers["Docker-Content-Digest"])
