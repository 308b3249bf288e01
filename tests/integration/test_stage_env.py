"""A stage's environment is built, never inherited (docs/spec.md, "A stage's environment").

Canary credentials are planted in the environment ``submit`` runs in; a real local run dumps,
from inside every shard, the environment its command was given. No canary may appear there, by
name or by value, and the names must be the documented ones: the base (``PATH``, ``HOME``,
``LANG``, ``TZ``), the contract's ``NPA_*``, the stage's own ``env`` and its declared
``secrets``. In a container the image's own variables and the few the engine sets for every
container come on top (named below); nothing of the submitter's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.images import busybox_rootfs
from tests.harness.registry import Registry
from tests.harness.tools import require_tool

pytestmark = pytest.mark.integration

WORKFLOW = "env-probe"
TERMINAL = {
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "FAILED_SETUP",
    "FAILED_STARTUP",
    "FAILED_CONTROLLER",
}
# What the submitter's shell holds and no stage may see.
CANARIES = {
    "CANARY_SECRET": "canary-secret-7d1e0b5a",
    "AWS_SECRET_ACCESS_KEY": "canaryAWSsecret0123456789abcdef",
    "AWS_ACCESS_KEY_ID": "AKIACANARY0123456789",
    "GITHUB_TOKEN": "ghp_canary0123456789abcdefghij",
    # Proxies in both spellings: a stage sees one only when its spec declares it.
    "HTTPS_PROXY": "http://canary-proxy.invalid:3128",
    "https_proxy": "http://canary-proxy-lower.invalid:3128",
    "HTTP_PROXY": "http://canary-http-proxy.invalid:3128",
    "http_proxy": "http://canary-http-proxy-lower.invalid:3128",
    "NO_PROXY": "canary-no-proxy.invalid",
    "no_proxy": "canary-no-proxy-lower.invalid",
}
# The documented base every stage gets, on every backend and runtime.
BASE = {"PATH", "HOME", "LANG", "TZ"}
# What /bin/sh adds to its own environment before the probe runs `env`.
SHELL_ADDS = {"PWD", "SHLVL", "OLDPWD", "_"}
# What podman sets in every container, whatever the caller asks: the hostname, `container` and
# TERM (its default, even without a terminal).
ENGINE_ADDS = {"HOSTNAME", "container", "TERM"}
SECRET_VALUE = "stage-secret-value-5c2f9e"

SPEC = """\
apiVersion: npa/v1
kind: Workflow
metadata:
  name: env-probe
tools:
  shell:
    image: {image}
stages:
  - name: probe
    tool: shell
    command: >-
      env > "$NPA_OUTPUT_SEEN/env-$NPA_SHARD.txt" &&
      echo "$HOME" > "$NPA_OUTPUT_SEEN/home-$NPA_SHARD.txt" &&
      touch "$HOME/written" &&
      {secret_check}
    env:
      GREETING: hello{extra_env}
    {secrets}
    outputs:
      - name: seen
        path: seen/
    waves:
      shards: 2
      parallel: 2
    resources:
      cpus: 1
      disk_gib: 1
"""


def contract_names(secrets: set[str]) -> set[str]:
    """Every variable npa gives the probe stage: the one table this test checks against."""
    return BASE | secrets | {
        "NPA_WORKFLOW", "NPA_RUN_ID", "NPA_STAGE", "NPA_RUN_PREFIX", "NPA_SOURCE_DIR",
        "NPA_WAVES", "NPA_SHARDS", "NPA_SHARDS_PER_WAVE", "NPA_WAVE", "NPA_SHARD", "NPA_ATTEMPT",
        "NPA_OUTPUT_SEEN", "GREETING",
    }  # fmt: skip


# Proxies a spec declares: two written in its env, one from the submitter's shell as a secret (a
# proxy URL can carry a password).
DECLARED_PROXY_ENV = {"HTTP_PROXY": "http://declared-proxy.invalid:8080", "no_proxy": ".internal"}
DECLARED_PROXY_SECRET = "http://robot:proxy-pw-3e8d@declared-secret-proxy.invalid:3128"


def write_spec(folder: Path, image: str, *, secret: bool, proxies: bool = False) -> Path:
    """The probe spec; with ``proxies`` it declares :data:`DECLARED_PROXY_ENV` in its env and
    ``HTTPS_PROXY`` as a secret read from the submitter's ``PROBE_PROXY``."""
    folder.mkdir()
    spec = folder / "env-probe.yaml"
    # The stage compares the secret's digest, so neither the spec nor an output holds it.
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
    check = (
        f'[ "$(printf %s "$API_TOKEN" | sha256sum | cut -c1-64)" = {digest} ]' if secret else "true"
    )
    declared = {"API_TOKEN": "env:PROBE_API_TOKEN"} if secret else {}
    declared |= {"HTTPS_PROXY": "env:PROBE_PROXY"} if proxies else {}
    secrets = "".join(f"\n      {k}: {v}" for k, v in declared.items())
    extra = "".join(f"\n      {k}: {v}" for k, v in DECLARED_PROXY_ENV.items()) if proxies else ""
    spec.write_text(
        SPEC.format(
            image=image,
            secret_check=check,
            secrets=f"secrets:{secrets}" if secrets else "",
            extra_env=extra,
        )
    )
    return spec


