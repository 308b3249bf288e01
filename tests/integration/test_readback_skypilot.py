"""Reading SkyPilot runs back: moto's S3 behind a proxy (counting, refusing writes or failing),
the kube fixture's pods and nodes, and the managed-jobs double at the SkyPilot boundary."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.managed_jobs import read_state, write_state
from tests.harness.kube import KubeCluster
from tests.harness.procs import free_port
from tests.harness.s3 import S3Server
from tests.integration.skypilot_world import make_world, run_npa
from tests.integration.store_proxy import ProxyState, store_proxy
from tests.integration.supervisors import stop_all, wait_alive

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUCKET = "npa-readback"
WF = ("workbench", "workflow")


@pytest.fixture
def world(
    s3: S3Server, kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    # npa reaches the store through a proxy that counts requests and can refuse writes.
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_MAX_ATTEMPTS": "1"}
        w = make_world(s3, kube, npa_home, tmp_path, bucket=BUCKET, env=env)
        yield {**w, "proxy": proxy}


def submit(w: dict[str, Any]) -> Any:
    r = run_npa(*WF, "submit", str(w["spec"]), "--project", "team", "--run-id", w["run_id"],
                "--infra", f"k8s/{w['kube'].context}", "--no-preflight-images", "--json",
                env=w["env"])  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    return r.json()


def status(w: dict[str, Any], run: str | None = None, *extra: str) -> Any:
    return run_npa(*WF, "status", run or w["run_id"], "--project", "team", "--json", *extra,
                   env=w["env"])  # fmt: skip


def script(w: dict[str, Any], **changes: Any) -> None:
    state = read_state(w["state"])
    state.update(changes)
    write_state(w["state"], state)


def job_pod(kube: KubeCluster, job_id: int, image: str, task: str) -> str:
    """Create the pod SkyPilot would create for the managed job's task named ``task``; the test
    then plays kubelet and scheduler."""
    from kubernetes import client
    from sky.jobs.utils import generate_managed_job_cluster_name

    cluster = generate_managed_job_cluster_name(task, job_id)
    name = f"{cluster}-head-{uuid.uuid4().hex[:5]}"
    kube.core().create_namespaced_pod(
        "default",
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={"skypilot-cluster-name": f"{cluster}-2ea4"},
                annotations={"skypilot-cluster-name": cluster},
            ),
            spec=client.V1PodSpec(containers=[client.V1Container(name="ray-node", image=image)]),
        ),
    )
    return name


def delete_pod(kube: KubeCluster, name: str) -> None:
    kube.core().delete_namespaced_pod(name, "default", grace_period_seconds=0,
                                      propagation_policy="Background")  # fmt: skip


def test_pending_reports_the_pod_level_reason_and_the_next_command(world: dict[str, Any]) -> None:
    out = submit(world)
    r = status(world)
    assert r.code == 0, r.stdout + r.stderr
    body = r.json()
    assert body["state"] == "PENDING" and body["job_id"] == out["job_id"]
    assert body["pending"] == []  # no pod yet: nothing to report, and nothing invented
    kube = world["kube"]
    image = "registry.example/private/curate@sha256:" + "0" * 64
    first = f"npa-{world['run_id']}-generate-w0"  # the task npa named for the first wave
    pod = job_pod(kube, out["job_id"], image, first)
    try:
        kube.set_pod_status("default", pod, waiting_reason="ImagePullBackOff",
                            waiting_message="pull access denied: 403 Forbidden")  # fmt: skip
        body = status(world).json()
        assert body["state"] == "PENDING"
        (reason,) = body["pending"]
        assert reason["reason"] == "ImagePullBackOff" and reason["image"] == image
        assert "403" in reason["message"]
        assert any("preflight-images" in n for n in body["next"])
        # The pod's reason reads as the run watcher reads it: the registry's refusal is
        # configuration (npa.core.faults.classify_pull_failure).
        text = run_npa(*WF, "status", world["run_id"], "--project", "team", env=world["env"])
        assert "[actionable_configuration: the registry refuses" in text.stdout, text.stdout
        delete_pod(kube, pod)
        pod = job_pod(kube, out["job_id"], image, first)
        kube.set_pod_status("default", pod, phase="Pending", unschedulable_message=(
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."))  # fmt: skip
        body = status(world).json()
        (reason,) = body["pending"]
        assert reason["reason"] == "Unschedulable" and "Insufficient" in reason["message"]
        assert any(f"gpus --context {kube.context}" in n for n in body["next"])
        text = run_npa(*WF, "status", world["run_id"], "--project", "team", env=world["env"])
        assert "Unschedulable" in text.stdout and "kubernetes-pods: found" in text.stdout
    finally:
        delete_pod(kube, pod)
    # Another job's pod (same task name, other id) is never taken for this one's.
    other = job_pod(kube, out["job_id"] + 100, image, first)
    try:
        kube.set_pod_status("default", other, waiting_reason="ErrImagePull")
        assert status(world).json()["pending"] == []
    finally:
        delete_pod(kube, other)


def test_controller_unavailable_is_never_not_found(world: dict[str, Any]) -> None:
    submit(world)
    script(world, queue_error="ClusterNotUpError")
    r = status(world)
    assert r.code == 4, r.stdout + r.stderr
    body = r.json()
    assert body["state"] == "VERIFICATION_UNAVAILABLE" and body["trustworthy"] is False
    job = next(s for s in body["sources"] if s["source"] == "backend-job")
    assert job["answer"] == "unavailable" and "ClusterNotUpError" in job["error"]
    assert any(n.endswith("--cached") for n in body["next"])
    # --cached still answers, marked as such, and never asks the controller.
    cached = status(world, None, "--cached").json()
    assert cached["state"] == "CACHED" and cached["last_known_state"] == "PENDING"
    # cancel cannot verify either: exit 4, and nothing was cancelled.
    r = run_npa(*WF, "cancel", world["run_id"], "--project", "team", "--json", env=world["env"])
    assert r.code == 4, r.stdout
    assert read_state(world["state"])["jobs"][0]["status"] == "PENDING"


def test_cancel_by_id_then_repeat(world: dict[str, Any]) -> None:
    out = submit(world)
    argv = (*WF, "cancel", world["run_id"], "--project", "team", "--json")
    r = run_npa(*argv, env=world["env"])
    assert r.code == 0 and r.json()["outcome"] == "cancelled", r.stdout
    assert r.json()["job_id"] == out["job_id"]
    again = run_npa(*argv, env=world["env"])
    assert again.code == 0 and again.json()["outcome"] == "already_final"
    # The run's CANCELLED is npa's verdict, which the supervisor records at its next poll: the
    # watch ends on it (a plain status right now may still show the job's end beside PENDING).
    watched = status(world, None, "--watch", "--interval", "0.5")
    assert watched.code == 1, watched.stdout + watched.stderr  # a watch ends 1 on CANCELLED
    assert json.loads(watched.stdout.splitlines()[-1])["state"] == "CANCELLED"


def test_a_cancel_the_controller_has_not_acted_on_yet_is_cancelling(
    world: dict[str, Any],
) -> None:
    """SkyPilot records a cancel (its details column names the request) before its controller
    changes the job's status: that is the backend's acknowledgement, not a job running on."""
    script(world, outcomes=["RUNNING"], cancel_mode="requested")
    submit(world)
    r = run_npa(*WF, "cancel", world["run_id"], "--project", "team", "--json", env=world["env"])
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["outcome"] == "cancelling" and r.json()["job_state"] == "CANCELLING"
    assert status(world).json()["job_state"] == "CANCELLING"


def test_a_cancel_the_backend_never_acts_on_is_still_running(world: dict[str, Any]) -> None:
    script(world, outcomes=["RUNNING"], cancel_mode="ignored")
    submit(world)
    started = time.monotonic()
    r = run_npa(*WF, "cancel", world["run_id"], "--project", "team", "--json",
                env={**world["env"], "NPA_CANCEL_SETTLE_SECONDS": "2"})  # fmt: skip
    waited = time.monotonic() - started
    assert r.code == 1, r.stdout + r.stderr
    assert r.json()["outcome"] == "still_running" and r.json()["job_state"] == "RUNNING"
    assert waited >= 2  # it gave the backend the settle time before saying so
    assert any(n.endswith("--project team") and " cancel " in n for n in r.json()["next"])


@pytest.mark.parametrize("failure", ["server-error", "hang-up", "closed-port"])
def test_store_unavailable_is_never_not_found(world: dict[str, Any], failure: str) -> None:
    submit(world)
    env = dict(world["env"])
    if failure == "server-error":
        world["proxy"].fail_everything = True
    elif failure == "hang-up":
        world["proxy"].drop_connections = True
    else:
        # A shell whose project points at a closed port (the receipt pins the run's endpoint,
        # so only a run without a receipt is affected).
        env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{free_port()}"
    unknown = "20250101-000000-abcdef"  # no receipt, no reservation: only the store could tell
    for run in (world["run_id"], unknown) if failure != "closed-port" else (unknown,):
        r = run_npa(*WF, "status", run, "--project", "team", "--json", env=env)
        assert r.code == 4, r.stdout + r.stderr
        body = r.json()
        assert body["state"] == "VERIFICATION_UNAVAILABLE", body
        assert any(s["answer"] == "unavailable" for s in body["sources"])
    r = run_npa(*WF, "list", "--project", "team", "--json", env=env)
    assert r.code == 4 and r.json()["error"]["kind"] == "store_unavailable"
    if failure != "closed-port":
        r = run_npa(*WF, "artifacts", world["run_id"], "--project", "team", "--json", env=env)
        assert r.code == 4, r.stdout
        r = run_npa(*WF, "logs", world["run_id"], "--project", "team", "--stage", "total",
                    "--cached", "--json", env=env)  # fmt: skip
        assert r.code == 4 and r.json()["empty_means"].startswith("unread"), r.stdout
    # The same unknown run with the store answering: NOT_FOUND, every source authoritative.
    world["proxy"].fail_everything = world["proxy"].drop_connections = False
    r = run_npa(*WF, "status", unknown, "--project", "team", "--json", env=world["env"])
    assert r.code == 3 and r.json()["state"] == "NOT_FOUND"


def _fingerprint(root: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, digest)
    return out


def test_read_commands_are_read_only(world: dict[str, Any], tmp_path: Path) -> None:
    submit(world)
    # The run's watcher mirrors the job into the manifest (a write npa means to make); stop it
    # so that every write the proxy sees from here on would be a read command's.
    assert wait_alive(world["home"], "team", world["run_id"]), "the run's watcher never started"
    stop_all(world["home"])
    snapshot = tmp_path / "snapshot" / ".npa"
    shutil.copytree(world["home"], snapshot, symlinks=True)
    for p in [snapshot, *snapshot.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~0o222)
    before = _fingerprint(snapshot)
    proxy: ProxyState = world["proxy"]
    proxy.refuse_writes = True
    proxy.writes.clear()
    env = {**world["env"], "NPA_HOME": str(snapshot), "HOME": str(snapshot.parent)}
    run = world["run_id"]
    commands = [
        (*WF, "status", run, "--project", "team", "--json"),
        (*WF, "status", run, "--project", "team", "--cached", "--json"),
        (*WF, "list", "--project", "team", "--json"),
        (*WF, "artifacts", run, "--project", "team", "--json"),
        (*WF, "logs", run, "--project", "team", "--stage", "total", "--json"),
        (*WF, "logs", run, "--project", "team", "--stage", "total", "--cached", "--json"),
        (*WF, "gpus", "--cluster", world["kube"].context, "--json"),
    ]
    for argv in commands:
        r = run_npa(*argv, env=env)
        assert r.code in (0, 1), (argv, r.stdout, r.stderr)  # artifacts: outputs missing = 1
    # The one write a reader may try: list completing the project's run index (npa/runs/index.py;
    # refused here, which list reports in a note and survives).
    assert all("/.npa-index/team/" in w for w in proxy.writes), proxy.writes
    assert _fingerprint(snapshot) == before


def test_gpus_per_node_and_which_stages_fit(world: dict[str, Any], tmp_path: Path) -> None:
    kube = world["kube"]
    tag = uuid.uuid4().hex[:6]
    label = f"NVIDIA-Z{tag}-80GB"
    for n in (1, 2):
        kube.create_node(f"gpu-{tag}-{n}", labels={"nvidia.com/gpu.product": label}, gpus=1)
    spec = tmp_path / "gpu.yaml"
    spec.write_text(
        (EXAMPLES / "tiny-local.yaml")
        .read_text()
        .replace(
            "stages:\n", f"infrastructure:\n  gpu_nodes:\n    accelerators: Z{tag}:2\nstages:\n", 1
        )
        .replace(
            "      cpus: 1\n      disk_gib: 1\n  - name: square",
            f"      cpus: 1\n      disk_gib: 1\n      accelerators: Z{tag}:1\n  - name: square",
        )
        .replace(
            "      disk_gib: 1\n    waves:",
            f"      disk_gib: 1\n      accelerators: Z{tag}:2\n    waves:",
        )
    )
    argv = (*WF, "gpus", "--cluster", kube.context, "--json")
    try:
        _check_gpus(world, argv, spec, tag, label)
    finally:
        for n in (1, 2):
            kube.core().delete_node(f"gpu-{tag}-{n}", grace_period_seconds=0)


def _check_gpus(
    world: dict[str, Any], argv: tuple[str, ...], spec: Path, tag: str, label: str
) -> None:
    r = run_npa(*argv, env=world["env"])
    assert r.code == 0, r.stdout + r.stderr
    rows = {n["node"]: n for n in r.json()["nodes"]}
    assert rows[f"gpu-{tag}-1"]["gpu_label"] == label
    assert rows[f"gpu-{tag}-1"]["allocatable"] == 1 and rows[f"gpu-{tag}-1"]["requestable"] == 1
    r = run_npa(*argv, "--spec", str(spec), env=world["env"])
    assert r.code == 1, r.stdout  # a stage that can never fit
    body = r.json()
    assert body["remap"] == {f"Z{tag}": label}
    fits = {s["stage"]: s for s in body["stages"]}
    assert fits["generate"]["fits"] and fits["generate"]["resolved"] == label
    assert not fits["square"]["fits"] and "one node" in fits["square"]["detail"]


def test_resume_of_a_failed_managed_job_launches_one_new_job_by_its_own_name(
    world: dict[str, Any],
) -> None:
    first = submit(world)
    argv = (*WF, "submit", str(world["spec"]), "--project", "team", "--resume-run",
            world["run_id"], "--infra", f"k8s/{world['kube'].context}", "--no-preflight-images",
            "--json")  # fmt: skip
    # While the job is live, a resume adopts it: nothing new is launched.
    r = run_npa(*argv, env=world["env"])
    assert r.code == 0 and r.json()["outcome"] == "adopted", r.stdout + r.stderr
    # The run's watcher would relaunch a FAILED_NO_RESOURCE job itself (attempt "-a1"), racing
    # the resume below; this test is about the resume, so the watcher is stopped first, as if it
    # had died. Wait for it to hold its lock, or it could start after the kill.
    assert wait_alive(world["home"], "team", world["run_id"]), "the run's watcher never started"
    stop_all(world["home"])
    state = read_state(world["state"])
    state["jobs"][0]["status"] = "FAILED_NO_RESOURCE"
    write_state(world["state"], state)
    # The job ended, but no supervisor judged it: the run keeps npa's record, the job's end beside.
    ended = status(world).json()
    assert (ended["state"], ended["job_state"]) == ("PENDING", "FAILED_NO_RESOURCE"), ended
    assert ended["verdict_pending"] and ended["supervised"] is False
    r = run_npa(*argv, env=world["env"])
    assert r.code == 0, r.stdout + r.stderr
    resumed = r.json()
    assert resumed["outcome"] == "launched" and resumed["job_id"] != first["job_id"]
    assert resumed["job_name"] == first["job_name"] + "-r1"
    assert resumed["resume"]["previous_state"] == "FAILED_NO_RESOURCE"
    again = run_npa(*argv, env=world["env"])
    assert again.json()["outcome"] == "adopted" and again.json()["job_id"] == resumed["job_id"]
    jobs = read_state(world["state"])["jobs"]
    assert [j["job_name"] for j in jobs] == [first["job_name"], resumed["job_name"]]
    body = status(world).json()
    assert body["state"] == "PENDING" and body["job_id"] == resumed["job_id"]
