"""Kube contexts as platform engineers have them, against the harness kube-apiserver: an EKS
ARN as the context name, and a KUBECONFIG list that kubectl merges (the context in one file,
its cluster and user in another)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa
from tests.harness.kube import KubeCluster
from tests.harness.tools import require_tool
from tests.integration.kubeconfigs import EKS, split_kubeconfig
from tests.integration.test_skypilot_health import gpu_node

pytestmark = pytest.mark.integration


def test_kubectl_itself_reads_the_list(kube: KubeCluster, tmp_path: Path) -> None:
    kubectl = require_tool("NPA_KUBECTL_BIN", "kubectl")
    listed = split_kubeconfig(kube, tmp_path / "kube")
    out = subprocess.run(
        [str(kubectl), "--context", EKS, "get", "--raw", "/readyz"],
        env={**os.environ, "KUBECONFIG": listed},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_gpus_and_verify_honour_a_kubeconfig_list_with_an_arn_context(
    kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> None:
    gpu_node(kube)  # gpu-1 with 8 H100s
    listed = split_kubeconfig(kube, tmp_path / "kube")
    env = {"KUBECONFIG": listed}
    gpus = run_npa("workbench", "workflow", "gpus", "--cluster", EKS, "--json", env=env)
    assert gpus.code == 0, gpus.stdout + gpus.stderr
    body: dict[str, Any] = gpus.json()
    assert body["kubeconfig"] == f"{listed} ($KUBECONFIG)"
    assert any(n["node"] == "gpu-1" and n["allocatable"] == 8 for n in body["nodes"])

    verify = run_npa("skypilot", "verify", "--cluster", EKS, "--json", env=env)
    checks = {c["name"]: c for c in verify.json()["checks"]}
    assert checks["kube context"]["verdict"] == "ok", checks["kube context"]
    assert "($KUBECONFIG)" in checks["kube context"]["detail"]
    assert checks["identity"]["answer"] == "npa-test-admin"
    assert checks["nodes"]["verdict"] == "ok"
    # Nothing was placed: reading a context never writes under NPA_HOME.
    assert not (npa_home / "clusters").exists()


def test_a_context_missing_from_the_list_names_the_real_choices(
    kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> None:
    listed = split_kubeconfig(kube, tmp_path / "kube")
    dev = "arn:aws:eks:us-east-1:123456789012:cluster/gpu-dev"
    out = run_npa(
        "workbench", "workflow", "gpus", "--cluster", dev, "--json", env={"KUBECONFIG": listed}
    )
    assert out.code == 3
    error = out.json()["error"]
    assert "no kubeconfig defines context" in error["message"]
    assert error["fix"] == f"npa provision-if-absent --target kubernetes --context {dev}"
