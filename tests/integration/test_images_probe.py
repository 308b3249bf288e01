"""The capability probe against a real kube-apiserver; the test plays the kubelet."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npa.core.paths import NpaPaths
from npa.images.probe import (
    LIMITS,
    PROBE_LABEL,
    CapabilityProber,
    ProbeTarget,
    core_api,
    select_target,
)
from npa.services.images import preflight
from tests.harness.kube import KubeCluster
from tests.harness.registry import Registry
from tests.integration.imagespec import unique_repo, write_spec

pytestmark = pytest.mark.integration

D = "sha256:" + "c" * 64
IMAGE = f"registry.example.com/probe/me@{D}"
GOOD_REPORT = (
    "npa-probe/2 uid=1000 posix-shell=yes writable-tmp=yes bash=yes passwd-user=yes "
    "writable-home=yes sudo=yes aws-cli=yes\n"
)
# What SkyPilot's `sudo` refused on the first real run: no passwd entry for the user.
NO_PASSWD_REPORT = (
    "npa-probe/2 uid=1000 posix-shell=yes writable-tmp=yes bash=yes passwd-user=no "
    "writable-home=no sudo=no aws-cli=no\n"
)
HOLD = "npa.test/hold"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def terminate(core: Any, pod: Any, exit_code: int, message: str) -> None:
    """Write what a kubelet writes when the probe container exits."""
    name, ns = pod.metadata.name, pod.metadata.namespace
    terminated = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "message": message,
        "startedAt": _now(),
        "finishedAt": _now(),
    }
    status = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [
            {
                "name": "probe",
                "image": pod.spec.containers[0].image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
    core.patch_namespaced_pod_status(name, ns, {"status": status})


class Kubelet:
    """Watches for probe Pods and acts on each one as ``behave`` says."""

    def __init__(self, core: Any, namespace: str, behave: Callable[[Any, Any], None]) -> None:
        self.core, self.namespace, self.behave = core, namespace, behave
        self.seen: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        handled: set[str] = set()
        while not self._stop.is_set():
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=PROBE_LABEL).items
            for pod in pods:
                if pod.metadata.name not in handled and pod.metadata.deletion_timestamp is None:
                    handled.add(pod.metadata.name)
                    self.seen.append(pod)
                    self.behave(self.core, pod)
            time.sleep(0.1)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def target(kube: KubeCluster) -> ProbeTarget:
    return select_target(kube.context, kube.kubeconfig)


@pytest.fixture
def core(target: ProbeTarget) -> Any:
    return core_api(target)


def _gone(core: Any, name: str, namespace: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_probe_whole_life(core: Any, target: ProbeTarget) -> None:
    with Kubelet(core, target.namespace, lambda c, p: terminate(c, p, 0, GOOD_REPORT)) as kubelet:
        outcome = CapabilityProber(core, target, timeout=30).run(
            IMAGE, D, run_as_user=1000, run_as_group=1000
        )
    assert outcome.verdict == "passed", outcome.detail
    assert outcome.uid == 1000
    [pod] = kubelet.seen
    spec = pod.spec
    assert spec.active_deadline_seconds == 30 and spec.restart_policy == "Never"
    container = spec.containers[0]
    assert container.image == IMAGE
    assert container.resources.limits == LIMITS
    assert spec.security_context.run_as_user == 1000
    assert spec.security_context.run_as_non_root is True
    assert _gone(core, outcome.pod, target.namespace)


def test_probe_that_fails_is_rejected_and_deleted(core: Any, target: ProbeTarget) -> None:
    with Kubelet(core, target.namespace, lambda c, p: terminate(c, p, 1, NO_PASSWD_REPORT)):
        outcome = CapabilityProber(core, target, timeout=30).run(
            IMAGE, D, run_as_user=1000, run_as_group=1000
        )
    assert outcome.verdict == "failed"
    assert "passwd-user, writable-home, sudo" in outcome.detail
    assert _gone(core, outcome.pod, target.namespace)


def test_probe_without_report_line_fails(core: Any, target: ProbeTarget) -> None:
    with Kubelet(core, target.namespace, lambda c, p: terminate(c, p, 127, "sh: not found")):
        outcome = CapabilityProber(core, target, timeout=30).run(
            IMAGE, D, run_as_user=1000, run_as_group=1000
        )
    assert outcome.verdict == "failed" and "report line" in outcome.detail


def test_probe_timeout_is_unverified_and_deleted(core: Any, target: ProbeTarget) -> None:
    with Kubelet(core, target.namespace, lambda c, p: None):
        started = time.monotonic()
        outcome = CapabilityProber(core, target, timeout=2, poll=0.2).run(
            IMAGE, D, run_as_user=1000, run_as_group=1000
        )
    assert time.monotonic() - started < 15
    assert outcome.verdict == "unverified" and "did not finish within 2s" in outcome.detail
    assert _gone(core, outcome.pod, target.namespace)


def test_probe_whose_pod_cannot_be_deleted_fails(core: Any, target: ProbeTarget) -> None:
    def hold_then_pass(c: Any, pod: Any) -> None:
        c.patch_namespaced_pod(
            pod.metadata.name, pod.metadata.namespace, {"metadata": {"finalizers": [HOLD]}}
        )
        terminate(c, pod, 0, GOOD_REPORT)

    with Kubelet(core, target.namespace, hold_then_pass):
        outcome = CapabilityProber(core, target, timeout=30, delete_timeout=2, poll=0.2).run(
            IMAGE, D, run_as_user=1000, run_as_group=1000
        )
    try:
        assert outcome.verdict == "unverified"
        assert "could not be deleted" in outcome.detail
        assert outcome.fix is not None and f"delete pod {outcome.pod}" in outcome.fix
        assert not _gone(core, outcome.pod, target.namespace)
    finally:
        core.patch_namespaced_pod(outcome.pod, target.namespace, {"metadata": {"finalizers": None}})
    deadline = time.monotonic() + 10
    while not _gone(core, outcome.pod, target.namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(core, outcome.pod, target.namespace)


@pytest.fixture
def kube_env(kube: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeCluster]:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    monkeypatch.delenv("NPA_CONTEXT", raising=False)
    yield kube


def test_preflight_probes_an_unattested_image_once_then_caches(
    registry: Registry,
    kube_env: KubeCluster,
    npa_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    img = registry.push_image(unique_repo("unattested"), "v1")
    ref = f"{registry.host}/{img.repository}:v1"
    # Two tools share the image: it is probed once.
    spec = write_spec(tmp_path / "spec.yaml", {"one": {"image": ref}, "two": {"image": ref}})
    monkeypatch.setenv("REG", f"{registry.auth[0]}:{registry.auth[1]}")
    # The probe runs in the project's namespace (``npa-default``: no project given), which
    # provisioning creates.
    target = select_target(kube_env.context, None, "npa-default")
    core = core_api(target)
    _ensure_namespace(core, target.namespace)
    args = {
        "context": kube_env.context,
        "registry_auth": [f"{registry.host}=env:REG"],
        "probe_timeout": 30,
        "paths": NpaPaths(npa_home),
    }
    with Kubelet(core, target.namespace, lambda c, p: terminate(c, p, 0, GOOD_REPORT)) as kubelet:
        result = preflight(spec, **args)  # type: ignore[arg-type]
    assert result.exit_code() == 0, [r.detail for r in result.images]
    assert [r.verified_by for r in result.images] == ["probe", "probe"]
    assert all(r.digest == img.digest and r.user == 1000 for r in result.images)
    assert len(kubelet.seen) == 1
    assert (
        kubelet.seen[0].spec.containers[0].image == f"{registry.host}/{img.repository}@{img.digest}"
    )
    assert _gone(core, kubelet.seen[0].metadata.name, target.namespace)

    again = preflight(spec, **args)  # type: ignore[arg-type]
    assert [r.verified_by for r in again.images] == ["cache", "cache"]


def _ensure_namespace(core: Any, name: str) -> None:
    """Create ``name`` as provisioning would, unless an earlier test of the session did."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise


def test_preflight_reports_a_failed_probe_as_rejected(
    registry: Registry,
    kube_env: KubeCluster,
    npa_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    img = registry.push_image(unique_repo("noshell"), "v1")
    spec = write_spec(
        tmp_path / "spec.yaml", {"tool": {"image": f"{registry.host}/{img.repository}:v1"}}
    )
    monkeypatch.setenv("REG", f"{registry.auth[0]}:{registry.auth[1]}")
    # The probe runs in the project's namespace (``npa-default``: no project given).
    target = select_target(kube_env.context, None, "npa-default")
    core = core_api(target)
    _ensure_namespace(core, target.namespace)
    with Kubelet(core, target.namespace, lambda c, p: terminate(c, p, 1, NO_PASSWD_REPORT)):
        result = preflight(
            spec,
            context=kube_env.context,
            registry_auth=[f"{registry.host}=env:REG"],
            probe_timeout=30,
            paths=NpaPaths(npa_home),
        )
    [row] = result.images
    assert row.status == "rejected" and "sudo" in row.detail
    assert result.exit_code() == 1
    assert not (npa_home / "cache" / "images").exists() or not list(
        (npa_home / "cache" / "images").iterdir()
    )
