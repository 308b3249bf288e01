"""One stage contract on every backend (docs/spec.md, "The stage contract").

The same multi-wave, multi-shard spec runs on the local backend as host processes and in its
image through real podman (pulled by digest from the harness registry with credentials), and is
rendered for SkyPilot (loaded by SkyPilot's own task loader). Every variable, path and working
directory the stage sees is checked against one table, :func:`expected`; the local runs'
outputs are compared with each other; what ``submit`` launched is compared byte for byte with
what ``render --run-id`` writes for the same run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.images import busybox_rootfs
from tests.harness.registry import Registry
from tests.harness.s3 import S3Server
from tests.harness.tools import in_ci, require_tool

pytestmark = pytest.mark.integration

WORKFLOW = "contract-demo"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_SETUP", "FAILED_STARTUP"}
SHARDS, PARALLEL = 4, 2  # two waves of two shards
WAVES = SHARDS // PARALLEL

# The stage's probe (a file of the run's source): every NPA_ variable, the base npa sets, the
# stage's own, any AWS_ variable (a pod's store credentials are the stage library's, never the
# command's), and its working directory, with the shard's root folder written as /npa (a host
# process's contract paths differ from the image's by that root and nothing else: the
# comparison proves it).
PROBE = """\
root=${NPA_SOURCE_DIR%/source}
{ env | grep -e '^NPA_' -e '^GREETING=' -e '^HOME=' -e '^LANG=' -e '^TZ=' -e '^AWS_' | sort
  echo "PWD=$(pwd)"; } | sed "s#$root/#/npa/#g" > "$1"
"""

SPEC = """\
apiVersion: npa/v1
kind: Workflow
metadata:
  name: contract-demo
tools:
  shell:
    image: {image}
stages:
  - name: split
    tool: shell
    command: >-
      sh probe.sh "$NPA_OUTPUT_PARTS/env-$NPA_SHARD.txt" &&
      awk -v s="$NPA_SHARD" '{{ print $1 * (s + 1) }}' data/numbers.txt
      > "$NPA_OUTPUT_PARTS/part-$NPA_SHARD.txt"
    env:
      GREETING: "hello 'contract' $HOME"
    outputs:
      - name: parts
        path: parts/
    waves:
      shards: {shards}
      parallel: {parallel}
    resources:
      cpus: 1
      disk_gib: 1
  - name: merge
    tool: shell
    command: >-
      sh probe.sh "$NPA_OUTPUT_SEEN/env.txt" &&
      cat "$NPA_INPUT_PARTS"/part-*.txt | awk '{{ s += $1 }} END {{ print s }}'
      > "$NPA_OUTPUT_TOTAL"
    inputs:
      - name: parts
        from: split.parts
    outputs:
      - name: total
        path: total.txt
        kind: file
      - name: seen
        path: seen/
    resources:
      cpus: 1
      disk_gib: 1