def run_dir(npa_home: Path, run_id: str) -> Path:
    return npa_home / "store" / WORKFLOW / run_id / "npa-workflow"


def wait_manifest(prefix: Path, timeout: float = 300) -> dict[str, Any]:
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


def run_probe(spec: Path, env: dict[str, str], npa_home: Path, runtime: str, *extra: str) -> str:
    prepared = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", "demo", env=env
    )  # fmt: skip
    assert prepared.code == 0, prepared.stderr
    run_id = prepared.stdout.strip()
    submitted = run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "demo", "--run-id", run_id,
        "--runtime", runtime, "--json", *extra, env=env,
    )  # fmt: skip
    assert submitted.code == 0, submitted.stdout + submitted.stderr
    manifest = wait_manifest(run_dir(npa_home, run_id))
    assert manifest["state"] == "SUCCEEDED", json.dumps(manifest, indent=1)
    return run_id


def seen_envs(npa_home: Path, run_id: str) -> list[dict[str, str]]:
    seen = run_dir(npa_home, run_id) / "stages" / "probe" / "outputs" / "seen"
    found = []
    for shard in (0, 1):
        lines = (seen / f"env-{shard}.txt").read_text().splitlines()
        found.append(dict(line.split("=", 1) for line in lines if "=" in line))
        home = (seen / f"home-{shard}.txt").read_text().strip()
        assert home.endswith("/home"), home  # the shard's own home folder, not the submitter's
    return found


def assert_no_canary(env: dict[str, str], declared: frozenset[str] = frozenset()) -> None:
    """No canary in ``env`` by value, nor by name unless the spec ``declared`` that name."""
    for name, value in CANARIES.items():
        assert name in declared or name not in env, f"the stage saw {name}"
        assert all(value not in v for v in env.values()), f"the stage saw the value of {name}"
    # The submitter's own variables npa itself runs with: none reaches the stage either.
    for name in ("PYTHONPATH", "NPA_HOME", "VIRTUAL_ENV"):
        assert name not in env, f"the stage saw {name}"


@pytest.fixture
def submitter(npa_home: Path) -> dict[str, str]:
    """The submitting shell: npa's home, and credentials no stage may see."""
    return {
        "NPA_HOME": str(npa_home),
        "HOME": str(npa_home.parent),
        **CANARIES,
        "PROBE_API_TOKEN": SECRET_VALUE,
        "PROBE_PROXY": DECLARED_PROXY_SECRET,
        "VIRTUAL_ENV": "/canary/venv",
    }


def test_a_host_process_stage_sees_only_its_built_environment(
    tmp_path: Path, npa_home: Path, submitter: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "workflow", "registry.example.com/shell:1", secret=False)
    run_id = run_probe(spec, submitter, npa_home, "process")
    for env in seen_envs(npa_home, run_id):
        assert_no_canary(env)
        assert set(env) - SHELL_ADDS == contract_names(set()), sorted(env)
        assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assert (env["LANG"], env["TZ"]) == ("C.UTF-8", "UTC")
        assert env["GREETING"] == "hello"


def test_a_declared_secret_reaches_the_stage_and_no_file(
    tmp_path: Path, npa_home: Path, submitter: dict[str, str]
) -> None:
    """``secrets: {API_TOKEN: env:PROBE_API_TOKEN}``: the stage gets the value under its own
    name (the stage checks it); the source variable itself stays out, and the value is in no
    file npa wrote."""
    spec = write_spec(tmp_path / "workflow", "registry.example.com/shell:1", secret=True)
    run_id = run_probe(spec, submitter, npa_home, "process")
    for env in seen_envs(npa_home, run_id):
        assert_no_canary(env)
        assert "PROBE_API_TOKEN" not in env
        assert set(env) - SHELL_ADDS == contract_names({"API_TOKEN"}), sorted(env)
    for path in npa_home.rglob("*"):
        if path.is_file() and "seen" not in path.parts:
            assert SECRET_VALUE.encode() not in path.read_bytes(), path


def test_a_missing_secret_source_is_refused_before_launch(
    tmp_path: Path, npa_home: Path, submitter: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "workflow", "registry.example.com/shell:1", secret=True)
    env = {k: v for k, v in submitter.items() if k != "PROBE_API_TOKEN"}
    prepared = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", "demo", env=env
    )  # fmt: skip
    assert prepared.code == 0, prepared.stderr
    submitted = run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "demo",
        "--run-id", prepared.stdout.strip(), "--runtime", "process", "--json",
        env={**env, "PROBE_API_TOKEN": ""},
    )  # fmt: skip
    assert submitted.code != 0, submitted.stdout
    said = submitted.stdout + submitted.stderr
    assert "PROBE_API_TOKEN" in said and "API_TOKEN" in said, said
    assert not (npa_home / "local-jobs").exists() or not any((npa_home / "local-jobs").iterdir())


