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
