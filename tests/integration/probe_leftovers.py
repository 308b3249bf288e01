"""Run only by test_no_leftovers.py in a child pytest: uses every service, then fails or hangs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.harness.cluster import Cluster
from tests.harness.kube import KubeCluster
from tests.harness.procs import identities
from tests.harness.registry import Registry
from tests.harness.s3 import S3Server


def test_use_every_service_then_fail(s3: S3Server, registry: Registry, kube: KubeCluster) -> None:
    record = {
        "pids": identities([registry.process.pid, kube.etcd.pid, kube.apiserver.pid]),
        "ports": [s3.port, *registry.process.ports, *kube.etcd.ports, *kube.apiserver.ports],
    }
    Path(os.environ["NPA_LEFTOVER_RECORD"]).write_text(json.dumps(record))
    if os.environ.get("NPA_LEFTOVER_MODE") == "hang":
        time.sleep(600)  # the parent kills this pytest while it waits here
    raise AssertionError("deliberate failure: teardown must still stop every service")


BUSYBOX = (
    "docker.io/library/busybox@sha256:"
    + "2919d0172f7524b2d8df9e50066a682669e6d170ac0f6a49676d54358fe970b5"
)
SLEEPY_SPEC = f"""\
apiVersion: npa/v1
kind: Workflow
metadata:
  name: sleepy
tools:
  shell:
    image: {BUSYBOX}
stages:
  - name: wait
    tool: shell
    command: sleep 600 && echo done > "$NPA_OUTPUT_OUT"
    outputs:
      - name: out
        path: out.txt
        kind: file
    resources:
      cpus: 1
      disk_gib: 1
"""


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_start_a_long_local_run_then_fail(npa_home: Path, tmp_path: Path) -> None:
    from tests.harness.cli import run_npa

    workflow = tmp_path / "wf"
    workflow.mkdir()
    spec = workflow / "sleepy.yaml"
    spec.write_text(SLEEPY_SPEC)
    run_id = run_npa("workbench", "workflow", "prepare-run", str(spec), "--project", "p").stdout
    submitted = run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "p",
        "--run-id", run_id.strip(), "--infra", "local", "--runtime", "process",
    )  # fmt: skip
    assert submitted.code == 0, submitted.stdout + submitted.stderr
    deadline = time.monotonic() + 60
    pids: list[int] = []
    while time.monotonic() < deadline and len(pids) < 2:
        for lock in npa_home.glob("local-jobs/*/executor.lock"):
            holder = lock.read_text().split()[:1]  # "pid start" while an executor holds it
            if holder and holder[0].isdigit():
                pids = [int(holder[0]), *_children(int(holder[0]))]
        time.sleep(0.1)
    assert len(pids) >= 2, "the supervisor never started its stage"
    record = {"pids": identities(pids), "ports": []}
    Path(os.environ["NPA_LEFTOVER_RECORD"]).write_text(json.dumps(record))
    raise AssertionError("deliberate failure: teardown must still stop the supervisor")


def test_run_a_pod_on_the_cluster_then_fail(cluster: Cluster) -> None:
    """A pod makes everything teardown must undo: a shim, a network namespace, the pod's
    masquerade chain, mounts, cgroups."""
    name = "leftover-probe"
    started = cluster.kubectl(
        "run", name, "--image", cluster.images["busybox"], "--restart=Never",
        "--command", "--", "sleep", "600",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    waited = cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
    assert waited.returncode == 0, waited.stderr + cluster.kubectl("describe", "pod", name).stdout
    from tests.harness.cluster_host import HostRecord, _shims

    host = HostRecord.load(cluster.workdir)
    pods = cluster.pod_pids()
    assert pods, "the pod's processes are not in the cluster's cgroups"
    record = {
        "pids": identities(
            [p.pid for p in cluster.processes] + _shims(host.containerd_socket) + pods
        ),
        "ports": [port for p in cluster.processes for port in p.ports],
        "cluster": {
            "workdir": host.workdir,
            "bridge": host.bridge,
            "network": host.network,
            "chain": host.chain,
            "cgroup_root": host.cgroup_root,
            "id": host.cluster_id,
        },
    }
    Path(os.environ["NPA_LEFTOVER_RECORD"]).write_text(json.dumps(record))
    if os.environ.get("NPA_LEFTOVER_MODE") == "hang":
        time.sleep(600)  # the parent kills this pytest while it waits here
    raise AssertionError("deliberate failure: teardown must still undo the cluster")