"""


def expected(stage: str, run_id: str, run_prefix: str) -> dict[str, str]:
    """What every shard of ``stage`` sees, on every backend (NPA_WAVE, NPA_SHARD and
    NPA_ATTEMPT are added per shard). The one table this test checks against."""
    common = {
        "NPA_WORKFLOW": WORKFLOW,
        "NPA_RUN_ID": run_id,
        "NPA_STAGE": stage,
        "NPA_RUN_PREFIX": run_prefix,
        "NPA_SOURCE_DIR": "/npa/source",
        "PWD": "/npa/source",
        "HOME": "/npa/home",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
    }
    if stage == "split":
        return {
            **common,
            "NPA_WAVES": str(WAVES),
            "NPA_SHARDS": str(SHARDS),
            "NPA_SHARDS_PER_WAVE": str(PARALLEL),
            "NPA_OUTPUT_PARTS": "/npa/outputs/parts",
            "GREETING": "hello 'contract' $HOME",  # the stage's own env, as written
        }
    return {
        **common,
        "NPA_WAVES": "1",
        "NPA_SHARDS": "1",
        "NPA_SHARDS_PER_WAVE": "1",
        "NPA_INPUT_PARTS": "/npa/inputs/parts",
        "NPA_OUTPUT_TOTAL": "/npa/outputs/total.txt",
        "NPA_OUTPUT_SEEN": "/npa/outputs/seen",
    }


def per_shard(wave: int, shard: int) -> dict[str, str]:
    return {"NPA_WAVE": str(wave), "NPA_SHARD": str(shard), "NPA_ATTEMPT": "1"}


@pytest.fixture
def image(registry: Registry) -> str:
    pushed = registry.push_image(
        f"npa-tests/contract-{uuid.uuid4().hex[:8]}", "1", layer=busybox_rootfs()
    )
    return f"{registry.host}/{pushed.repository}@{pushed.digest}"


@pytest.fixture
def env(npa_home: Path, registry: Registry) -> dict[str, str]:
    return {
        "NPA_HOME": str(npa_home),
        "HOME": str(npa_home.parent),
        "REG_AUTH": f"{registry.auth[0]}:{registry.auth[1]}",
    }


def write_spec(folder: Path, image: str) -> Path:
    folder.mkdir()
    (folder / "probe.sh").write_text(PROBE)
    (folder / "data").mkdir()
    (folder / "data" / "numbers.txt").write_text("1\n2\n3\n")
    spec = folder / "contract.yaml"
    spec.write_text(SPEC.format(image=image, shards=SHARDS, parallel=PARALLEL))
    return spec


def run_dir(npa_home: Path, run_id: str) -> Path:
    return npa_home / "store" / WORKFLOW / run_id / "npa-workflow"


def wait_manifest(prefix: Path, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    manifest: dict[str, Any] = {}
    while time.monotonic() < deadline:
        path = prefix / "manifest.json"
        if path.exists():
            manifest = json.loads(path.read_text())
            if manifest["state"] in TERMINAL:
                return manifest
        time.sleep(0.1)
    raise AssertionError(f"run did not finish: {manifest.get('state')}")


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def run_locally(
    spec: Path, env: dict[str, str], npa_home: Path, registry: Registry, runtime: str
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Prepare, render and submit one run; returns its id, submit's JSON and its manifest."""
    prepared = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", "demo", env=env
    )  # fmt: skip
    assert prepared.code == 0, prepared.stderr
    run_id = prepared.stdout.strip()
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    # What a person reviews: render for the backend and runtime submit will use.
    review = spec.parent.parent / f"review-{runtime}"
    rendered = run_npa(
        "workbench", "workflow", "render", str(spec), "--run-id", run_id, "--out", str(review),
        "--project", "demo", "--infra", "local", "--runtime", runtime, "--json", env=env,
    )  # fmt: skip
    assert rendered.code == 0, rendered.stdout + rendered.stderr
    assert rendered.json()["store_source"] == "reservation"
    submitted = run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "demo", "--run-id", run_id,
        "--runtime", runtime, auth, "--json", env=env,
    )  # fmt: skip
    assert submitted.code == 0, submitted.stdout + submitted.stderr
    out = submitted.json()
    assert out["runtime"] == runtime
    manifest = wait_manifest(run_dir(npa_home, run_id))
    assert manifest["state"] == "SUCCEEDED", json.dumps(manifest, indent=1)

    # What launched is byte for byte what was reviewed, and the receipt says which bytes.
    prefix = run_dir(npa_home, run_id)
    receipt = json.loads(Path(out["receipt"]).read_text())
    for stage in ("split", "merge"):
        launched = (prefix / "tasks" / f"{stage}.json").read_bytes()
        assert launched == (review / f"{stage}.json").read_bytes()
        assert receipt["tasks"][stage] == hashlib.sha256(launched).hexdigest()
        assert out["task_sha256"][stage] == receipt["tasks"][stage]
    assert receipt["runtime"] == runtime
    # plan-spec and status read the same prefix render and submit used.
    planned = run_npa(
        "workbench", "workflow", "plan-spec", str(spec), "--run-id", run_id, "--target", "local",
        "--project", "demo", "--json", env=env,
    )  # fmt: skip
    assert planned.code == 0, planned.stdout + planned.stderr
    assert planned.json()["store_source"] == "reservation"
    assert f"{planned.json()['plan']['run_prefix']}/npa-workflow" == out["run_prefix"]
    status = run_npa(
        "workbench", "workflow", "status", run_id, "--project", "demo", "--json", env=env
    )  # fmt: skip
    assert status.code == 0, status.stdout + status.stderr
    assert str(prefix.parent) in json.dumps(status.json())
    return run_id, out, manifest


