"""The set-up every SkyPilot-path CLI test starts from: an S3 store, a placed kubeconfig, the
fake managed-jobs service, and a reserved run of the tiny example spec. :func:`run_npa` runs the
CLI with the fake passed to the SkyPilot backend (:mod:`tests.fakes.entry`)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.entry import CLI_MODULE
from tests.fakes.managed_jobs import STATE_ENV
from tests.harness.cli import CliResult
from tests.harness.cli import run_npa as run_real_npa
from tests.harness.kube import KubeCluster
from tests.harness.s3 import S3Server

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "team"


def run_npa(*args: str, **kwargs: Any) -> CliResult:
    """The CLI as a user runs it, with the managed-jobs double as SkyPilot's job service."""
    return run_real_npa(*args, module=CLI_MODULE, **kwargs)


def make_world(
    s3: S3Server,
    kube: KubeCluster,
    npa_home: Path,
    tmp_path: Path,
    *,
    bucket: str,
    env: dict[str, str] | None = None,
    edit_spec: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """Configure project ``team`` on ``bucket``, place the fixture's kubeconfig where provisioning
    would, and reserve a run; ``env`` adds to (or overrides) the CLI environment; ``edit_spec``
    changes the tiny example's text before the run is reserved for it."""
    s3.client().create_bucket(Bucket=bucket)
    state = tmp_path / "fake-jobs.json"
    full_env = {
        **s3.env,
        "NPA_HOME": str(npa_home),
        "HOME": str(npa_home.parent),
        STATE_ENV: str(state),
        "NPA_READYZ_WINDOW_SECONDS": "0.4",
        "NPA_READYZ_INTERVAL_SECONDS": "0.2",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    r = run_npa("configure", "--project", PROJECT, "--store", f"s3://{bucket}/npa", env=full_env)
    assert r.code == 0, r.stderr
    placed = npa_home / "clusters" / kube.context / "kubeconfig"
    placed.parent.mkdir(parents=True)
    shutil.copy(kube.kubeconfig, placed)
    ensure_namespace(kube, f"npa-{PROJECT}")
    spec = tmp_path / "workflow" / "tiny.yaml"
    spec.parent.mkdir()
    text = (ROOT / "examples" / "tiny-local.yaml").read_text()
    spec.write_text(edit_spec(text) if edit_spec else text)
    r = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", PROJECT, env=full_env
    )
    assert r.code == 0, r.stderr
    run_id = r.stdout.strip()
    return {
        "env": full_env,
        "state": state,
        "spec": spec,
        "run_id": run_id,
        "context": kube.context,
        "kube": kube,
        "kubeconfig": placed,
        "home": npa_home,
        "s3": s3,
        "bucket": bucket,
        "key": f"npa/tiny-local/{run_id}/npa-workflow/manifest.json",
    }


def ensure_namespace(kube: KubeCluster, name: str) -> None:
    """The project's namespace, as provisioning creates it (the kube fixture is shared)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = kube.core()
    try:
        existing = core.read_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        existing = None
    if existing is not None and existing.metadata.deletion_timestamp:
        # An earlier test tore the project down (teardown deletes its namespace). The harness
        # runs no namespace controller, so the namespace would stay Terminating, refusing every
        # write with 403: finish the deletion as that controller would, then create it again.
        existing.spec.finalizers = []
        core.replace_namespace_finalize(name, existing)
        deadline = time.monotonic() + 30
        while True:
            try:
                core.read_namespace(name)
            except ApiException as exc:
                if exc.status == 404:
                    break
                raise
            assert time.monotonic() < deadline, f"namespace {name} was never deleted"
            time.sleep(0.1)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise


def manifest(w: dict[str, Any]) -> dict[str, Any]:
    """The run's manifest as the store holds it now."""
    body = w["s3"].client().get_object(Bucket=w["bucket"], Key=w["key"])["Body"].read()
    data: dict[str, Any] = json.loads(body)
    return data


def wait_for(
    w: dict[str, Any], check: Callable[[dict[str, Any]], bool], timeout: float = 180.0
) -> dict[str, Any]:
    """The manifest once ``check`` holds for it; fails with the last one seen after ``timeout``
    (a bound on a hang, generous for two busy cores: a relaunch takes several supervisor polls)."""
    deadline = time.monotonic() + timeout
    m = manifest(w)
    while not check(m):
        assert time.monotonic() < deadline, json.dumps(m, indent=1)
        time.sleep(0.1)
        m = manifest(w)
    return m
