"""How npa reads the real SkyPilot API server's answer when no jobs controller exists.

SkyPilot 0.14.1's local API server (``sky api start`` on loopback) answers ``jobs.queue_v2`` with
``ClusterNotUpError("No in-progress managed jobs.")`` when the jobs controller does not exist.
No controller means no managed job: the queue's answer is an authoritative "none" (a first
launch on a fresh cluster must go ahead). A run whose manifest names a job that the queue does
not have is still VERIFICATION_UNAVAILABLE, never NOT_FOUND (npa cannot tell what became of it),
and ``cancel`` finds no job to cancel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
# A bound on a hang, not a speed: idle, status answers in about 20 s (most of it the server
# starting the worker that serves the queue request); under CI load it took over 180 s.
HANG = 900


@pytest.mark.opt_in  # 189 s in make test on 2026-12-03 (passed); make test-all
def test_no_jobs_controller_means_no_job_and_never_not_found(
    sky_server: dict[str, str], npa_home: Path, tmp_path: Path
) -> None:
    from npa.core.paths import NpaPaths
    from npa.runs.manifest import RunManifest, write_manifest

    env: dict[str, Any] = {"NPA_HOME": str(npa_home), **sky_server}
    spec = tmp_path / "tiny.yaml"
    spec.write_text((EXAMPLES / "tiny-local.yaml").read_text())
    r = run_npa(*WF, "prepare-run", str(spec), "--project", "p", env=env)
    assert r.code == 0, r.stderr
    run_id = r.stdout.strip()
    # A run recorded as submitted to SkyPilot (job 7); the controller has since gone.
    from npa.adapters.storage import open_store

    paths = NpaPaths(npa_home)
    store = open_store("local", paths=paths)
    now = "2026-01-01T00:00:00+00:00"
    write_manifest(store, RunManifest(
        project="p", workflow="tiny-local", run_id=run_id, backend="skypilot",
        infra="k8s/gone", state="PENDING", submitted_at=now, updated_at=now,
        store=store.uri, prefix=f"tiny-local/{run_id}/npa-workflow", spec_sha256="x",
        source_digest=None, plan_digest="x", tasks={}, images={},
        job_name=f"npa-tiny-local-{run_id}", job_id=7,
    ))  # fmt: skip
    r = run_npa(*WF, "status", run_id, "--project", "p", "--json", env=env, timeout=HANG)
    assert r.code == 4, r.stdout + r.stderr
    body = r.json()
    assert body["state"] == "VERIFICATION_UNAVAILABLE"
    job = next(s for s in body["sources"] if s["source"] == "backend-job")
    assert job["answer"] == "absent" and "not in the SkyPilot queue" in job["detail"], job
    assert "does not know" in body["reason"]
    r = run_npa(*WF, "cancel", run_id, "--project", "p", "--json", env=env, timeout=HANG)
    assert r.code == 0 and r.json()["outcome"] == "no_job", r.stdout + r.stderr
