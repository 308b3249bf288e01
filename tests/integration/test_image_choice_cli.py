"""Which image a tool runs, the same everywhere: preflight-images, render and submit on every
--infra, through the real CLI against the real registry."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.registry import Registry
from tests.integration.imagespec import push_attested, write_spec

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def env_for(registry: Registry, npa_home: Path) -> dict[str, str]:
    return {"REG_AUTH": f"{registry.auth[0]}:{registry.auth[1]}", "NPA_HOME": str(npa_home)}


def image_of(out: Path, stage: str) -> str:
    task = yaml.safe_load((out / f"{stage}.yaml").read_text())
    return str(task["resources"]["image_id"])


def test_render_pins_what_preflight_verified_with_overrides(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    declared, chosen = push_attested(registry, "declared"), push_attested(registry, "chosen")
    namespace, short = chosen.repository.split("/", 1)
    spec = write_spec(
        tmp_path / "spec.yaml", {"tool": {"image": f"{registry.host}/{declared.repository}:v1"}}
    )
    env = env_for(registry, npa_home)
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    override = f"tool={short}:v1"  # a short name, resolved under --registry
    registry_flag = ("--registry", f"{registry.host}/{namespace}")
    pre = run_npa(*WF, "preflight-images", str(spec), auth, *registry_flag,
                  "--image-override", override, "--json", env=env)  # fmt: skip
    assert pre.code == 0, pre.stdout + pre.stderr
    pinned = pre.json()["digests"]["tool"]
    assert pinned == f"{registry.host}/{chosen.repository}@{chosen.digest}"
    verified = tmp_path / "preflight.json"
    verified.write_text(pre.stdout)

    render = (*WF, "render", str(spec), "--run-id", "r1", "--context", "ctx",
              "--store-uri", "s3://bucket/runs")  # fmt: skip
    # preflight's own output: pinned exactly as verified, with or without the same override.
    for extra in ((), ("--image-override", override)):
        out = tmp_path / f"out{len(extra)}"
        res = run_npa(*render, "--out", str(out), "--digests", str(verified), *extra, env=env)
        assert res.code == 0, res.stdout + res.stderr
        assert image_of(out, "stage-0") == f"docker:{pinned}"
    # A plain map of its digests needs the override to say which image they are for.
    plain = tmp_path / "digests.yaml"
    plain.write_text(yaml.safe_dump(pre.json()["digests"]))
    refused = run_npa(*render, "--out", str(tmp_path / "x"), "--digests", str(plain), env=env)
    assert refused.code == 2 and "--image-override" in refused.stderr
    res = run_npa(*render, "--out", str(tmp_path / "out-plain"), "--digests", str(plain),
                  "--image-override", override, env=env)  # fmt: skip
    assert res.code == 0, res.stdout + res.stderr
    assert image_of(tmp_path / "out-plain", "stage-0") == f"docker:{pinned}"
    # An override that contradicts what preflight verified is refused.
    declared_ref = f"tool={registry.host}/{declared.repository}:v1"
    other = run_npa(*render, "--out", str(tmp_path / "y"), "--digests", str(verified),
                    "--image-override", declared_ref, env=env)  # fmt: skip
    assert other.code == 2 and "preflight verified" in other.stderr
    assert json.loads(verified.read_text())["images"][0]["source"] == "override"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--image-override", "ghost=registry.example.com/x:1"), "unknown tool 'ghost'"),
        (("--image-override", "shell=Not A Ref"), "malformed"),
        (("--image", "UPPER/Case:1"), "malformed"),
        (("--image-override", "shell=a:1", "--image-override", "shell=b:1"), "twice"),
    ],
)
def test_submit_refuses_a_bad_image_choice_on_the_local_backend_too(
    npa_home: Path, tmp_path: Path, flags: tuple[str, ...], needle: str
) -> None:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    spec = tmp_path / "tiny-local.yaml"
    shutil.copy(EXAMPLES / "tiny-local.yaml", spec)
    run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    res = run_npa(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
                  "--infra", "local", *flags, "--json", env=env)  # fmt: skip
    assert res.code == 1, res.stdout + res.stderr
    gates = {g["name"]: g for g in res.json()["error"]["details"]["gates"]}
    assert gates["image-overrides"]["status"] == "failed"
    assert needle in gates["image-overrides"]["detail"]
    assert not (npa_home / "store" / "tiny-local" / run_id).exists()
    assert not (npa_home / "local-jobs").exists()