def test_proxies_reach_a_stage_only_when_its_spec_declares_them(
    tmp_path: Path, npa_home: Path, submitter: dict[str, str]
) -> None:
    """The submitter holds every proxy variable in both spellings; the stage sees the ones its
    spec declares (written in its env, or a secret read from a named variable), with the
    declared values, and none of the others."""
    spec = write_spec(tmp_path / "workflow", "registry.example.com/shell:1", secret=False,
                      proxies=True)  # fmt: skip
    run_id = run_probe(spec, submitter, npa_home, "process")
    declared = frozenset({*DECLARED_PROXY_ENV, "HTTPS_PROXY"})
    for env in seen_envs(npa_home, run_id):
        assert_no_canary(env, declared)
        assert set(env) - SHELL_ADDS == contract_names(set()) | declared, sorted(env)
        assert {k: env[k] for k in DECLARED_PROXY_ENV} == DECLARED_PROXY_ENV
        assert env["HTTPS_PROXY"] == DECLARED_PROXY_SECRET


def test_a_skypilot_task_carries_only_the_declared_proxies(
    tmp_path: Path, npa_home: Path, submitter: dict[str, str]
) -> None:
    """The tasks ``render`` writes for SkyPilot (byte for byte what ``submit`` launches): the
    declared proxies in the envs, the secret one by reference to the run's Secret, and nothing
    of the submitter's proxies, by name or by value, anywhere in the files."""
    from npa.adapters.storage.stage_scope import SCOPED_VARIABLES
    from npa.backends.skypilot.tasks import SECRET_PREFIX

    pinned = "registry.example.com/shell@sha256:" + "ab" * 32
    spec = write_spec(tmp_path / "workflow", pinned, secret=False, proxies=True)
    prepared = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", "demo", env=submitter
    )  # fmt: skip
    assert prepared.code == 0, prepared.stderr
    out = tmp_path / "sky"
    rendered = run_npa(
        "workbench", "workflow", "render", str(spec), "--run-id", prepared.stdout.strip(),
        "--out", str(out), "--project", "review-only", "--context", "kind-npa",
        "--store-uri", "s3://npa-env/workflows", "--json", env=submitter,
    )  # fmt: skip
    assert rendered.code == 0, rendered.stdout + rendered.stderr
    files = sorted(out.rglob("*.yaml"))
    tasks = 0
    for path in files:
        text = path.read_text()
        for name, value in CANARIES.items():
            assert value not in text, f"{path} holds the submitter's {name}"
        assert DECLARED_PROXY_SECRET not in text, path  # the secret travels by reference
        for task in yaml.safe_load_all(text):
            if not task or "envs" not in task:
                continue
            envs = task["envs"]
            proxies = {k: v for k, v in envs.items() if k.lower().endswith("_proxy")}
            assert proxies == DECLARED_PROXY_ENV, envs
            pod = task["config"]["kubernetes"]["pod_config"]["spec"]["containers"][0]
            refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in pod.get("env", [])}
            carried = {k: r["key"] for k, r in refs.items() if k.startswith(SECRET_PREFIX)}
            assert carried == {f"{SECRET_PREFIX}HTTPS_PROXY": "PROBE_PROXY"}, pod
            # Beside it, only the optional references to run-scoped store credentials.
            store = {k: r for k, r in refs.items() if not k.startswith(SECRET_PREFIX)}
            assert set(store) == set(SCOPED_VARIABLES), pod
            assert all(r["optional"] and r["key"] == f"npa.store.{k}" for k, r in store.items())
            tasks += 1
    assert tasks == 1, files  # the probe's one wave task was read


@pytest.fixture
def image(registry: Registry) -> str:
    pushed = registry.push_image(
        f"npa-tests/env-{uuid.uuid4().hex[:8]}", "1", layer=busybox_rootfs()
    )
    return f"{registry.host}/{pushed.repository}@{pushed.digest}"


def test_a_container_stage_sees_only_its_built_environment_and_its_image(
    tmp_path: Path, npa_home: Path, submitter: dict[str, str], registry: Registry, image: str
) -> None:
    podman = require_tool("NPA_PODMAN_BIN", "podman")
    env = {
        **submitter,
        "PATH": f"{podman.parent}:{os.environ.get('PATH', '')}",
        "REG_AUTH": f"{registry.auth[0]}:{registry.auth[1]}",
    }
    spec = write_spec(tmp_path / "workflow", image, secret=True)
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    run_id = run_probe(spec, env, npa_home, "container", auth)
    for seen in seen_envs(npa_home, run_id):
        assert_no_canary(seen)
        assert "REG_AUTH" not in seen
        assert all(registry.auth[1] not in v for v in seen.values())
        assert set(seen) - SHELL_ADDS - ENGINE_ADDS == contract_names({"API_TOKEN"}), sorted(seen)
        assert seen["HOME"] == "/npa/home" and seen["LANG"] == "C.UTF-8"
