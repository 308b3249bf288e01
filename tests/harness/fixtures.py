"""pytest fixtures over the harness: real services on loopback, stopped at teardown."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cluster import Cluster, pod_cluster, tools_from_env
from tests.harness.kube import KubeCluster, kube_cluster
from tests.harness.procs import stop_lock_holders
from tests.harness.pulumi import PulumiBackend, file_backend
from tests.harness.registry import Registry, distribution_registry
from tests.harness.s3 import S3Server, moto_server
from tests.harness.skypilot import SKY, sky_api_server
from tests.harness.skypilot_cluster import SkyCluster, sky_cluster_world
from tests.harness.tools import kubebuilder_asset, missing, require_tool

# PULUMI_HOME holds the provider plugins bootstrap-tools installed; it must survive tests that
# point HOME at a temp dir.
REAL_PULUMI_HOME = os.environ.get("PULUMI_HOME") or str(Path.home() / ".pulumi")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server) -> S3Server:
    """moto's S3 server over HTTP, emptied before each test."""
    s3_server.reset()
    return s3_server


@pytest.fixture(scope="session")
def registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    binary = require_tool("NPA_REGISTRY_BIN", "docker-registry", "registry")
    with distribution_registry(binary, tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture
def registry(registry_server: Registry) -> Registry:
    """The distribution registry with htpasswd auth; tests push under their own repository names."""
    return registry_server


@pytest.fixture(scope="session")
def kube_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    etcd = kubebuilder_asset("etcd") or require_tool("NPA_ETCD_BIN", "etcd")
    apiserver = kubebuilder_asset("kube-apiserver") or require_tool(
        "NPA_KUBE_APISERVER_BIN", "kube-apiserver"
    )
    with kube_cluster(etcd, apiserver, tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster


@pytest.fixture
def kube(kube_server: KubeCluster) -> KubeCluster:
    """etcd + kube-apiserver; the test plays scheduler and kubelet through the helpers."""
    return kube_server


@pytest.fixture(scope="session")
def sky_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real local SkyPilot API server; the dict is the environment that reaches it."""
    if not SKY.exists():
        missing("the sky CLI (pip install -c constraints.txt -e '.[dev]')")
    with sky_api_server(tmp_path_factory.mktemp("sky")) as env:
        yield env


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real two-node Kubernetes cluster that runs pods, started once per session and torn
    down (processes, mounts, network, iptables, cgroups, sysctl) at its end."""
    if os.geteuid() != 0:
        missing("root (the test cluster makes a bridge, cgroups, mounts and iptables rules)")
    tools = tools_from_env()
    if isinstance(tools, str):
        missing(tools)
        raise AssertionError("unreachable")  # pytest.skip/fail raise
    with pod_cluster(tools, tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="session")
def sky_cluster(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SkyCluster]:
    """Project ``e2e`` configured and provisioned on ``cluster``, a store pods can reach, and a
    SkyPilot API server whose jobs controller fits the node (shared by every test)."""
    if not SKY.exists():
        missing("the sky CLI (pip install -c constraints.txt -e '.[dev]')")
    require_tool("NPA_PULUMI_BIN", "pulumi")
    with sky_cluster_world(cluster, tmp_path_factory.mktemp("sky-cluster")) as world:
        yield world


@pytest.fixture
def pulumi_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PulumiBackend:
    """A file:// Pulumi backend with a passphrase secrets provider, and the real pulumi CLI."""
    pulumi_bin = require_tool("NPA_PULUMI_BIN", "pulumi")
    backend = file_backend(tmp_path / "pulumi-state", pulumi_bin)
    for key, value in backend.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PULUMI_HOME", REAL_PULUMI_HOME)
    return backend


# Lock files held for life by npa's detached supervisors (local runs and SkyPilot runs).
SUPERVISOR_LOCKS = ("locks/supervisor.*.lock", "local-jobs/*/executor.lock")


@pytest.fixture
def npa_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated NPA_HOME (and HOME, so nothing falls back to the real ~/.npa).

    Supervisors that the test's runs left running are stopped at teardown: they are built to
    outlive the command that started them, not the test.
    """
    home = tmp_path / "home"
    home.mkdir()
    root = home / ".npa"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NPA_HOME", str(root))
    monkeypatch.setenv("PULUMI_HOME", REAL_PULUMI_HOME)
    yield root
    stop_lock_holders(root, SUPERVISOR_LOCKS)