def check_local_contract(npa_home: Path, run_id: str, prefix_uri: str) -> dict[str, str]:
    """Every shard's view against the table; returns the stage outputs by name."""
    prefix = run_dir(npa_home, run_id)
    parts = prefix / "stages" / "split" / "outputs" / "parts"
    for wave in range(WAVES):
        for shard in range(wave * PARALLEL, (wave + 1) * PARALLEL):
            seen = env_file(parts / f"env-{shard}.txt")
            want = {**expected("split", run_id, prefix_uri), **per_shard(wave, shard)}
            assert seen == want, (shard, seen)
    seen = env_file(prefix / "stages" / "merge" / "outputs" / "seen" / "env.txt")
    assert seen == {**expected("merge", run_id, prefix_uri), **per_shard(0, 0)}
    return {
        **{f"part-{s}": (parts / f"part-{s}.txt").read_text() for s in range(SHARDS)},
        "total": (prefix / "stages" / "merge" / "outputs" / "total.txt").read_text(),
    }


def sky_tasks(folder: Path, stage: str) -> list[Any]:
    import sky  # slow to import; only here

    docs = list(yaml.safe_load_all((folder / f"{stage}.yaml").read_text()))
    return [sky.Task.from_yaml_config(copy.deepcopy(doc)) for doc in docs]


def test_one_contract_on_local_processes_containers_and_skypilot(
    tmp_path: Path, npa_home: Path, env: dict[str, str], registry: Registry, image: str
) -> None:
    podman = require_tool("NPA_PODMAN_BIN", "podman")
    env = {**env, "PATH": f"{podman.parent}:{os.environ.get('PATH', '')}"}
    spec = write_spec(tmp_path / "workflow", image)

    outputs, runs = {}, {}
    for runtime in ("process", "container"):
        run_id, out, manifest = run_locally(spec, env, npa_home, registry, runtime)
        runs[runtime] = run_id
        prefix_uri = out["run_prefix"].rsplit("/", 1)[0]  # the run's root, as NPA_RUN_PREFIX
        outputs[runtime] = check_local_contract(npa_home, run_id, prefix_uri)
        waves = manifest["stages"]["split"]["waves"]
        assert [(w["wave"], w["shards"]) for w in waves] == [(0, [0, 1]), (1, [2, 3])]
    # The same outputs from host processes and from the image.
    assert outputs["process"] == outputs["container"]
    assert outputs["container"]["total"].strip() == str(6 * (1 + 2 + 3 + 4))
    assert all(outputs["container"][f"part-{s}"] == part(s) for s in range(SHARDS))

    # What the two runs launched differently: the runtime of each task, nothing else.
    differ = run_npa(
        "workbench", "workflow", "diff", runs["process"], runs["container"], "--project", "demo",
        "--json", env=env,
    )  # fmt: skip
    assert differ.code == 1, differ.stdout + differ.stderr
    assert differ.json()["changed"] == ["merge.json", "split.json"]
    assert '-  "runtime": "process"' in differ.json()["diff"]
    assert '+  "runtime": "container"' in differ.json()["diff"]
    # Another run of the same spec, source and runtime launched the same, run ids aside.
    again, _, _ = run_locally(spec, env, npa_home, registry, "process")
    same = run_npa(
        "workbench", "workflow", "diff", runs["process"], again, "--project", "demo", env=env
    )  # fmt: skip
    assert same.code == 0, same.stdout + same.stderr
    assert "launched the same tasks" in same.stdout

    # The SkyPilot rendering of the same spec and run: the same waves and shards, the same
    # fixed variables, NPA_WAVE per wave task; NPA_SHARD comes from the node's rank.
    store = "s3://npa-contract/workflows"
    sky_out = tmp_path / "sky"
    rendered = run_npa(
        "workbench", "workflow", "render", str(spec), "--run-id", run_id, "--out", str(sky_out),
        "--project", "review-only", "--context", "kind-npa", "--store-uri", store, "--json",
        env=env,
    )  # fmt: skip
    assert rendered.code == 0, rendered.stdout + rendered.stderr
    sky_prefix = f"{store}/{WORKFLOW}/{run_id}"
    for stage, waves in (("split", WAVES), ("merge", 1)):
        tasks = sky_tasks(sky_out, stage)
        assert len(tasks) == waves
        for wave, task in enumerate(tasks):
            table = expected(stage, run_id, sky_prefix)
            assert task.num_nodes == (PARALLEL if stage == "split" else 1)
            # HOME is the run script's to give the command (SkyPilot's setup reads the envs).
            fixed = {k: v for k, v in table.items() if k not in ("PWD", "HOME")}
            assert task.envs == {**fixed, "NPA_WAVE": str(wave)}
            # The run script sets the shard from the node rank and runs in the source tree.
            assert "npa_shard " in task.run and f"npa_command {table['HOME']} " in task.run
            assert not task.file_mounts and task.workdir is None
    from npa.core.templates import templates_dir

    library = (templates_dir() / "skypilot-stage.sh").read_text()
    assert "NPA_SHARD=$((NPA_WAVE * NPA_SHARDS_PER_WAVE + ${SKYPILOT_NODE_RANK:-0}))" in library
    assert f'cd {expected("split", "", "")["PWD"]} && unset "$@" && HOME=$_npa_home' in library


