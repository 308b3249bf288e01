"""submit on the local backend, end to end: the real CLI, the embedded store, real processes."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa
from tests.harness.procs import run_processes, wait_until

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_STARTUP", "FAILED_CONTROLLER"}


@pytest.fixture
def env(npa_home: Path) -> dict[str, str]:
    return {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    folder = tmp_path / "workflow"
    folder.mkdir()
    target = folder / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", target)
    return target


def prepare(spec: Path, env: dict[str, str]) -> str:
    r = run_npa("workbench", "workflow", "prepare-run", str(spec), "--project", "demo", env=env)
    assert r.code == 0, r.stderr
    return r.stdout.strip()


def submit(spec: Path, run_id: str, env: dict[str, str], *extra: str) -> Any:
    return run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "demo",
        "--run-id", run_id, "--runtime", "process", "--json", *extra, env=env,
    )  # fmt: skip


def run_dir(npa_home: Path, workflow: str, run_id: str) -> Path:
    return npa_home / "store" / workflow / run_id / "npa-workflow"


def wait_manifest(prefix: Path, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = json.loads((prefix / "manifest.json").read_text())
        if manifest["state"] in TERMINAL:
            return manifest  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"run did not finish: {manifest['state']}")


def test_tiny_spec_runs_to_success_with_outputs_in_the_store(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    run_id = prepare(spec, env)
    r = submit(spec, run_id, env, "--progress")
    assert r.code == 0, r.stdout + r.stderr
    out = r.json()  # progress asked for goes to stderr; stdout stays the JSON result
    assert out["backend"] == "local" and out["outcome"] == "launched"
    # Staging's progress, with its totals, as plain lines (stderr is a pipe here).
    assert "hashing: 1 files" in r.stderr and "uploading: 1/1 files" in r.stderr
    tx = out["launch_transaction"]
    assert tx["reconcile"][0]["answer"] == "absent" and tx["launched_job_id"] == out["job_id"]
    assert tx["lock"]["path"].endswith(f"launch.demo.{run_id}.lock")

    prefix = run_dir(npa_home, "tiny-local", run_id)
    manifest = wait_manifest(prefix)
    assert manifest["state"] == "SUCCEEDED", manifest
    assert manifest["job_id"] == out["job_id"]
    assert [manifest["stages"][s]["state"] for s in ("generate", "square", "total")] == [
        "SUCCEEDED"
    ] * 3
    assert (prefix / "stages/total/outputs/total.txt").read_text().strip() == "338350"
    numbers = prefix / "stages/generate/outputs/numbers/numbers.txt"
    assert numbers.read_text().split() == [str(i) for i in range(1, 101)]
    assert len(manifest["stages"]["square"]["waves"][0]["exit_codes"]) == 2  # both shards
    assert (prefix / "stages/square/logs/wave-0-shard-1.log").exists()
    receipt = json.loads(Path(out["receipt"]).read_text())
    assert receipt["job"] == {"backend": "local", "job_id": str(out["job_id"]),
                              "job_name": out["job_name"]}  # fmt: skip

    # Submitting the same run again adopts its job; nothing runs twice.
    again = submit(spec, run_id, env)
    assert again.code == 0, again.stdout + again.stderr
    assert again.json()["outcome"] == "adopted" and again.json()["job_id"] == out["job_id"]
    assert sorted(p.name for p in (npa_home / "local-jobs").iterdir()) == ["1"]


def test_a_failing_stage_ends_failed_with_its_classification(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    text = spec.read_text().replace(
        "awk '{ s += $1 } END { print s }'", "echo boom >&2; exit 3; awk '{ s += $1 }'"
    )
    spec.write_text(text)
    run_id = prepare(spec, env)
    r = submit(spec, run_id, env, "--retries", "1")
    assert r.code == 0, r.stdout + r.stderr
    manifest = wait_manifest(run_dir(npa_home, "tiny-local", run_id))
    assert manifest["state"] == "FAILED"
    total = manifest["stages"]["total"]
    assert total["state"] == "FAILED" and total["classification"] == "payload"
    assert total["waves"][0]["attempts"] == 2  # --retries 1: one more attempt, then stop
    sup = manifest["supervisor"]
    assert sup["classification"] == "payload" and sup["recovery"] == "stopped"
    assert [a["recovery"] for a in sup["attempts"]] == ["retried", "stopped"]
    assert manifest["stages"]["square"]["state"] == "SUCCEEDED"
    log = run_dir(npa_home, "tiny-local", run_id) / "stages/total/logs/wave-0-shard-0.log"
    assert "boom" in log.read_text()


def test_a_stage_that_exits_75_once_is_recovered_as_infrastructure_not_retried_as_payload(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    """75 is a temporary failure (what the SkyPilot stage library ends a node with when the
    store stopped answering): the same class on this backend, so the wave runs again under
    the infrastructure budget although the stage has no retry left."""
    text = spec.read_text().replace(
        "awk '{ s += $1 } END { print s }'",
        "test \"$NPA_ATTEMPT\" = 1 && exit 75; awk '{ s += $1 } END { print s }'",
    )
    assert text != spec.read_text()
    spec.write_text(text)
    run_id = prepare(spec, env)
    assert submit(spec, run_id, env, "--retries", "0").code == 0
    manifest = wait_manifest(run_dir(npa_home, "tiny-local", run_id))
    assert manifest["state"] == "SUCCEEDED", json.dumps(manifest, indent=1)
    total = manifest["stages"]["total"]
    assert total["state"] == "SUCCEEDED" and total["waves"][0]["attempts"] == 2, total
    sup = manifest["supervisor"]
    assert sup["infrastructure_recoveries"] == 1 and sup["payload_retries"] == 0, sup
    [attempt] = sup["attempts"]
    assert attempt["classification"] == "transient_infrastructure", attempt
    assert "exit 75: a temporary failure" in attempt["detail"], attempt


def test_a_missing_command_is_actionable_configuration(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    spec.write_text(spec.read_text().replace("mkdir -p", "no-such-npa-command", 1))
    run_id = prepare(spec, env)
    assert submit(spec, run_id, env).code == 0
    manifest = wait_manifest(run_dir(npa_home, "tiny-local", run_id))
    assert manifest["state"] == "FAILED"
    assert manifest["stages"]["generate"]["classification"] == "actionable_configuration"
    assert manifest["stages"]["square"]["state"] == "PENDING"


def test_gates_report_everything_at_once_and_write_nothing(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    spec.write_text(
        spec.read_text().replace(
            "tool: shell\n    command: mkdir", "tool: nope\n    command: mkdir"
        )
    )
    r = run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "demo", "--json", env=env
    )  # fmt: skip
    assert r.code == 1, r.stdout + r.stderr
    error = r.json()["error"]
    failed = {g["name"]: g for g in error["details"]["gates"] if g["status"] == "failed"}
    assert set(failed) == {"spec", "run"}
    assert "validate-spec" in failed["spec"]["fix"] and "prepare-run" in failed["run"]["fix"]
    # Nothing staged, nothing launched, nothing recorded.
    assert not (npa_home / "store").exists()
    assert not (npa_home / "local-jobs").exists()
    assert not (npa_home / "workflow-submissions").exists()


def test_cancel_from_another_process_stops_the_run(
    spec: Path, env: dict[str, str], npa_home: Path
) -> None:
    began = npa_home.parent / "generate-began"
    spec.write_text(spec.read_text().replace("seq 1 100", f"touch {began}; sleep 30; seq 1 100"))
    run_id = prepare(spec, env)
    out = submit(spec, run_id, env).json()
    from npa.backends.local.backend import LocalBackend
    from npa.core.paths import NpaPaths

    backend = LocalBackend(NpaPaths(npa_home))
    job_dir = npa_home / "local-jobs" / str(out["job_id"])
    shard = job_dir / "shards" / "generate" / "w0" / "a1"
    # The stage's shard is started (its identity recorded) and its command runs.
    wait_until(began.exists, "the stage's command runs")
    backend.cancel(out["job_id"])
    # cancel returns once the job is seen stopped: the record is final, nothing of it runs.
    assert backend.job(out["job_id"]).state.value == "CANCELLED"
    assert run_processes(run_id) == []
    # The shard was stopped by the cancel's SIGTERM, not waited out (sleep 30 never ended).
    assert (shard / "s0.exit").read_text().strip() == "-15"
    manifest = wait_manifest(run_dir(npa_home, "tiny-local", run_id))
    assert manifest["state"] == "CANCELLED"
    assert backend.job(out["job_id"]).state.value == "CANCELLED"
