"""Known credential values come from every source npa reads credentials from, helpers too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from npa.core.redaction import known_secrets

pytestmark = pytest.mark.integration

HELPER = """#!/bin/sh
# docker-credential-canary: answers `get` as docker's credential helpers do.
read -r server
[ "$1" = get ] || exit 1
printf '{"ServerURL": "%s", "Username": "robot", "Secret": "helper-held-Pw-%s"}\\n' \\
  "$server" "$(printf %s "$server" | tr -c 'a-z0-9' x)"
"""


def test_what_the_docker_configs_credential_helpers_hold_is_known(tmp_path: Path) -> None:
    """A registry password that lives only in a credential helper (credHelpers for one host,
    credsStore for the hosts under auths) is asked for as docker asks, and redacted."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-canary"
    helper.write_text(HELPER)
    helper.chmod(0o755)
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text(json.dumps({
        "credHelpers": {"ghcr.io": "canary"}, "credsStore": "canary",
        "auths": {"registry.example.com": {}}}))  # fmt: skip
    env = {"HOME": str(tmp_path), "DOCKER_CONFIG": str(docker),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    old_path = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]  # the helper is found on PATH, as docker finds it
    try:
        found = known_secrets(env)
    finally:
        os.environ["PATH"] = old_path
    text = "a helper-held-Pw-ghcrxio b helper-held-Pw-registryxexamplexcom c"
    out = found.redact(text)
    assert "helper-held" not in out, out
    assert "[REDACTED:docker-credential-canary:" in out