# --- the SkyPilot side, run -----------------------------------------------------------------

# One SkyPilot node: a private mount namespace whose root is an overlay of this machine's, with
# its own /tmp, so the task's setup and run make /npa as in a pod and nothing reaches the host.
# SkyPilot runs a task's setup, then its run, with bash on every node, with the task's envs and
# the node's rank; that is what this does, with the texts SkyPilot's loader read.
NODE = """\
set -e
mount -t tmpfs node "$1"
mkdir "$1/upper" "$1/work" "$1/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$1/upper,workdir=$1/work" "$1/root"
mount --rbind /proc "$1/root/proc"
mount --rbind /dev "$1/root/dev"
mount -t tmpfs tmp "$1/root/tmp"
# The tools the node borrows from the host (the venv's aws CLI) stay visible when the checkout
# is under /tmp, which the node's own /tmp would hide.
case "$2" in /tmp/*) mkdir -p "$1/root$2" && mount --rbind "$2" "$1/root$2" ;; esac
exec chroot "$1/root" /bin/bash -c \\
  'cd / && setup=$SKY_SETUP run=$SKY_RUN && unset SKY_SETUP SKY_RUN &&
   /bin/bash -c "$setup" && exec /bin/bash -c "$run"'
"""


def part(shard: int) -> str:
    """What shard ``shard`` of split writes, on every backend."""
    return "".join(f"{n * (shard + 1)}\n" for n in (1, 2, 3))


def node_sandbox_works(tmp_path: Path) -> bool:
    probe = tmp_path / "probe-node"
    probe.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
         f'mount -t tmpfs t "{probe}" && mkdir "{probe}/x"'],
        capture_output=True,
    )  # fmt: skip
    return done.returncode == 0


