"""Fault classes, and the one reading of an image pull's failure that every backend shares.

The four classes are :mod:`npa.launch.supervision`'s (it re-exports them): they live here, at the
bottom layer, because a backend meets pull failures too (the local backend's container engine,
the Kubernetes adapter's pod reasons) and must name them the same way the run watcher does.

:func:`classify_pull_failure` reads what a container runtime said when it could not pull an image
(kubelet/containerd, CRI-O, docker, podman) and answers one of two classes:

- ``actionable_configuration``: the registry *answered* that the image is not there (manifest
  unknown, name unknown, not found, 404) or that this puller may not have it (denied,
  unauthorized, forbidden, insufficient_scope, 401/403), or the reference itself cannot be
  pulled (InvalidImageName, ErrImageNeverPull). Asking again gets the same answer: automatic
  retries stop at the first sight of it.
- ``transient_infrastructure``: everything else, the registry or the way to it failing (timeouts,
  refused or reset connections, DNS failures, 5xx, 429 / too many requests), and also a message
  npa does not recognise: the startup-failure threshold then decides, as it always did.

Where a message carries both kinds of marker, the configuration marker wins: the registry's
answer about this image is the evidence, a transport hiccup in the same chain is not (a pull that
timed out once and then got "manifest unknown" fails the same way every time). Before matching,
the image reference, quoted strings, URLs and digests are taken out of the message, so a
repository called ``timeout-svc`` or ``forbidden-fruit`` is never read as a marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Classification(StrEnum):
    ACTIONABLE_CONFIGURATION = "actionable_configuration"
    TRANSIENT_INFRASTRUCTURE = "transient_infrastructure"
    PAYLOAD = "payload"
    UNKNOWN = "unknown"


# The waiting reasons (kubelet) of a container whose image could not be pulled.
PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
# Reasons that are configuration whatever the message says: the reference cannot be pulled at all.
_REFERENCE_REASONS = {
    "InvalidImageName": "the image reference is not a valid name",
    "ErrImageNeverPull": "the pull policy forbids pulling and the node does not have the image",
}

# An HTTP status standing on its own ("... : 404 Not Found", "status: 401: ..."), never a run of
# digits inside a digest, a port or a version.
_STATUS = r"(?<![\w.:/@-]){}(?![\w./@-])"
_NOT_FOUND = re.compile(
    r"manifest unknown|name unknown|blob unknown|\bnot[ _-]?found\b|repository does not exist"
    r"|image not known|no such image|" + _STATUS.format("404"),
    re.IGNORECASE,
)
_FORBIDDEN = re.compile(
    r"pull access denied|access to the resource is denied|\bdenied:|\bunauthorized\b"
    r"|\bforbidden\b|insufficient_scope|authentication required|no basic auth credentials"
    r"|\bnot authorized\b|" + _STATUS.format("40[13]"),
    re.IGNORECASE,
)
_TRANSIENT = re.compile(
    r"time(?:d)?[ -]?out|deadline exceeded|connection refused|connection reset|broken pipe"
    r"|no such host|name resolution|server misbehaving|network is unreachable|no route to host"
    r"|\bEOF\b|too ?many ?requests|rate limit|service unavailable|bad gateway"
    r"|internal server error|context canceled|" + _STATUS.format("(?:429|5\\d\\d)"),
    re.IGNORECASE,
)
_QUOTED = re.compile(r'"[^"\n]*"')  # not '...': "don't" would start one
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_DIGEST = re.compile(r"\bsha256:[0-9a-f]+", re.IGNORECASE)


@dataclass(frozen=True)
class PullFault:
    """What a pull failure's message says, as a class and the words that decided it."""

    classification: Classification
    why: str  # one short phrase: "the registry has no such image (manifest unknown)"

    @property
    def actionable(self) -> bool:
        return self.classification is Classification.ACTIONABLE_CONFIGURATION


def _names(image: str) -> list[str]:
    """The spellings of ``image`` a runtime's message may repeat, longest first: the reference,
    its repository (without tag or digest), and that repository without its registry host."""
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)
    if ":" in last[-1]:
        repository = repository[: repository.rfind(":")]
    names = [image, repository]
    if "/" in repository:
        names.append(repository.split("/", 1)[1])
    # A bare word ("found", "timeout") is left: taking it out could take a marker out with it.
    return sorted({n for n in names if any(c in n for c in "/:@.")}, key=len, reverse=True)


def _evidence(message: str, image: str | None) -> str:
    """``message`` without what names things (the image, quoted strings, URLs, digests)."""
    text = message
    for name in _names(image) if image else []:
        # Whole names only: a repository called "d" must not take the d out of "not found".
        text = re.sub(rf"(?<![\w./:@-]){re.escape(name)}(?![\w./@-])", " ", text)
    for pattern in (_QUOTED, _URL, _DIGEST):
        text = pattern.sub(" ", text)
    return text


def classify_pull_failure(
    message: str, *, image: str | None = None, reason: str | None = None
) -> PullFault:
    """Classify what a runtime said when it could not pull ``image`` (see the module's text).

    ``reason`` is the kubelet's waiting reason when there is one (ErrImagePull...); a reason
    that says the reference itself cannot be pulled decides alone.
    """
    if reason in _REFERENCE_REASONS:
        return PullFault(Classification.ACTIONABLE_CONFIGURATION, _REFERENCE_REASONS[reason])
    text = _evidence(message, image)
    for pattern, what in (
        # Registries answer "denied" for a repository they do not have as for one they keep
        # from this puller ("pull access denied, repository does not exist or..."): say both.
        (_FORBIDDEN, "the registry refuses this image to this puller, or does not have it"),
        (_NOT_FOUND, "the registry has no such image"),
    ):
        found = pattern.search(text)
        if found:
            return PullFault(Classification.ACTIONABLE_CONFIGURATION, f"{what} ({found.group(0)})")
    found = _TRANSIENT.search(text)
    if found:
        return PullFault(
            Classification.TRANSIENT_INFRASTRUCTURE,
            f"the registry or the way to it failed ({found.group(0)})",
        )
    return PullFault(
        Classification.TRANSIENT_INFRASTRUCTURE,
        "no registry answer npa recognises; counted against the startup-failure threshold",
    )
