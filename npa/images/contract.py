"""The bootstrap contract: what a first-party image promises in its OCI config labels.

A first-party image is built to run a stage as npa's fixed non-root user, through SkyPilot's pod
start-up: a POSIX shell at ``/bin/sh`` and ``bash`` (SkyPilot's pod command), a writable
``/tmp``, a passwd entry for the user and a home it can write (SkyPilot's set-up works under
``$HOME``), passwordless ``sudo`` (SkyPilot's set-up runs ``sudo`` as that user, which
refuses a user without a passwd entry), and the AWS CLI (a stage's set-up fetches the source
and its inputs from the run store with it). It says so with labels in its image config, so npa can
verify the promise by reading metadata instead of running anything:

==================================  ============================================================
``io.npa.contract.version``         contract version the image was built for (this npa: 2)
``io.npa.contract.user``            ``UID`` or ``UID:GID``, numeric, UID not 0
``io.npa.contract.capabilities``    comma list; must include every capability of the version
==================================  ============================================================

An image without ``io.npa.contract.version``, or built for an older version (which promises less
than this npa needs), is unattested: it gets one bounded capability probe
(:mod:`npa.images.probe`) that checks the same capabilities by running the image under the
security context its tasks get
(:func:`npa.backends.base.pod_security_context`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npa.core.errors import InvalidInput

CONTRACT_VERSION = 2
LABEL_PREFIX = "io.npa.contract."
LABEL_VERSION = LABEL_PREFIX + "version"
LABEL_USER = LABEL_PREFIX + "user"
LABEL_CAPABILITIES = LABEL_PREFIX + "capabilities"
# What version 2 of the contract needs from an image (version 1 had only the first two).
REQUIRED_CAPABILITIES = (
    "posix-shell",
    "writable-tmp",
    "bash",
    "passwd-user",
    "writable-home",
    "sudo",
    "aws-cli",
)

_USER = re.compile(r"^(?P<uid>[0-9]{1,10})(?::(?P<gid>[0-9]{1,10}))?$")


class ContractViolation(Exception):
    """The image claims the contract but its labels or config break it."""


@dataclass(frozen=True)
class Attestation:
    """What a first-party image's labels promise, once verified."""

    version: int
    uid: int
    gid: int | None
    capabilities: tuple[str, ...]


def labels_of(config: Mapping[str, Any]) -> dict[str, str]:
    """The labels of an OCI image config (``config.Labels``), as strings."""
    inner = config.get("config")
    labels = inner.get("Labels") if isinstance(inner, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


def read_attestation(config: Mapping[str, Any]) -> Attestation | None:
    """Verify the contract labels of ``config``; None when the image claims no contract, or an
    older one (it promises less than this npa needs, so the probe checks instead).

    Raises ContractViolation when the image claims the contract and breaks it.
    """
    labels = labels_of(config)
    raw_version = labels.get(LABEL_VERSION)
    if raw_version is None:
        return None
    if not raw_version.strip().isdigit():
        raise ContractViolation(f"label {LABEL_VERSION}={raw_version!r} is not a whole number")
    version = int(raw_version)
    if version > CONTRACT_VERSION:
        raise ContractViolation(
            f"the image was built for bootstrap contract {version}; this npa knows up to "
            f"{CONTRACT_VERSION} (upgrade npa)"
        )
    if version < 1:
        raise ContractViolation(f"label {LABEL_VERSION}={raw_version!r} names no contract")
    if version < CONTRACT_VERSION:
        return None

    raw_user = labels.get(LABEL_USER, "")
    match = _USER.fullmatch(raw_user.strip())
    if not match:
        raise ContractViolation(f"label {LABEL_USER}={raw_user!r} must be a numeric UID or UID:GID")
    uid = int(match.group("uid"))
    gid = int(match.group("gid")) if match.group("gid") else None
    if uid == 0:
        raise ContractViolation(f"label {LABEL_USER} declares root (0); the contract is non-root")
    declared = _config_user(config)
    if declared is not None and declared.split(":", 1)[0] != str(uid):
        raise ContractViolation(
            f"the image config's User is {declared!r} but {LABEL_USER} says {raw_user!r}"
        )

    capabilities = tuple(
        c.strip() for c in labels.get(LABEL_CAPABILITIES, "").split(",") if c.strip()
    )
    missing = [c for c in REQUIRED_CAPABILITIES if c not in capabilities]
    if missing:
        raise ContractViolation(
            f"label {LABEL_CAPABILITIES} lacks {', '.join(missing)} "
            f"(contract {version} needs {', '.join(REQUIRED_CAPABILITIES)})"
        )
    return Attestation(version=version, uid=uid, gid=gid, capabilities=capabilities)


def _config_user(config: Mapping[str, Any]) -> str | None:
    inner = config.get("config")
    user = inner.get("User") if isinstance(inner, dict) else None
    return str(user) if user else None


def enforce_declared_user(tool: str, image: str, declared_uid: int, run_as_user: int) -> None:
    """Refuse to run a first-party image as root when it declares a non-root user.

    Render calls this with the ``runAsUser`` it is about to write; preflight with the user the
    spec asks for.
    """
    if run_as_user == 0:
        raise InvalidInput(
            f"tool {tool!r}: image {image} declares user {declared_uid}; "
            "runAsUser: 0 cannot replace a first-party image's declared user; remove "
            f"run_as_user: 0 from tools.{tool}.contract in the spec",
        )