def run_wave(task: Any, env: dict[str, str], folder: Path) -> list[subprocess.CompletedProcess]:
    """Every node of one wave task at once; their results in rank order."""
    children = []
    for rank in range(task.num_nodes):
        sandbox = folder / f"{task.name}-node{rank}"
        sandbox.mkdir()
        node_env = {
            **env,
            **task.envs,
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NUM_NODES": str(task.num_nodes),
            "SKY_SETUP": task.setup,
            "SKY_RUN": task.run,
        }
        argv = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", NODE, "node"]
        children.append(
            subprocess.Popen(
                [*argv, str(sandbox), sys.prefix],
                env=node_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = []
    for child in children:
        out, _ = child.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(child.args, child.returncode, out, ""))
    return results


def test_skypilot_tasks_give_the_same_contract_when_run(
    tmp_path: Path, npa_home: Path, s3: S3Server
) -> None:
    """The rendered SkyPilot tasks, run node by node as SkyPilot runs them, against moto's S3:
    the source restored as files, inputs and outputs through the store, the same table."""
    if not node_sandbox_works(tmp_path):
        # As for a missing tool: skipped on a developer's machine without the right to mount,
        # a failure under CI=true, where a skip would hide a broken set-up.
        message = "this machine does not allow a private mount namespace (unshare -m; root)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    bucket = "npa-contract"
    s3.client().create_bucket(Bucket=bucket)
    path = f"/usr/bin:/bin:/usr/sbin:/sbin:{os.environ.get('PATH', '')}"
    env = {**s3.env, "NPA_HOME": str(npa_home), "HOME": str(npa_home.parent), "PATH": path}
    configured = run_npa(
        "configure", "--project", "sky", "--store", f"s3://{bucket}/npa", env=env
    )  # fmt: skip
    assert configured.code == 0, configured.stderr
    image = "registry.example.com/shell@sha256:" + "ab" * 32
    spec = write_spec(tmp_path / "workflow", image)
    prepared = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", "sky", env=env
    )  # fmt: skip
    assert prepared.code == 0, prepared.stderr
    run_id = prepared.stdout.strip()
    staged = run_npa(
        "workbench", "workflow", "stage-source", str(spec), "--project", "sky",
        "--run-id", run_id, env=env,
    )  # fmt: skip
    assert staged.code == 0, staged.stdout + staged.stderr
    out = tmp_path / "sky"
    rendered = run_npa(
        "workbench", "workflow", "render", str(spec), "--run-id", run_id, "--out", str(out),
        "--project", "sky", "--context", "kind-npa", "--json", env=env,
    )  # fmt: skip
    assert rendered.code == 0, rendered.stdout + rendered.stderr
    assert rendered.json()["store_source"] == "reservation"

    nodes = tmp_path / "nodes"
    nodes.mkdir()
    # A pod's environment: the store's credentials and endpoint (from the store Secret), no npa.
    pod_env = {**s3.env, "PATH": path, "HOME": "/root"}
    for stage in ("split", "merge"):
        for task in sky_tasks(out, stage):  # waves in order, a wave's nodes at once
            for result in run_wave(task, pod_env, nodes):
                assert result.returncode == 0, f"{task.name}: {result.stdout}"

    client = s3.client()
    outputs = f"npa/{WORKFLOW}/{run_id}/npa-workflow/stages"

    def stored(key: str) -> str:
        body: bytes = client.get_object(Bucket=bucket, Key=f"{outputs}/{key}")["Body"].read()
        return body.decode()

    prefix_uri = f"s3://{bucket}/npa/{WORKFLOW}/{run_id}"
    for wave in range(WAVES):
        for shard in range(wave * PARALLEL, (wave + 1) * PARALLEL):
            seen = dict(
                line.split("=", 1)
                for line in stored(f"split/outputs/parts/env-{shard}.txt").splitlines()
            )
            assert seen == {**expected("split", run_id, prefix_uri), **per_shard(wave, shard)}
            assert stored(f"split/outputs/parts/part-{shard}.txt") == part(shard)
    seen = dict(line.split("=", 1) for line in stored("merge/outputs/seen/env.txt").splitlines())
    assert seen == {**expected("merge", run_id, prefix_uri), **per_shard(0, 0)}
    assert stored("merge/outputs/total.txt").strip() == str(6 * (1 + 2 + 3 + 4))
    attempts = client.get_object(Bucket=bucket, Key=f"{outputs}/split/attempts/wave-1-shard-3")[
        "Body"
    ].read()
    assert attempts.strip() == b"1"
    assert not any(nodes.glob("*/*")), "a node left files on this machine"
