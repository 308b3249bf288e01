"""provision-if-absent and teardown through the real CLI, the real pulumi CLI and a file://
backend; the kubernetes target against a real kube-apiserver."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import CliResult, run_npa
from tests.harness.kube import KubeCluster
from tests.harness.pulumi import PulumiBackend
from tests.harness.tools import missing

pytestmark = pytest.mark.integration

K8S_PLUGIN = "resource-kubernetes-v4.25.0-alpha.1768448096"


def _journal(root: Path, operation: str) -> list[dict[str, Any]]:
    path = root / "operations" / f"{operation}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _timed(*args: str, timeout: float = 300) -> tuple[CliResult, float]:
    started = time.monotonic()
    result = run_npa(*args, timeout=timeout)
    return result, time.monotonic() - started


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_local_target_lifecycle(npa_home: Path, pulumi_backend: PulumiBackend) -> None:
    args = ("provision-if-absent", "--project", "demo", "--target", "local")
    preview, _ = _timed(*args, "--preview", "--json")
    assert preview.code == 0, preview.stderr
    body = preview.json()
    assert body["mode"] == "preview"
    assert body["quota"]["verdict"] == "ok"
    [stack] = body["stacks"]
    assert stack["stack"] == "demo.local"
    assert sorted((c["op"], c["name"]) for c in stack["preview"]) == [
        ("create", "executor-state"),
        ("create", "store"),
    ]
    store = next(c for c in stack["preview"] if c["name"] == "store")
    assert store["properties"] == [
        {"path": "path", "kind": "add", "old": None, "new": str(npa_home / "store")}
    ]
    assert not npa_home.exists(), "--preview wrote under NPA_HOME"

    # Without a terminal and without --yes nothing is applied.
    declined = run_npa(*args)
    assert declined.code == 1
    assert "rerun with --yes" in declined.stdout
    assert not (npa_home / "store").exists()

    cold, cold_seconds = _timed(*args, "--yes")
    assert cold.code == 0, cold.stderr
    assert "applied" in cold.stdout and "2 created" in cold.stdout
    assert stat.S_IMODE((npa_home / "store").stat().st_mode) == 0o700
    assert (npa_home / "local-jobs").is_dir()

    warm, warm_seconds = _timed(*args, "--yes", "--json")
    assert warm.code == 0, warm.stderr
    assert warm.json()["mode"] == "no-changes"
    assert warm.json()["stacks"][0]["preview_summary"] == {"same": 2}
    print(f"\nlocal provision-if-absent --yes: cold {cold_seconds:.2f}s, warm {warm_seconds:.2f}s")

    # Something removed by hand is found missing and created again.
    (npa_home / "local-jobs").rmdir()
    repair = run_npa(*args, "--yes", "--json")
    assert repair.code == 0, repair.stderr
    assert [c["name"] for c in repair.json()["stacks"][0]["preview"] if c["op"] == "create"] == [
        "executor-state"
    ]
    assert (npa_home / "local-jobs").is_dir()

    # The plain pulumi CLI sees the stack in the same backend.
    listing = subprocess.run(
        [str(pulumi_backend.pulumi_bin), "stack", "ls", "--all", "--json"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PULUMI_BACKEND_URL": f"file://{npa_home / 'pulumi'}",
            "PULUMI_CONFIG_PASSPHRASE": "",
        },
        cwd=npa_home,
        check=True,
    )
    assert [s["name"] for s in json.loads(listing.stdout)] == ["organization/npa/demo.local"]

    # Teardown: preview first (read-only), then destroy; data directories are kept if not empty.
    (npa_home / "store" / "keep.txt").write_text("run data")
    tear_preview = run_npa("teardown", "--project", "demo", "--target", "local", "--preview")
    assert tear_preview.code == 0 and "2 to delete" in tear_preview.stdout
    torn = run_npa("teardown", "--project", "demo", "--target", "local", "--yes", "--json")
    assert torn.code == 0, torn.stderr
    assert torn.json()["mode"] == "destroyed"
    assert not (npa_home / "local-jobs").exists()
    assert (npa_home / "store" / "keep.txt").read_text() == "run data"
    assert not (npa_home / "pulumi" / ".pulumi" / "stacks" / "npa" / "demo.local.json").exists()
    again = run_npa("teardown", "--project", "demo", "--target", "local", "--yes", "--json")
    assert again.json()["mode"] == "nothing"


def test_local_target_resumes_after_sigkill_during_up(
    npa_home: Path, pulumi_backend: PulumiBackend
) -> None:
    args = ["provision-if-absent", "--project", "crash", "--target", "local", "--yes"]
    lock_dir = npa_home / "pulumi" / ".pulumi" / "locks" / "organization" / "npa" / "crash.local"
    proc = subprocess.Popen(
        [sys.executable, "-m", "npa", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    killed = False
    while time.monotonic() < deadline and proc.poll() is None:
        started = any(
            r["step"] == "up:crash.local" and r["status"] == "started"
            for r in _journal(npa_home, "provision.crash.local")
        )
        if started and lock_dir.is_dir() and any(lock_dir.glob("*.json")):
            # The whole process group, as a crash or a closed laptop would: npa, pulumi and
            # the providers all stop at once.
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.02)
    proc.communicate(timeout=30)
    assert killed, "the run finished before it could be interrupted"
    assert any(lock_dir.glob("*.json")), "the killed run should have left its lock behind"

    resumed = run_npa(*args, "--json")
    assert resumed.code == 0, resumed.stderr
    body = resumed.json()
    assert body["mode"] in ("applied", "no-changes")
    assert any("stale lock" in r for r in body["stacks"][0]["recovery"])
    assert body["resume"] == "npa provision-if-absent --project crash --target local --yes"
    assert (npa_home / "store").is_dir() and (npa_home / "local-jobs").is_dir()
    assert not any(lock_dir.glob("*.json"))

    after = run_npa(*args, "--json")
    assert after.json()["mode"] == "no-changes"
    steps = [(r["step"], r["status"]) for r in _journal(npa_home, "provision.crash.local")]
    assert ("recover:crash.local", "done") in steps
    # Every record of the operation carries the same resume command.
    resumes = {r["resume"] for r in _journal(npa_home, "provision.crash.local") if "resume" in r}
    assert resumes == {body["resume"]}


def test_nebius_quota_gate_blocks_before_any_stack(
    npa_home: Path, pulumi_backend: PulumiBackend, tmp_path: Path
) -> None:
    gib = 2**30
    quota = tmp_path / "quota.yaml"
    quota.write_text(
        "source: console export\n"
        "region: eu-north1\n"  # where the nebius target builds by default
        "quotas:\n"
        f"  compute.disk.size.network-ssd: {{limit: {1000 * gib}, usage: {979 * gib}}}\n"
        "  compute.disk.count: {limit: 32, usage: 3}\n"
    )
    result = run_npa(
        "provision-if-absent",
        "--project",
        "big",
        "--target",
        "nebius",
        "--quota-file",
        str(quota),
        "--backend-url",
        pulumi_backend.url,
        "--yes",
    )
    assert result.code == 1, result.stdout + result.stderr
    text = result.stdout
    assert "quota gate: blocked" in text
    assert f"required 1,251 GiB ({1251 * gib:,} bytes)" in text
    assert f"available 21 GiB ({21 * gib:,} bytes)" in text
    assert f"shortfall 1,230 GiB ({1230 * gib:,} bytes)" in text
    assert "nothing was created or changed" in text
    assert not (pulumi_backend.state_dir / ".pulumi" / "stacks").exists()

    unknown = run_npa(
        "provision-if-absent", "--project", "big", "--target", "nebius", "--yes", "--json"
    )
    assert unknown.code == 4
    assert unknown.json()["quota"]["verdict"] == "blocked-unknown"

    # The same figures read for another region are no evidence for this one.
    quota.write_text(quota.read_text().replace("region: eu-north1", "region: eu-west1"))
    elsewhere = run_npa("provision-if-absent", "--project", "big", "--target", "nebius",
                        "--quota-file", str(quota), "--yes", "--json")  # fmt: skip
    assert elsewhere.code == 4, elsewhere.stdout
    line = elsewhere.json()["quota"]["lines"][0]
    assert line["verdict"] == "unknown" and "not eu-north1" in line["reason"]
    assert not (pulumi_backend.state_dir / ".pulumi" / "stacks").exists()


@pytest.fixture
def k8s_plugin() -> None:
    home = Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")
    if not (home / "plugins" / K8S_PLUGIN).is_dir():
        missing(f"the {K8S_PLUGIN} Pulumi plugin")


def test_kubernetes_target_lifecycle(
    npa_home: Path, pulumi_backend: PulumiBackend, kube: KubeCluster, k8s_plugin: None
) -> None:
    from kubernetes import client

    user_kubeconfig = Path(os.environ["HOME"]) / ".kube" / "config"
    user_kubeconfig.parent.mkdir(parents=True)
    user_kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    before = user_kubeconfig.read_bytes()
    args = (
        "provision-if-absent",
        "--project",
        "team",
        "--target",
        "kubernetes",
        "--context",
        kube.context,
        "--kubeconfig",
        str(kube.kubeconfig),
        "--backend-url",
        pulumi_backend.url,
    )
    preview = run_npa(*args, "--preview", "--json")
    assert preview.code == 0, preview.stderr
    ops = {(c["op"], c["type"]) for c in preview.json()["stacks"][0]["preview"]}
    assert ("create", "kubernetes:core/v1:Namespace") in ops
    assert ("create", "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding") in ops
    assert not npa_home.exists()

    applied = run_npa(*args, "--yes", timeout=240)
    assert applied.code == 0, applied.stdout + applied.stderr
    placed = npa_home / "clusters" / kube.context / "kubeconfig"
    assert f"export KUBECONFIG={placed}" in applied.stdout or (
        f"export KUBECONFIG=~/{placed.relative_to(Path(os.environ['HOME']))}" in applied.stdout
    )
    assert stat.S_IMODE(placed.stat().st_mode) == 0o600
    assert user_kubeconfig.read_bytes() == before

    api = kube.api_client()
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    assert core.read_namespace("npa-team").metadata.labels["app.kubernetes.io/managed-by"] == "npa"
    assert core.read_namespaced_service_account("sky-sa", "npa-team")
    assert rbac.read_namespaced_role("sky-sa-role", "npa-team").rules[0].verbs == ["*"]
    assert rbac.read_namespaced_role_binding("sky-sa-rb", "npa-team")
    assert rbac.read_cluster_role("npa-team-sky-sa-cluster-role")
    assert rbac.read_cluster_role_binding("npa-team-sky-sa-cluster-rb")

    # The placed kubeconfig alone reaches the cluster.
    from kubernetes import config as kconfig

    alone = kconfig.new_client_from_config(config_file=str(placed))
    assert client.CoreV1Api(alone).read_namespace("npa-team")

    again = run_npa(*args, "--yes", "--json", timeout=240)
    assert again.code == 0, again.stderr
    assert again.json()["mode"] == "no-changes"

    torn = run_npa(
        "teardown",
        "--project",
        "team",
        "--target",
        "kubernetes",
        "--context",
        kube.context,
        "--backend-url",
        pulumi_backend.url,
        "--yes",
        "--json",
        timeout=240,
    )
    assert torn.code == 0, torn.stdout + torn.stderr
    assert not placed.exists()
    assert user_kubeconfig.read_bytes() == before
    with pytest.raises(client.ApiException) as gone:
        rbac.read_cluster_role("npa-team-sky-sa-cluster-role")
    assert gone.value.status == 404
    namespace = _namespace_or_none(core, "npa-team")
    # A namespace is deleted asynchronously: gone, or on its way out.
    assert namespace is None or namespace.status.phase == "Terminating"


def _namespace_or_none(core: Any, name: str) -> Any:
    from kubernetes import client

    try:
        return core.read_namespace(name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
