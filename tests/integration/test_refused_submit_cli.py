"""A refused submit is read-only and shows every failing gate at once: through the real CLI,
on the local backend and on the SkyPilot path against the real registry (whose image check
would otherwise write verification-cache entries under NPA_HOME)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.procs import run_processes, wait_until
from tests.harness.registry import Registry
from tests.integration.imagespec import push_attested, write_spec

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its kind, mode and (for files) content digest."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            out[str(path.relative_to(root))] = f"{oct(info.st_mode)} {digest}"
    return out


def failing(res: Any) -> dict[str, dict[str, Any]]:
    gates = res.json()["error"]["details"]["gates"]
    return {g["name"]: g for g in gates if g["status"] in ("failed", "unknown")}


def break_stages(spec: Path) -> None:
    """Make every stage invalid (negative CPUs) and leave the tools section valid."""
    doc = yaml.safe_load(spec.read_text())
    for stage in doc["stages"]:
        stage.setdefault("resources", {})["cpus"] = -4
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_an_invalid_spec_and_no_run_hide_no_other_gate_and_write_nothing(
    npa_home: Path, tmp_path: Path
) -> None:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    spec = tmp_path / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", spec)
    run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    cases: dict[str, tuple[tuple[str, ...], set[str]]] = {
        # An invalid spec: the image choice is still checked against the spec's tools.
        "invalid spec": (
            ("--run-id", run_id, "--image-override", "ghost=registry.example.com/x:1"),
            {"spec", "image-overrides"},
        ),
        # No run named: the spec's quota is still measured (a million GiB: no disk here has it).
        "no run": ((), {"run", "quota"}),
    }
    for name, (flags, expected) in cases.items():
        shutil.copy(EXAMPLES / "tiny-local.yaml", spec)
        if name == "invalid spec":
            break_stages(spec)
        else:
            text = spec.read_text().replace("disk_gib: 1", "disk_gib: 1000000", 1)
            spec.write_text(text)
        before = snapshot(npa_home)
        res = run_npa(*WF, "submit", str(spec), "--project", "demo", "--infra", "local",
                      "--runtime", "process", *flags, "--json", env=env)  # fmt: skip
        assert res.code == 1, f"{name}: {res.stdout}{res.stderr}"
        assert set(failing(res)) == expected, f"{name}: {failing(res)}"
        assert snapshot(npa_home) == before, f"{name}: the refused submit wrote under NPA_HOME"
    text = run_npa(*WF, "submit", str(spec), "--project", "demo", "--infra", "local",
                   "--runtime", "process", env=env)  # fmt: skip
    assert text.code == 1
    # The text lists both failures, each with its fix.
    assert "- run:" in text.stderr and "- quota:" in text.stderr
    assert "plan-spec" in text.stderr and "GiB free" in text.stderr


def test_a_refused_skypilot_submit_checks_images_and_caches_nothing(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    env = {
        "NPA_HOME": str(npa_home),
        "HOME": str(npa_home.parent),
        "REG_AUTH": f"{registry.auth[0]}:{registry.auth[1]}",
    }
    good = push_attested(registry, "refused")
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "good": {"image": f"{registry.host}/{good.repository}:v1"},
            "gone": {"image": f"{registry.host}/npa-preflight/never-pushed:v1"},
        },
    )
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    valid = spec.read_text()
    before = snapshot(npa_home)
    # No cluster was provisioned for the context, so submit refuses: the image gates still
    # run, also when the spec is invalid elsewhere, and the good image's verification is
    # not kept.
    for broken in (False, True):
        spec.write_text(valid)
        if broken:
            break_stages(spec)
        res = run_npa(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
                      "--infra", "k8s/nowhere", auth, "--json", env=env)  # fmt: skip
        assert res.code == 1, res.stdout + res.stderr
        gates = failing(res)
        expected = {"kubeconfig", "image:gone"} | ({"spec"} if broken else set())
        assert expected <= set(gates), gates
        gone = gates["image:gone"]
        assert gone["status"] == "failed" and "not_found" in gone["detail"]
        assert "image:good" not in gates
        assert snapshot(npa_home) == before
        assert not (npa_home / "cache" / "images").exists()

    # The same check outside submit keeps what it verified: the cache is real, and the
    # refusal above is what left it empty.
    write_spec(
        tmp_path / "valid.yaml", {"good": {"image": f"{registry.host}/{good.repository}:v1"}}
    )
    pre = run_npa(*WF, "preflight-images", str(tmp_path / "valid.yaml"), auth, env=env)
    assert pre.code == 0, pre.stdout + pre.stderr
    cached = list((npa_home / "cache" / "images").iterdir())
    assert [p.name for p in cached] == [good.digest.replace(":", "-") + ".json"]


def test_a_refused_resubmit_writes_nothing_and_a_resumed_one_keeps_the_submitted_time(
    npa_home: Path, tmp_path: Path
) -> None:
    """Each refusal submit can make of a run that exists: nothing under NPA_HOME (receipt,
    journals, reservation, locks) or in the store (its manifest, plan, tasks) changes."""
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    spec = tmp_path / "source" / "tiny-local.yaml"
    spec.parent.mkdir()
    doc = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    doc["stages"][1]["command"] = "echo no squares today >&2; exit 4"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    submit = (*WF, "submit", str(spec), "--project", "demo", "--runtime", "process")
    first = run_npa(*submit, "--run-id", run_id, env=env)
    assert first.code == 0, first.stdout + first.stderr
    watch = run_npa(*WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
                    "--json", env=env)  # fmt: skip
    assert json.loads(watch.stdout.splitlines()[-1])["state"] == "FAILED", watch.stdout
    receipt = npa_home / "workflow-submissions" / "demo" / f"{run_id}.json"
    submitted_at = json.loads(receipt.read_text())["submitted_at"]
    manifest = npa_home / "store" / "tiny-local" / run_id / "npa-workflow" / "manifest.json"

    def settled() -> bool:
        """The run's own writers are done: its end recorded, none of its processes left."""
        ended = json.loads(manifest.read_text())["state"] == "FAILED"
        return ended and not run_processes(run_id)

    wait_until(settled, "the run's executor recorded its end and exited")
    valid = spec.read_text()
    changed = valid.replace("seq 1 100", "seq 1 200")
    assert changed != valid
    refusals: dict[str, tuple[tuple[str, ...], str, int, str]] = {
        # A plain submit of a finished job: the ended result, whose next is the resume.
        "finished job": (("--run-id", run_id, "--json"), valid, 1, '"outcome": "ended"'),
        "two runs named": (("--run-id", run_id, "--resume-run", "20260101-000000-000000"),
                           valid, 2, "name different runs"),
        "unknown run": (("--run-id", "20260101-000000-000000"), valid, 1, "- run:"),
        "other tasks": (("--run-id", run_id), changed, 2, "with different tasks"),
    }  # fmt: skip
    before = snapshot(npa_home)
    for name, (flags, text, code, said) in refusals.items():
        spec.write_text(text)
        res = run_npa(*submit, *flags, env=env)
        assert res.code == code, (name, res.stdout, res.stderr)
        assert said in res.stdout + res.stderr, (name, res.stdout, res.stderr)
        assert snapshot(npa_home) == before, f"{name}: the refused submit wrote something"
    spec.write_text(valid)
    ended = run_npa(*submit, "--run-id", run_id, env=env)
    assert "nothing was staged, recorded or launched" in ended.stdout, ended.stdout

    # A resume of a job the backend no longer knows while the manifest says it is live.
    job_id = json.loads(manifest.read_text())["job_id"]
    jobs = npa_home / "local-jobs"
    (jobs / str(job_id)).rename(tmp_path / "job-away")
    recorded = manifest.read_text()
    manifest.write_text(json.dumps({**json.loads(recorded), "state": "RUNNING"}))
    lost = snapshot(npa_home)
    res = run_npa(*submit, "--resume-run", run_id, env=env)
    assert res.code == 2 and "unknown to the backend" in res.stderr, res.stdout + res.stderr
    assert snapshot(npa_home) == lost, "the refused resume wrote something"
    manifest.write_text(recorded)
    (tmp_path / "job-away").rename(jobs / str(job_id))

    # A resume that goes on records a new job, and the run's submitted time stays its own.
    resumed = run_npa(*submit, "--resume-run", run_id, "--json", env=env)
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    again = run_npa(*WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
                    "--json", env=env)  # fmt: skip
    assert json.loads(again.stdout.splitlines()[-1])["state"] == "FAILED", again.stdout
    assert json.loads(receipt.read_text())["submitted_at"] == submitted_at
    assert json.loads(receipt.read_text())["job"]["job_id"] != str(job_id)
