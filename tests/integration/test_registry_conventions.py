"""Registries the way docker users have them: credentials from ``credsStore`` and
``credHelpers`` (a real ``docker-credential-*`` program on PATH), and a registry that answers
429 or 5xx before it answers 200."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from npa.images.credentials import CredentialStore, load_store
from npa.images.reference import parse_reference
from npa.images.registry import RegistryClient, Status, retry_after
from tests.harness.cli import run_npa
from tests.harness.registry import Registry
from tests.integration.imagespec import unique_repo, write_spec
from tests.integration.registry_proxy import PROXY_PASSWORD, PROXY_USER, REFRESH_TOKEN, token_proxy

pytestmark = pytest.mark.integration

# A credential helper as docker runs one: `get` with the server address on stdin, JSON out,
# "credentials not found in native keychain" (and a non-zero exit) for a server it lacks.
HELPER = """#!/bin/sh
[ "$1" = get ] || exit 2
server=$(cat)
printf '%s\\n' "$server" >> "{log}"
if [ "$server" = "{host}" ]; then
  printf '{{"ServerURL":"%s","Username":"{user}","Secret":"{secret}"}}' "$server"
else
  printf 'credentials not found in native keychain'
  exit 1
fi
"""


def _helper(bin_dir: Path, name: str, host: str, user: str, secret: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / f"{name}.log"
    script = bin_dir / f"docker-credential-{name}"
    script.write_text(HELPER.format(log=log, host=host, user=user, secret=secret))
    script.chmod(0o755)
    return log


def _docker_config(directory: Path, body: dict[str, object]) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(body))
    return {"DOCKER_CONFIG": str(directory)}


def _token_store(host: str) -> CredentialStore:
    return load_store(
        [f"{host}=env:TOK"], env={"TOK": f"{PROXY_USER}:{PROXY_PASSWORD}"}, use_docker_config=False
    )


def _repo(registry: Registry) -> str:
    repo = f"npa-images/conv-{uuid.uuid4().hex[:8]}"
    registry.push_image(repo, "v1")
    return repo


@pytest.mark.parametrize("key", ["credsStore", "credHelpers"])
def test_credential_helpers_are_run_as_docker_runs_them(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    repo = _repo(registry)
    with token_proxy(registry) as proxy:
        bin_dir = tmp_path / "bin"
        log = _helper(bin_dir, "npatest", proxy.host, PROXY_USER, PROXY_PASSWORD)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        config = (
            {"credsStore": "npatest", "auths": {proxy.host: {}}}
            if key == "credsStore"
            else {"credHelpers": {proxy.host: "npatest"}}
        )
        env = _docker_config(tmp_path / "docker", config)
        client = RegistryClient(load_store(env=env), timeout=10)
        answer = client.check_manifest(parse_reference(f"{proxy.host}/{repo}:v1"))
        assert answer.status is Status.OK, answer.detail
        assert answer.credential_source == (
            f"docker-credential-npatest ({key} in {tmp_path / 'docker' / 'config.json'})"
        )
        # Asked once per host, with the host as the server address.
        assert log.read_text().splitlines() == [proxy.host]
        # A host the helper holds nothing for gets a reason, not a loop of "docker login".
        other = load_store(env=env)
        assert other.lookup("ghcr.io") is None
        if key == "credsStore":
            assert "holds no credentials for ghcr.io" in str(other.why_none("ghcr.io"))


def test_an_identity_token_from_a_helper_is_exchanged_at_the_token_service(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(registry)
    with token_proxy(registry) as proxy:
        bin_dir = tmp_path / "bin"
        _helper(bin_dir, "tok", proxy.host, "<token>", REFRESH_TOKEN)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        env = _docker_config(tmp_path / "docker", {"credHelpers": {proxy.host: "tok"}})
        answer = RegistryClient(load_store(env=env), timeout=10).check_manifest(
            parse_reference(f"{proxy.host}/{repo}:v1")
        )
        assert answer.status is Status.OK, answer.detail
        assert any(r.get("grant_type") == "refresh_token" for r in proxy.token_requests)


def test_a_missing_helper_is_named_in_the_forbidden_answer(
    registry: Registry, tmp_path: Path, npa_home: Path
) -> None:
    repo = _repo(registry)
    with token_proxy(registry) as proxy:
        docker = _docker_config(tmp_path / "docker", {"credHelpers": {proxy.host: "absent"}})
        spec = write_spec(tmp_path / "spec.yaml", {"one": {"image": f"{proxy.host}/{repo}:v1"}})
        out = run_npa(
            "workbench", "workflow", "preflight-images", str(spec), "--json",
            env={**docker, "NPA_HOME": str(npa_home)},
        )  # fmt: skip
    [row] = out.json()["images"]
    assert row["status"] == "forbidden"
    assert "docker-credential-absent, which is not on PATH" in row["detail"]


def test_preflight_uses_a_credential_helper_end_to_end(
    registry: Registry, tmp_path: Path, npa_home: Path
) -> None:
    repo = unique_repo("helped")
    registry.push_image(repo, "v1")
    with token_proxy(registry) as proxy:
        bin_dir = tmp_path / "bin"
        _helper(bin_dir, "desk", proxy.host, PROXY_USER, PROXY_PASSWORD)
        docker = _docker_config(tmp_path / "docker", {"credsStore": "desk"})
        spec = write_spec(tmp_path / "spec.yaml", {"one": {"image": f"{proxy.host}/{repo}:v1"}})
        env = {**docker, "NPA_HOME": str(npa_home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        out = run_npa("workbench", "workflow", "preflight-images", str(spec), "--json", env=env)
    [row] = out.json()["images"]
    assert row["status"] != "forbidden", row
    assert PROXY_PASSWORD not in out.stdout + out.stderr


def test_429_then_200_waits_as_long_as_retry_after_says(registry: Registry) -> None:
    repo = _repo(registry)
    with token_proxy(registry) as proxy:
        proxy.later.append((429, {"Retry-After": "1"}))
        proxy.later.append((503, {}))
        answer = RegistryClient(_token_store(proxy.host), timeout=10).check_manifest(
            parse_reference(f"{proxy.host}/{repo}:v1")
        )
        assert answer.status is Status.OK, answer.detail
        codes = [code for _, _, code in proxy.hits]
        assert codes[:3] == [429, 503, 200]
        gap = proxy.hits[1][0] - proxy.hits[0][0]
        assert gap >= 1.0, f"asked again {gap:.2f}s after a Retry-After of 1s"


def test_a_retry_after_beyond_the_budget_is_reported_not_waited_for(registry: Registry) -> None:
    repo = _repo(registry)
    with token_proxy(registry) as proxy:
        proxy.later += [(429, {"Retry-After": "3600"})] * 3
        answer = RegistryClient(_token_store(proxy.host), timeout=10).check_manifest(
            parse_reference(f"{proxy.host}/{repo}:v1")
        )
    assert answer.status is Status.UNREACHABLE
    assert answer.http_status == 429
    assert "still so after 1 attempt and 0.0s of backoff" in answer.detail


def test_retry_after_is_read_in_both_forms() -> None:
    now = time.time()
    assert retry_after("7", now) == 7.0
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now + 30))
    assert 28 <= (retry_after(when, now) or 0) <= 31
    assert retry_after("soon", now) is None and retry_after(None, now) is None
