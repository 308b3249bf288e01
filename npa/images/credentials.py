"""Registry credentials: found by host, used for one request, never printed or stored.

Sources, first match wins for a registry host:

1. ``--registry-auth HOST=env:VAR``: the variable ``VAR`` holds ``USER:PASSWORD`` for ``HOST``.
2. ``--registry-auth FILE`` (or ``file:FILE``): a Docker-format ``config.json`` (the same shape
   as a Kubernetes ``.dockerconfigjson`` pull secret, which is what a run injects).
3. The Docker client's own ``config.json`` (``$DOCKER_CONFIG/config.json`` or
   ``~/.docker/config.json``), ``auths`` entries only.

No credential value is ever part of a message, a result, a cache file or a repr: a
:class:`Credential` shows only its source name (``env:VAR``, ``file:/path``...).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from npa.core.errors import InvalidInput
from npa.core.userfiles import read_user_text
from npa.images.reference import DEFAULT_DOMAIN, LEGACY_HUB_DOMAINS

FLAG_FIX = "--registry-auth HOST=env:VAR  (VAR holds USER:PASSWORD) or --registry-auth FILE"


@dataclass(frozen=True)
class Credential:
    """A username and secret for one registry host, named by where they came from."""

    source: str
    username: str = field(repr=False)
    secret: str = field(repr=False)

    def __str__(self) -> str:
        return self.source


@dataclass(frozen=True)
class CredentialStore:
    """Credentials by registry host (normalised: ``docker.io`` for Docker Hub)."""

    by_host: Mapping[str, Credential]
    # Hosts a source names but whose credential npa cannot use (helpers, identity tokens),
    # with the reason; reported so a "forbidden" is not a mystery.
    unusable: Mapping[str, str] = field(default_factory=dict)

    def lookup(self, host: str) -> Credential | None:
        return self.by_host.get(normalize_host(host))

    def why_none(self, host: str) -> str | None:
        return self.unusable.get(normalize_host(host))


def normalize_host(key: str) -> str:
    """``https://index.docker.io/v1/`` -> ``docker.io``; ``http://h:5000/x`` -> ``h:5000``."""
    text = key.strip()
    if "://" in text:
        text = urlparse(text).netloc or text
    text = text.split("/", 1)[0].lower()
    return DEFAULT_DOMAIN if text in LEGACY_HUB_DOMAINS else text


def docker_config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("DOCKER_CONFIG")
    return Path(base).expanduser() / "config.json" if base else Path.home() / ".docker/config.json"


def load_store(
    specs: Iterable[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    use_docker_config: bool = True,
) -> CredentialStore:
    """Build the credential store from ``--registry-auth`` values and the Docker config."""
    env = os.environ if env is None else env
    found: dict[str, Credential] = {}
    unusable: dict[str, str] = {}
    for spec in specs:
        _add_spec(spec, env, found, unusable)
    if use_docker_config:
        path = docker_config_path(env)
        if path.is_file():
            for host, cred in _read_docker_config(path, f"docker-config:{path}", unusable).items():
                found.setdefault(host, cred)
    return CredentialStore(found, unusable)


def _add_spec(
    spec: str, env: Mapping[str, str], found: dict[str, Credential], unusable: dict[str, str]
) -> None:
    host, eq, source = spec.partition("=")
    if eq and source.startswith("env:"):
        var = source[len("env:") :]
        if not host or not var:
            raise InvalidInput(f"--registry-auth {spec!r} is not HOST=env:VAR", fix=FLAG_FIX)
        value = env.get(var)
        if value is None:
            raise InvalidInput(
                f"--registry-auth names the environment variable {var}, which is not set",
                fix=f"export {var}=USER:PASSWORD  # for {host}, then rerun",
            )
        user, colon, secret = value.partition(":")
        if not colon or not user or not secret:
            raise InvalidInput(
                f"the environment variable {var} does not hold USER:PASSWORD",
                fix=f"export {var}=USER:PASSWORD  # for {host}, then rerun",
            )
        found.setdefault(normalize_host(host), Credential(f"env:{var}", user, secret))
        return
    if eq:
        raise InvalidInput(
            f"--registry-auth {spec.split('=', 1)[0]}=... must name a variable (env:VAR); "
            "a credential value never goes on the command line",
            fix=FLAG_FIX,
        )
    path = Path(spec[len("file:") :] if spec.startswith("file:") else spec).expanduser()
    for host, cred in _read_docker_config(path, f"file:{path}", unusable).items():
        found.setdefault(host, cred)


def _read_docker_config(path: Path, source: str, unusable: dict[str, str]) -> dict[str, Credential]:
    what = "--registry-auth file" if source.startswith("file:") else "Docker config"
    text = read_user_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise InvalidInput(
            f"cannot read registry credentials from {path}: it is not valid JSON",
            fix=f"python3 -m json.tool {path} >/dev/null  # then fix or replace the file",
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} is not a Docker config (not a JSON object)", fix=FLAG_FIX)
    out: dict[str, Credential] = {}
    auths = data.get("auths")
    if isinstance(auths, dict):
        for key, entry in auths.items():
            if not isinstance(entry, dict):
                continue
            host = normalize_host(str(key))
            cred = _entry_credential(entry, source)
            if cred is not None:
                out.setdefault(host, cred)
            elif entry.get("identitytoken") or entry.get("registrytoken"):
                unusable.setdefault(
                    host, f"{source} holds a token npa does not exchange; use USER:PASSWORD"
                )
    helpers = data.get("credHelpers")
    if isinstance(helpers, dict):
        for key, helper in helpers.items():
            host = normalize_host(str(key))
            if host not in out:
                unusable.setdefault(
                    host,
                    f"{source} sends {host} to the credential helper "
                    f"docker-credential-{helper}, which npa does not run",
                )
    return out


def _entry_credential(entry: Mapping[str, object], source: str) -> Credential | None:
    user, secret = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(secret, str) and user and secret:
        return Credential(source, user, secret)
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            decoded = base64.b64decode(auth, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, colon, secret = decoded.partition(":")
        if colon and user and secret:
            return Credential(source, user, secret)
    return None
