"""Credential values: never persisted by npa, and removed from text npa copies from a run.

npa writes credentials nowhere by construction (records hold source *names*);
:func:`ensure_secret_free` turns a future mistake into a loud error instead of a secret on disk.
Text npa copies out of a run (a stage's log tail, its failure detail) can hold a credential the
stage echoed; :class:`KnownSecrets` collects every credential value npa can know of on this
machine and replaces each with the name of where it came from.
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npa.core.errors import SecretLeak

# Variables whose values are credentials. Their names may be written; their values never.
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "NPA_REGISTRY_PASSWORD",
    "DOCKER_PASSWORD",
)
# Any other variable whose name says it holds a secret.
SECRET_NAME = re.compile(
    r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|AUTH|API_?KEY|ACCESS_KEY|PRIVATE_KEY|SESSION",
    re.IGNORECASE,
)
# Shorter values would match ordinary text by accident.
MIN_LENGTH = 6
_AWS_KEYS = ("aws_secret_access_key", "aws_session_token", "aws_access_key_id")
_KUBE_KEYS = ("token", "password", "client-key-data")
_DOCKER_KEYS = ("identitytoken", "registrytoken", "password")


def ensure_secret_free(text: str, where: str) -> str:
    """Return ``text`` unchanged, or raise if it holds a credential value from the environment."""
    for name in CREDENTIAL_VARIABLES:
        value = os.environ.get(name, "")
        # Very short values would match by accident and are not worth protecting this way.
        if len(value) >= 8 and value in text:
            raise SecretLeak(
                f"refusing to write {where}: it would contain the value of {name}",
                fix="report this as an npa bug; nothing was written",
            )
    return text


@dataclass
class KnownSecrets:
    """Credential values by the source they came from (``env:VAR``, ``docker-config:...``)."""

    values: dict[str, str] = field(default_factory=dict)
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)

    def add(self, value: Any, source: str) -> None:
        if isinstance(value, str) and len(value.strip()) >= MIN_LENGTH:
            self.values.setdefault(value.strip(), source)
            self._pattern = None

    def add_login(self, user: str, secret: str, source: str) -> None:
        """A user:password pair, also in the base64 form a Basic header or auth field holds."""
        self.add(secret, source)
        if user and secret:
            self.add(base64.b64encode(f"{user}:{secret}".encode()).decode(), source)

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.values.values()))

    def redact(self, text: str) -> str:
        """``text`` with every known value replaced by ``[REDACTED:<source>]``."""
        if not self.values or not text:
            return text
        if self._pattern is None:
            ordered = sorted(self.values, key=len, reverse=True)  # longest first: no partial
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
        return self._pattern.sub(lambda m: f"[REDACTED:{self.values[m.group(0)]}]", text)


def _env_secrets(found: KnownSecrets, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if name in CREDENTIAL_VARIABLES or SECRET_NAME.search(name):
            found.add(value, f"env:{name}")
            user, colon, secret = value.partition(":")
            if colon:  # USER:PASSWORD, as --registry-auth HOST=env:VAR reads it
                found.add_login(user, secret, f"env:{name}")


def _docker_config(found: KnownSecrets, path: Path) -> None:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        return
    source = f"docker-config:{path}"
    for entry in auths.values():
        if not isinstance(entry, dict):
            continue
        for key in _DOCKER_KEYS:
            found.add(entry.get(key), source)
        encoded = entry.get("auth")
        found.add(encoded, source)
        if isinstance(encoded, str):
            try:
                user, _, secret = base64.b64decode(encoded).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            found.add_login(user, secret, source)
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            found.add_login(entry["username"], entry["password"], source)


def _aws_files(found: KnownSecrets, paths: Iterable[Path]) -> None:
    for path in paths:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in parser.sections():
            for key in _AWS_KEYS:
                if parser.has_option(section, key):
                    found.add(parser.get(section, key), f"aws-config:{path}")


def _kubeconfigs(found: KnownSecrets, paths: Iterable[Path]) -> None:
    import yaml

    for path in paths:
        try:
            data = yaml.safe_load(path.read_text("utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            continue
        users = data.get("users") if isinstance(data, dict) else None
        for user in users if isinstance(users, list) else []:
            body = user.get("user") if isinstance(user, dict) else None
            if isinstance(body, dict):
                for key in _KUBE_KEYS:
                    found.add(body.get(key), f"kubeconfig:{path}")


def known_secrets(
    env: Mapping[str, str] | None = None, *, npa_home: Path | None = None
) -> KnownSecrets:
    """Every credential value npa can know of here: secret-named environment variables (and
    USER:PASSWORD pairs in them), the Docker config's registry auths, the AWS shared credentials
    and config files, and the tokens and keys of kubeconfigs ($KUBECONFIG, ~/.kube/config, the
    ones provisioning placed under NPA_HOME). Files that cannot be read add nothing."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    found = KnownSecrets()
    _env_secrets(found, env)
    docker = env.get("DOCKER_CONFIG")
    _docker_config(found, Path(docker) / "config.json" if docker else home / ".docker/config.json")
    _aws_files(
        found,
        [
            Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws/credentials"),
            Path(env.get("AWS_CONFIG_FILE") or home / ".aws/config"),
        ],
    )
    kubeconfigs = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    kubeconfigs.append(home / ".kube/config")
    if npa_home is not None:
        kubeconfigs += sorted((npa_home / "clusters").glob("*/kubeconfig"))
    _kubeconfigs(found, kubeconfigs)
    return found
