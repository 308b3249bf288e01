"""skypilot status / verify / bootstrap against real parts: the kube fixture, a real local
SkyPilot API server, and a throwaway venv holding a kubernetes client SkyPilot cannot use."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.kube import KubeCluster
from tests.harness.procs import free_port
from tests.harness.tools import missing

pytestmark = pytest.mark.integration

NS = "npa-demo"


def place_kubeconfig(npa_home: Path, kube: KubeCluster, token: str | None = None) -> Path:
    """Put a kubeconfig where provisioning does; optionally as another identity (token)."""
    target = npa_home / "clusters" / kube.context / "kubeconfig"
    target.parent.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(kube.kubeconfig.read_text())
    if token is not None:
        config["users"][0]["user"] = {"token": token}
    target.write_text(yaml.safe_dump(config))
    return target


def provision_objects(kube: KubeCluster) -> None:
    """What provision-if-absent creates for project demo (namespace, sky-sa, its RBAC)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = kube.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    sa = {"kind": "ServiceAccount", "name": "sky-sa", "namespace": NS}
    cluster_role = f"{NS}-sky-sa-cluster-role"
    calls: list[Any] = [
        lambda: core.create_namespace({"metadata": {"name": NS}}),
        lambda: core.create_namespaced_service_account(NS, {"metadata": {"name": "sky-sa"}}),
        lambda: rbac.create_namespaced_role(NS, {"metadata": {"name": "sky-sa-role"},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        lambda: rbac.create_namespaced_role_binding(NS, {"metadata": {"name": "sky-sa-rb"},
                "subjects": [sa], "roleRef": {"kind": "Role", "name": "sky-sa-role",
                                              "apiGroup": "rbac.authorization.k8s.io"}}),
        lambda: rbac.create_cluster_role({"metadata": {"name": cluster_role},
                "rules": [{"apiGroups": [""], "resources": ["nodes"],
                           "verbs": ["get", "list", "watch"]}]}),
        lambda: rbac.create_cluster_role_binding({"metadata": {"name": f"{cluster_role}-rb"},
                "subjects": [sa], "roleRef": {"kind": "ClusterRole", "name": cluster_role,
                                              "apiGroup": "rbac.authorization.k8s.io"}}),
    ]  # fmt: skip
    for call in calls:
        try:
            call()
        except ApiException as exc:
            if exc.status != 409:  # the session-scoped cluster may already hold them
                raise


def gpu_node(kube: KubeCluster) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        kube.create_node("gpu-1", labels={"nvidia.com/gpu.product": "H100-80GB"}, gpus=8)
    except ApiException as exc:
        if exc.status != 409:
            raise


def checks(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in out["checks"]}


# --- verify ----------------------------------------------------------------------------------
def test_verify_as_admin_sees_gpus_pod_access_and_skypilots_own_check(
    kube: KubeCluster, npa_home: Path
) -> None:
    provision_objects(kube)
    gpu_node(kube)
    place_kubeconfig(npa_home, kube)
    r = run_npa("skypilot", "verify", "--cluster", kube.context, "--project", "demo",
                "--output-format", "json")  # fmt: skip
    out = r.json()
    got = checks(out)
    assert got["kube context"]["verdict"] == "ok"
    assert got["identity"]["answer"] == "npa-test-admin"
    assert got["nodes"]["verdict"] == "ok"
    assert (
        got["GPUs"]["verdict"] == "ok"
        and "nvidia.com/gpu.product=H100-80GB" in (got["GPUs"]["detail"])
    )
    assert got[f"pods in {NS}"]["answer"] == "allowed: create pods, delete pods"
    sky = got["sky check"]
    # SkyPilot's own check agrees only where its port-forward helpers exist (bootstrap-tools
    # installs them; without them SkyPilot disables Kubernetes and npa reports that answer).
    if not (shutil.which("socat") and shutil.which("nc")):
        missing("socat and nc")
    assert sky["verdict"] == "ok" and sky["answer"] == "enabled (agrees)", sky
    assert r.code == 0
    text = run_npa("skypilot", "verify", "--cluster", kube.context, "--project", "demo")
    assert text.stdout.splitlines()[0] == f"can SkyPilot use cluster {kube.context}?"


def test_verify_as_a_restricted_service_account_is_denied_by_review(
    kube: KubeCluster, npa_home: Path
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    provision_objects(kube)
    core = kube.core()
    try:
        core.create_namespaced_service_account(NS, {"metadata": {"name": "limited"}})
    except ApiException as exc:
        assert exc.status == 409
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    token = core.create_namespaced_service_account_token("limited", NS, request).status.token
    place_kubeconfig(npa_home, kube, token=token)
    pods_before = len(core.list_namespaced_pod(NS).items)
    r = run_npa("skypilot", "verify", "--cluster", kube.context, "--project", "demo", "--json")
    assert r.code == 1, r.stdout + r.stderr
    got = checks(r.json())
    assert got["identity"]["answer"] == f"system:serviceaccount:{NS}:limited"
    assert got[f"pods in {NS}"]["verdict"] == "failed"
    assert got[f"pods in {NS}"]["answer"] == "denied: create pods, delete pods"
    assert "provision-if-absent --project demo" in got[f"pods in {NS}"]["fix"]
    assert got["nodes"]["verdict"] == "failed" and "403" in got["nodes"]["detail"]
    assert len(core.list_namespaced_pod(NS).items) == pods_before  # no pod was made to find out
    assert token not in r.stdout and token not in r.stderr


def test_verify_without_a_placed_kubeconfig_names_the_provision_command(npa_home: Path) -> None:
    r = run_npa("skypilot", "verify", "--cluster", "ghost", "--output-format", "json")
    assert r.code == 1
    (only,) = r.json()["checks"]
    assert only["answer"] == "no kubeconfig"
    assert only["fix"] == "npa provision-if-absent --target kubernetes --context ghost"


# --- status ----------------------------------------------------------------------------------
def test_status_with_a_real_api_server_and_provisioned_cluster(
    kube: KubeCluster, npa_home: Path, sky_server: dict[str, str]
) -> None:
    provision_objects(kube)
    place_kubeconfig(npa_home, kube)
    env = {**sky_server, "NPA_HOME": str(npa_home)}
    r = run_npa("skypilot", "status", "--project", "demo", "--context", kube.context, "--json",
                env=env, timeout=240)  # fmt: skip
    out = r.json()
    got = checks(out)
    assert got["api server"]["verdict"] == "ok" and got["api server"]["answer"] == "healthy 0.14.1"
    # A fresh server has never launched a managed job: SkyPilot says so authoritatively.
    assert got["jobs controller"]["answer"] == "absent"
    assert got["jobs controller"]["verdict"] == "ok"
    assert got["readyz"]["answer"] == "200"
    assert got["identity"]["answer"] == "npa-test-admin"
    for name in (f"namespace {NS}", "service account sky-sa", "role binding sky-sa-rb"):
        assert got[name]["answer"] == "present", got[name]
    assert got["RBAC of sky-sa"]["answer"] == ("allowed: create pods, delete pods, list nodes")
    assert got["kubernetes client"]["answer"] == "kubernetes 35.0.0"
    assert r.code == 0, r.stdout


def test_status_without_server_or_namespace_says_which_is_which(
    kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> None:
    place_kubeconfig(npa_home, kube)
    env = {"HOME": str(tmp_path), "SKYPILOT_API_SERVER_LOCAL_PORT": str(free_port())}
    r = run_npa("skypilot", "status", "--project", "nowhere", "--context", kube.context,
                "--json", env=env)  # fmt: skip
    assert r.code == 1
    got = checks(r.json())
    assert got["api server"]["answer"] == "not running"
    assert got["api server"]["fix"].endswith("sky api start")
    # Without a server nobody can say whether a controller exists: unknown, not absent.
    assert got["jobs controller"]["verdict"] == "unknown"
    assert got["namespace npa-nowhere"]["answer"] == "absent"
    assert "provision-if-absent --project nowhere" in got["namespace npa-nowhere"]["fix"]
    assert got["RBAC of sky-sa"]["verdict"] == "failed"  # the account does not exist


# --- bootstrap -------------------------------------------------------------------------------
@pytest.fixture
def wrong_client_venv(tmp_path: Path) -> Path:
    """A venv seeing npa's SkyPilot but holding its own kubernetes client 36+ in front of it."""
    venv = tmp_path / "sky-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    parent = next(p for p in sys.path if p.endswith("site-packages") and "sky-venv" not in p)
    (site / "zz-npa-parent.pth").write_text(parent + "\n")  # after the venv's own packages
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "kubernetes>=36,<38"], check=True, timeout=600)  # fmt: skip
    return venv


def test_bootstrap_detects_and_repairs_a_wrong_client_idempotently(wrong_client_venv: Path) -> None:
    venv = str(wrong_client_venv)
    found = run_npa("skypilot", "bootstrap", "--venv", venv, "--json", timeout=300)
    assert found.code == 1, found.stdout + found.stderr
    out = found.json()
    assert out["changed"] == [] and out["after"]["verdict"] == "failed"
    assert (
        out["after"]["answer"].startswith("kubernetes 3")
        and "List[V1Container]" in (out["after"]["detail"])
    )  # SkyPilot's own pod_config validation, run inside that venv, is what fails
    assert out["after"]["fix"] == f"npa skypilot bootstrap --venv {venv} --repair"

    repaired = run_npa("skypilot", "bootstrap", "--venv", venv, "--repair", "--json", timeout=600)
    assert repaired.code == 0, repaired.stdout + repaired.stderr
    out = repaired.json()
    assert len(out["changed"]) == 1 and "kubernetes==35.0.0" in out["changed"][0]
    assert out["after"]["answer"] == "kubernetes 35.0.0"
    assert out["after"]["facts"]["pod_config_validation"] is True

    again = run_npa("skypilot", "bootstrap", "--venv", venv, "--repair", timeout=300)
    assert again.code == 0 and "nothing to change" in again.stdout
