"""No command holds a descriptor per stage or per file: with ``ulimit -n 256`` the real CLI
renders, validates and plans a workflow of 1,500 stages, stages a source tree of 1,200 files to
a file store and to S3, and runs a workflow of 300 stages on the local backend (whose records are
kept in pages of the manifest). Before the
bound, render held every task file open until all were flushed and stopped at file 251."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import CliResult, run_npa
from tests.harness.s3 import S3Server

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
LIMIT = 256  # descriptors the CLI may hold: far fewer than the stages or files it handles
IMAGE = (
    "docker.io/library/busybox@sha256:"
    "2919d0172f7524b2d8df9e50066a682669e6d170ac0f6a49676d54358fe970b5"
)


def wide_spec(path: Path, name: str, stages: int, command: str = "echo hi") -> Path:
    """A workflow of ``stages`` independent one-line stages."""
    lines = ["apiVersion: npa/v1", "kind: Workflow", "metadata:", f"  name: {name}",
             "tools:", "  shell:", f"    image: {IMAGE}", "stages:"]  # fmt: skip
    for i in range(stages):
        lines += [f"  - name: s{i}", "    tool: shell", f"    command: {command!r}",
                  "    resources:", "      cpus: 1"]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def capped(*args: str, env: dict[str, str]) -> CliResult:
    result = run_npa(*args, env=env, open_files=LIMIT)
    assert result.code == 0, result.stdout + result.stderr
    return result


def test_a_1500_stage_workflow_renders_validates_and_plans_under_ulimit_256(
    npa_home: Path, tmp_path: Path
) -> None:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    spec = wide_spec(tmp_path / "wide.yaml", "wide", 1500)
    out = tmp_path / "tasks"
    capped(*WF, "render", str(spec), "--run-id", "r1", "--infra", "local", "--out", str(out),
           env=env)  # fmt: skip
    rendered = sorted(p.name for p in out.iterdir())
    assert len(rendered) == 1501 and "s1499.json" in rendered and "render.json" in rendered
    assert len(json.loads((out / "render.json").read_text())["files"]) == 1500
    # Rendering again replaces the 1,500 files in one swap, still within the cap.
    capped(*WF, "render", str(spec), "--run-id", "r1", "--infra", "local", "--out", str(out),
           "--diff", str(out), env=env)  # fmt: skip
    assert "1,500 stages" in capped(*WF, "validate-spec", str(spec), env=env).stdout
    plan = capped(*WF, "plan-spec", str(spec), "--run-id", "r1", "--skip-quota", "--json",
                  env=env).json()  # fmt: skip
    assert len(plan["plan"]["order"]) == 1500


def source_tree(root: Path, files: int) -> Path:
    """``files`` small files in 12 folders, beside a one-stage spec."""
    root.mkdir()
    wide_spec(root / "one.yaml", "one", 1)
    for i in range(files - 1):
        folder = root / f"d{i % 12}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.txt").write_text(f"file {i}\n")
    return root / "one.yaml"


def stage_twice(spec: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Prepare a run and stage its source twice (the upload, then the one-request re-run)."""
    run_id = capped(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    stage = (*WF, "stage-source", str(spec), "--project", "demo", "--run-id", run_id, "--json")
    return [capped(*stage, env=env).json() for _ in range(2)]


def test_1200_source_files_stage_to_a_file_store_under_ulimit_256(
    npa_home: Path, tmp_path: Path
) -> None:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    store = tmp_path / "store"
    capped("configure", "--project", "demo", "--store", store.as_uri(), env=env)
    first, again = stage_twice(source_tree(tmp_path / "src", 1200), env)
    assert first["files"] == 1200 and not first["already_committed"]
    assert again["already_committed"] and again["source_digest"] == first["source_digest"]
    assert len(list(store.glob("one/npa-source/blobs/*"))) == 1200


def test_1200_source_files_stage_to_s3_under_ulimit_256(
    npa_home: Path, tmp_path: Path, s3: S3Server
) -> None:
    s3.client().create_bucket(Bucket="bounded")
    env = {**s3.env, "NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    capped("configure", "--project", "demo", "--store", "s3://bounded/npa", env=env)
    first, again = stage_twice(source_tree(tmp_path / "src", 1200), env)
    assert first["files"] == 1200 and not first["already_committed"]
    assert again["already_committed"]
    pages = s3.client().get_paginator("list_objects_v2")
    blobs = [o for p in pages.paginate(Bucket="bounded", Prefix="npa/one/npa-source/blobs/")
             for o in p.get("Contents", [])]  # fmt: skip
    assert len(blobs) == 1200


def test_a_300_stage_run_on_the_local_backend_succeeds_under_ulimit_256(
    npa_home: Path, tmp_path: Path
) -> None:
    """Submit, and the executor it starts (which inherits the cap), run 300 stages one after
    another: a descriptor kept per stage or shard would run out before the end."""
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    tree = tmp_path / "run"
    tree.mkdir()
    spec = wide_spec(tree / "wide.yaml", "widerun", 300, command="true")
    run_id = capped(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    capped(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id, "--infra", "local",
           "--runtime", "process", env=env)  # fmt: skip
    manifest = npa_home / "store" / "widerun" / run_id / "npa-workflow" / "manifest.json"
    state: dict[str, Any] = {}
    deadline = time.monotonic() + 900  # a hang bound: 300 stages take about a minute idle
    while time.monotonic() < deadline:
        state = json.loads(manifest.read_text())
        if state["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.5)
    assert state["state"] == "SUCCEEDED", json.dumps(state)[:2000]
    # A run this large keeps its stage records in pages beside the manifest (each step of a
    # stage rewrote its page, not every record); every reader still sees all 300, in order.
    assert state["stage_pages"] == 3 and state["stages"] == {} and state["order"] == []
    pages = sorted(p.name for p in (manifest.parent / "manifest-pages").iterdir())
    assert pages == ["0000.json", "0001.json", "0002.json", "order.json"]
    shown = capped(*WF, "status", run_id, "--project", "demo", "--json", env=env).json()
    assert shown["state"] == "SUCCEEDED"
    assert list(shown["stages"]) == [f"s{i}" for i in range(300)]
    assert {s["state"] for s in shown["stages"].values()} == {"SUCCEEDED"}
