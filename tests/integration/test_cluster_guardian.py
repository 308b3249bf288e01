"""The test cluster's guardian undoes its host changes even when the cluster's work directory,
where its record lives, is gone by the time it undoes them (another pytest session's cleanup of
numbered tmp folders removes a session's folder once that session has exited)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cluster_host import SHARED, HostRecord, postrouting_chain, run
from tests.harness.tools import missing
from tests.integration.leftovers import ROOT

pytestmark = pytest.mark.integration


def test_the_guardian_undoes_a_cluster_whose_work_directory_is_gone(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing("root (the guardian undoes a bridge and nat chains)")  # a failure under CI
    cluster_id = secrets.token_hex(3)
    work = tmp_path / "cluster"
    work.mkdir()
    record = HostRecord(
        cluster_id=cluster_id,
        workdir=str(work),
        bridge=f"npabr{cluster_id}",
        subnet="10.254.254.0/24",
        gateway="10.254.254.1",
        network=f"npa-{cluster_id}",
        chain=f"NPA-{cluster_id.upper()}",
        cgroup_root=f"/npa-{cluster_id}",
        containerd_socket=str(SHARED / cluster_id / "containerd.sock"),
    )
    record.save()
    guardian = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.cluster_host", str(work)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    chains = (record.chain, postrouting_chain(record))
    try:
        assert guardian.stdout is not None and guardian.stdout.readline().strip() == b"joined"
        # What a cluster changes on the host after its guardian has joined.
        record.did("bridge")
        run("ip", "link", "add", record.bridge, "type", "bridge", check=True)
        record.did("iptables")
        for chain in chains:
            run("iptables", "-w", "-t", "nat", "-N", chain, check=True)
        run("iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", record.subnet, "-j",
            chains[1], check=True)  # fmt: skip
        shutil.rmtree(work)
        _, err = guardian.communicate(timeout=120)  # stdin closed: the guardian undoes
        assert guardian.returncode == 0, err.decode(errors="replace")
    finally:
        if guardian.poll() is None:
            guardian.kill()
        # Whatever the guardian left, the test does not leave it on the machine.
        left_bridge = run("ip", "link", "show", record.bridge).returncode == 0
        nat = run("iptables", "-w", "-t", "nat", "-S").stdout
        run("iptables", "-w", "-t", "nat", "-D", "POSTROUTING", "-s", record.subnet, "-j",
            chains[1])  # fmt: skip
        for chain in chains:
            run("iptables", "-w", "-t", "nat", "-X", chain)
        run("ip", "link", "del", record.bridge)
    assert not left_bridge, f"the guardian left bridge {record.bridge}"
    assert record.chain not in nat, nat
