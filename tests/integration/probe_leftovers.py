"""Run only by test_no_leftovers.py in a child pytest: uses every service, then fails or hangs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.harness.kube import KubeCluster
from tests.harness.registry import Registry
from tests.harness.s3 import S3Server


def test_use_every_service_then_fail(s3: S3Server, registry: Registry, kube: KubeCluster) -> None:
    record = {
        "pids": [registry.process.pid, kube.etcd.pid, kube.apiserver.pid],
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
        for lock in npa_home.glob("local-jobs/*/supervisor.lock"):
            text = lock.read_text().strip()
            if text.isdigit():
                pids = [int(text), *_children(int(text))]
        time.sleep(0.1)
    assert len(pids) >= 2, "the supervisor never started its stage"
    Path(os.environ["NPA_LEFTOVER_RECORD"]).write_text(json.dumps({"pids": pids, "ports": []}))
    raise AssertionError("deliberate failure: teardown must still stop the supervisor")
