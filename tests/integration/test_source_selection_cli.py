"""What submit and stage-source stage, end to end: the real CLI, the local store and backend."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")


def prepare(spec: Path, env: dict[str, str]) -> str:
    r = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env)
    assert r.code == 0, r.stderr
    return r.stdout.strip()


def committed(store: Path, run_id: str) -> list[str]:
    manifest = store / "tiny-local" / run_id / "npa-workflow" / "source" / "manifest.json"
    return sorted(f["path"] for f in json.loads(manifest.read_text())["files"])


def wait_final(prefix: Path, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest: dict[str, Any] = json.loads((prefix / "manifest.json").read_text())
        if manifest["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return manifest
        time.sleep(0.1)
    raise AssertionError("the run did not finish")


def test_a_spec_in_home_with_the_default_npa_home_submits(npa_home: Path) -> None:
    """~/.npa sits inside the spec's directory and changes while submit runs (journals, the
    hash index, the store): it is left out, so staging neither fails nor uploads npa's state."""
    home = npa_home.parent
    spec = home / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", spec)
    (home / "notes.txt").write_text("mine\n")
    # NPA_HOME unset: the default ~/.npa under this HOME.
    env = {"HOME": str(home), "NPA_HOME": ""}
    run_id = prepare(spec, env)
    assert (npa_home / "runs").is_dir()  # the default root is in use, inside the tree

    r = run_npa(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
                "--runtime", "process", env=env)  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert f"source {home} staged: 2 files" in r.stdout

    js = run_npa(*WF, "stage-source", str(spec), "--project", "demo", "--run-id", run_id,
                 "--json", env=env).json()  # fmt: skip
    assert js["source"] == str(home) and js["files"] == 2 and js["already_committed"]
    assert js["left_out"] == [".npa"]
    assert committed(npa_home / "store", run_id) == ["notes.txt", "tiny-local.yaml"]
    prefix = npa_home / "store" / "tiny-local" / run_id / "npa-workflow"
    assert wait_final(prefix)["state"] == "SUCCEEDED"


def test_credentials_are_refused_until_the_user_chooses(npa_home: Path, tmp_path: Path) -> None:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    tree = tmp_path / "workflow"
    tree.mkdir()
    spec = tree / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", spec)
    (tree / ".env").write_text("REGISTRY_PASSWORD=hunter2-secret\n")
    (tree / "keys").mkdir()
    (tree / "keys" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    run_id = prepare(spec, env)
    stage = (*WF, "stage-source", str(spec), "--project", "demo", "--run-id", run_id)

    r = run_npa(*stage, env=env)
    assert r.code == 2, r.stdout + r.stderr
    assert ".env, keys/id_ed25519" in r.stderr and "Traceback" not in r.stderr
    assert f"printf '%s\\n' '.env' 'keys/id_ed25519' >> {tree / '.npaignore'}" in r.stderr
    refused = run_npa(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
                      "--runtime", "process", "--json", env=env)  # fmt: skip
    assert refused.code == 2 and refused.json()["error"]["details"]["credentials"] == [
        ".env",
        "keys/id_ed25519",
    ]
    assert not (npa_home / "store" / "tiny-local" / run_id / "npa-workflow" / "source").exists()

    # The user's choice, in the file the message named: the key stays home, .env goes.
    (tree / ".npaignore").write_text("keys/\n!.env\n")
    r = run_npa(*stage, "--json", env=env)
    assert r.code == 0, r.stdout + r.stderr
    assert committed(npa_home / "store", run_id) == [".env", ".npaignore", "tiny-local.yaml"]


def test_a_file_store_inside_the_tree_is_never_staged(npa_home: Path, tmp_path: Path) -> None:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    tree = tmp_path / "workflow"
    store = tree / "runs-store"
    tree.mkdir()
    spec = tree / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", spec)
    r = run_npa("configure", "--project", "demo", "--store", store.as_uri(), env=env)
    assert r.code == 0, r.stderr
    run_id = prepare(spec, env)
    (store / "leftover").mkdir(parents=True)
    (store / "leftover" / "object").write_text("old run data")
    r = run_npa(*WF, "stage-source", str(spec), "--project", "demo", "--run-id", run_id,
                "--json", env=env)  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["left_out"] == ["runs-store"]
    assert committed(store, run_id) == ["tiny-local.yaml"]
