"""Registry credentials: found by host, used for one request, never printed or stored.

Sources, first match wins for a registry host:

1. ``--registry-auth HOST=env:VAR``: the variable ``VAR`` holds ``USER:PASSWORD`` for ``HOST``.
2. ``--registry-auth FILE`` (or ``file:FILE``): a Docker-format ``config.json`` (the same shape
   as a Kubernetes ``.dockerconfigjson`` pull secret, which is what a run injects).
3. The Docker client's own ``config.json`` (``$DOCKER_CONFIG/config.json`` or
   ``~/.docker/config.json``), read as docker reads it: a host named in ``credHelpers`` asks
   that helper, else a ``credsStore`` asks the store's helper, else the ``auths`` entry is used.
   A helper is the program ``docker-credential-<name>`` on PATH, run as docker runs it
   (``get``, the server address on stdin, ``{"Username", "Secret"}`` JSON on stdout), only
   when a registry is actually asked about that host.

No credential value is ever part of a message, a result, a cache file or a repr: a
:class:`Credential` shows only its source name (``env:VAR``, ``file:/path``...).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from npa.core.errors import InvalidInput
from npa.core.paths import docker_config_path
from npa.core.procs import run_child
from npa.core.text import clipped
from npa.core.userfiles import read_user_text
from npa.images.reference import DEFAULT_DOMAIN, LEGACY_HUB_DOMAINS


def env_var_for(host: str) -> str:
    """The variable name npa suggests for a host's credentials: ``ghcr.io`` -> GHCR_IO_AUTH,
    ``127.0.0.1:5000`` -> REGISTRY_127_0_0_1_5000_AUTH (a shell variable cannot start with a
    digit)."""
    name = re.sub(r"[^A-Z0-9]+", "_", host.upper()).strip("_") + "_AUTH"
    return f"REGISTRY_{name}" if name[0].isdigit() else name


def flag_fix(host: str) -> str:
    """How to hand npa a credential for ``host`` (the secret itself is the user's to type)."""
    var = env_var_for(host or "registry")
    return (
        f"export {var}=USER:PASSWORD  # the user and password for {host}; then pass "
        f"--registry-auth {shlex.quote(f'{host}=env:{var}')}"
    )


HELPER_TIMEOUT = 30.0
# What a helper prints when it holds nothing for the server (docker-credential-helpers).
_NOT_FOUND = "credentials not found in native keychain"
# Docker Hub's server address as docker passes it to credential helpers.
HUB_SERVER = "https://index.docker.io/v1/"


@dataclass(frozen=True)
class Credential:
    """A username and secret for one registry host, named by where they came from.

    ``identity_token`` marks an OAuth2 refresh token (docker's ``identitytoken``, or a helper's
    answer with the username ``<token>``): it is exchanged at the registry's token service,
    never sent as a password."""

    source: str
    username: str = field(repr=False)
    secret: str = field(repr=False)
    identity_token: bool = False

    def __str__(self) -> str:
        return self.source


@dataclass(frozen=True)
class DockerConfig:
    """The docker client's config.json, answering for a host the way docker does."""

    path: Path
    auths: Mapping[str, Credential]
    helpers: Mapping[str, str]  # host -> helper name (credHelpers)
    store: str | None  # credsStore
    _asked: dict[str, tuple[Credential | None, str | None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def helper_for(self, host: str) -> tuple[str, str] | None:
        """(helper name, the config key that chose it) for ``host``, or None."""
        if host in self.helpers:
            return self.helpers[host], "credHelpers"
        return (self.store, "credsStore") if self.store else None

    def lookup(self, host: str) -> Credential | None:
        return self._answer(host)[0]

    def why_none(self, host: str) -> str | None:
        return self._answer(host)[1]

    def _answer(self, host: str) -> tuple[Credential | None, str | None]:
        chosen = self.helper_for(host)
        if chosen is None:
            return self.auths.get(host), None
        with self._lock:
            if host not in self._asked:
                self._asked[host] = run_helper(chosen[0], host, f"{chosen[1]} in {self.path}")
            return self._asked[host]


@dataclass(frozen=True)
class CredentialStore:
    """Credentials by registry host (normalised: ``docker.io`` for Docker Hub)."""

    by_host: Mapping[str, Credential]
    # Hosts a source names but whose credential npa cannot use, with the reason; reported so
    # a "forbidden" is not a mystery.
    unusable: Mapping[str, str] = field(default_factory=dict)
    docker: DockerConfig | None = None

    def lookup(self, host: str) -> Credential | None:
        key = normalize_host(host)
        found = self.by_host.get(key)
        if found is None and self.docker is not None:
            found = self.docker.lookup(key)
        return found

    def why_none(self, host: str) -> str | None:
        key = normalize_host(host)
        if key in self.unusable:
            return self.unusable[key]
        return self.docker.why_none(key) if self.docker is not None else None


def run_helper(name: str, host: str, chosen_by: str) -> tuple[Credential | None, str | None]:
    """Ask ``docker-credential-<name> get`` for ``host``: (credential, None), or (None, why
    there is none). The secret never leaves the returned Credential."""
    program = f"docker-credential-{name}"
    source = f"{program} ({chosen_by})"
    found = shutil.which(program)
    if found is None:
        return None, f"{chosen_by} sends {host} to {program}, which is not on PATH"
    server = HUB_SERVER if host == DEFAULT_DOMAIN else host
    try:
        proc = run_child([found, "get"], input=server, timeout=HELPER_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"{program} did not answer for {host} within {HELPER_TIMEOUT:g}s"
    except OSError as exc:
        return None, f"{program} could not be run: {exc.strerror}"
    if proc.returncode != 0:
        said = clipped(" ".join((proc.stdout or proc.stderr).split()), 200)
        if _NOT_FOUND in said:
            return None, f"{program} holds no credentials for {host} ({chosen_by})"
        return None, f"{program} failed for {host} (exit {proc.returncode}): {said}"
    try:
        answer = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None, f"{program} answered for {host} with something that is not JSON"
    user = answer.get("Username") if isinstance(answer, dict) else None
    secret = answer.get("Secret") if isinstance(answer, dict) else None
    if not isinstance(user, str) or not isinstance(secret, str) or not secret:
        return None, f"{program} answered for {host} without a Username and Secret"
    if user == "<token>":
        return Credential(source, user, secret, identity_token=True), None
    return Credential(source, user, secret), None


def normalize_host(key: str) -> str:
    """``https://index.docker.io/v1/`` -> ``docker.io``; ``http://h:5000/x`` -> ``h:5000``."""
    text = key.strip()
    if "://" in text:
        text = urlparse(text).netloc or text
    text = text.split("/", 1)[0].lower()
    return DEFAULT_DOMAIN if text in LEGACY_HUB_DOMAINS else text


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
    docker = None
    if use_docker_config:
        path = docker_config_path(env)
        if path.is_file():
            docker = _docker_client_config(path)
    return CredentialStore(found, unusable, docker)


def _add_spec(
    spec: str, env: Mapping[str, str], found: dict[str, Credential], unusable: dict[str, str]
) -> None:
    host, eq, source = spec.partition("=")
    if eq and source.startswith("env:"):
        var = source[len("env:") :]
        if not host or not var:
            raise InvalidInput(
                f"--registry-auth {spec!r} is not HOST=env:VAR", fix=flag_fix(host or "registry")
            )
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
            fix=flag_fix(host),
        )
    path = Path(spec[len("file:") :] if spec.startswith("file:") else spec).expanduser()
    if not path.exists():
        raise InvalidInput(
            f"--registry-auth file {path} does not exist",
            fix=f"ls -l {shlex.quote(str(path.parent))}  # a docker config.json or pull secret",
        )
    data = _read_json_object(path, "--registry-auth file")
    for host, cred in _auths(data, f"file:{path}").items():
        found.setdefault(host, cred)
    for host, helper in _helpers(data).items():
        if host not in found:
            unusable.setdefault(
                host,
                f"{path} sends {host} to docker-credential-{helper}; a --registry-auth file is "
                "read for its auths only",
            )


def _docker_client_config(path: Path) -> DockerConfig:
    data = _read_json_object(path, "Docker config")
    store = data.get("credsStore")
    return DockerConfig(
        path=path,
        auths=_auths(data, f"docker-config:{path}"),
        helpers=_helpers(data),
        store=store if isinstance(store, str) and store else None,
    )


def _helpers(data: Mapping[str, object]) -> dict[str, str]:
    helpers = data.get("credHelpers")
    if not isinstance(helpers, dict):
        return {}
    return {normalize_host(str(k)): str(v) for k, v in helpers.items() if isinstance(v, str) and v}


def _read_json_object(path: Path, what: str) -> dict[str, object]:
    text = read_user_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise InvalidInput(
            f"cannot read registry credentials from {path}: it is not valid JSON",
            fix=f"python3 -m json.tool {path} >/dev/null  # then fix or replace the file",
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(
            f"{path} is not a Docker config (not a JSON object)",
            fix=f"python3 -m json.tool {shlex.quote(str(path))}  # shows what it holds",
        )
    return data


def _auths(data: Mapping[str, object], source: str) -> dict[str, Credential]:
    out: dict[str, Credential] = {}
    auths = data.get("auths")
    if isinstance(auths, dict):
        for key, entry in auths.items():
            if not isinstance(entry, dict):
                continue
            cred = _entry_credential(entry, source)
            if cred is not None:
                out.setdefault(normalize_host(str(key)), cred)
    return out


def _entry_credential(entry: Mapping[str, object], source: str) -> Credential | None:
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credential(source, "<token>", token, identity_token=True)
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
