"""The Pulumi state backend is chosen as the pulumi CLI chooses it: ``PULUMI_BACKEND_URL``, or per
project with ``npa configure --backend-url``; file:// and s3:// (moto over HTTP) with the real
pulumi CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import run_npa
from tests.harness.pulumi import PulumiBackend
from tests.harness.s3 import S3Server

pytestmark = pytest.mark.integration


def _stacks(pulumi: Path, url: str, env: dict[str, str], cwd: Path) -> list[str]:
    """``pulumi stack ls`` of the plain CLI against ``url``."""
    listing = subprocess.run(
        [str(pulumi), "stack", "ls", "--all", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PULUMI_BACKEND_URL": url, "PULUMI_CONFIG_PASSPHRASE": ""},
        cwd=cwd,
        check=True,
    )
    return [s["name"] for s in json.loads(listing.stdout)]


def test_file_backend_from_the_environment_and_per_project(
    npa_home: Path, pulumi_backend: PulumiBackend, tmp_path: Path
) -> None:
    args = ("provision-if-absent", "--project", "envb", "--target", "local", "--yes", "--json")
    applied = run_npa(*args)
    assert applied.code == 0, applied.stderr
    body = applied.json()
    assert (body["backend_url"], body["backend_origin"]) == (
        pulumi_backend.url,
        "$PULUMI_BACKEND_URL",
    )
    assert (pulumi_backend.state_dir / ".pulumi" / "stacks" / "npa" / "envb.local.json").is_file()
    assert not (npa_home / "pulumi").exists()
    # The resume command keeps the backend, whatever the shell exports later.
    assert f"--backend-url {pulumi_backend.url}" in body["resume"]

    # Recorded per project: no flag, no variable, every command uses it.
    team = tmp_path / "team-state"
    recorded = run_npa("configure", "--project", "teamb", "--backend-url", f"file://{team}")
    assert recorded.code == 0, recorded.stderr
    shown = run_npa("configure", "--show", "--project", "teamb", "--json")
    assert shown.json()["projects"][0]["settings"]["backend_url"]["value"] == pulumi_backend.url
    # An empty PULUMI_BACKEND_URL counts as unset, as it does for the pulumi CLI.
    tb = ("provision-if-absent", "--project", "teamb", "--target", "local", "--yes", "--json")
    proc = run_npa(*tb, env={"PULUMI_BACKEND_URL": ""})
    assert proc.code == 0, proc.stderr
    out = proc.json()
    assert (out["backend_url"], out["backend_origin"]) == (f"file://{team}", "npa configure")
    assert (team / ".pulumi" / "stacks" / "npa" / "teamb.local.json").is_file()
    assert _stacks(pulumi_backend.pulumi_bin, f"file://{team}", {}, tmp_path) == [
        "organization/npa/teamb.local"
    ]


def test_s3_backend_on_moto_from_pulumi_backend_url(
    npa_home: Path, pulumi_backend: PulumiBackend, s3: S3Server, tmp_path: Path
) -> None:
    s3.client().create_bucket(Bucket="team-state")
    url = "s3://team-state/pulumi"
    env = {**s3.env, "PULUMI_BACKEND_URL": url}
    args = ("provision-if-absent", "--project", "s3b", "--target", "local")
    preview = run_npa(*args, "--preview", "--json", env=env)
    assert preview.code == 0, preview.stderr
    assert preview.json()["backend_url"] == url
    applied = run_npa(*args, "--yes", "--json", env=env)
    assert applied.code == 0, applied.stderr
    assert applied.json()["mode"] == "applied"
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket="team-state")["Contents"]}
    assert "pulumi/.pulumi/stacks/npa/s3b.local.json" in keys
    assert not any(k.startswith("pulumi/.pulumi/locks/") for k in keys), "a lock was left"
    assert _stacks(pulumi_backend.pulumi_bin, url, s3.env, tmp_path) == [
        "organization/npa/s3b.local"
    ]
    again = run_npa(*args, "--yes", "--json", env=env)
    assert again.code == 0, again.stderr
    assert again.json()["mode"] == "no-changes"
    torn = run_npa("teardown", "--project", "s3b", "--target", "local", "--yes", "--json", env=env)
    assert torn.code == 0, torn.stderr
    assert torn.json()["mode"] == "destroyed"


def test_backend_urls_the_pulumi_cli_does_not_take_are_refused(npa_home: Path) -> None:
    bad = run_npa(
        "provision-if-absent", "--project", "p", "--target", "local", "--backend-url", "ftp://x"
    )
    assert bad.code == 2
    assert "fix: npa provision-if-absent --project p --target local --backend-url file://" in (
        bad.stderr
    )
    assert "BUCKET" not in bad.stderr
    # Pulumi Cloud is a backend the pulumi CLI supports: refused only for want of a login.
    cloud = run_npa(
        "provision-if-absent",
        "--project",
        "p",
        "--target",
        "local",
        "--json",
        env={"PULUMI_BACKEND_URL": "https://api.pulumi.com", "PULUMI_HOME": str(npa_home.parent)},
    )
    assert cloud.code == 4, cloud.stdout
    error = cloud.json()["error"]
    assert "needs a login" in error["message"] and "$PULUMI_BACKEND_URL" in error["message"]
    assert error["fix"] == "pulumi login https://api.pulumi.com"
    recorded = run_npa("configure", "--project", "p", "--backend-url", "https://api.pulumi.com")
    assert recorded.code == 0, recorded.stderr


def test_a_passphrase_that_does_not_decrypt_the_stack_says_so_and_which_variable(
    npa_home: Path, pulumi_backend: PulumiBackend, tmp_path: Path
) -> None:
    # It was pulumi's raw output ("code: 1 / stdout: ... / stderr: error: failed to decrypt:
    # incorrect passphrase, ...") as a failed preview, with the rerun as its only fix.
    args = ("provision-if-absent", "--project", "pp", "--target", "local", "--yes", "--json")
    made = run_npa(*args)  # with the backend's own passphrase
    assert made.code == 0, made.stdout + made.stderr
    wrong = run_npa(*args, env={"PULUMI_CONFIG_PASSPHRASE": "not-the-one"})
    assert wrong.code == 2, wrong.stdout + wrong.stderr
    error = wrong.json()["error"]
    assert error["message"] == (
        "the passphrase in PULUMI_CONFIG_PASSPHRASE does not decrypt the secrets of stack "
        "pp.local: it was made with another passphrase"
    ), error
    assert error["fix"].startswith(
        "read -rs PULUMI_CONFIG_PASSPHRASE && export PULUMI_CONFIG_PASSPHRASE  # "
    ), error
    assert "not-the-one" not in wrong.stdout + wrong.stderr
    # Neither variable set: npa's empty passphrase is named as what was tried.
    env = {k: v for k, v in os.environ.items() if k != "PULUMI_CONFIG_PASSPHRASE"}
    unset = subprocess.run(
        [sys.executable, "-m", "npa", *args], capture_output=True, text=True, env=env, check=False
    )
    assert unset.returncode == 2, unset.stdout + unset.stderr
    assert json.loads(unset.stdout)["error"]["message"].startswith("no passphrase (neither "), (
        unset.stdout
    )
    # A passphrase file that is not there is named, with a command that shows it.
    missing = tmp_path / "no-such-passphrase"
    env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(missing)
    filed = subprocess.run(
        [sys.executable, "-m", "npa", *args], capture_output=True, text=True, env=env, check=False
    )
    assert filed.returncode == 2, filed.stdout + filed.stderr
    error = json.loads(filed.stdout)["error"]
    assert error["message"].startswith(f"PULUMI_CONFIG_PASSPHRASE_FILE names {missing}, "), error
    assert error["fix"] == f"ls -l {missing}  # the file holding the passphrase of stack pp.local"
    # The right one still works: nothing was changed by the refusals.
    assert run_npa(*args).code == 0
