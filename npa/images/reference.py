"""Image references, split and normalised the way a container runtime reads them.

The grammar itself is the spec's (:func:`npa.spec.imageref.parse_image_ref`), so validate-spec
and preflight-images can never disagree about what is well formed. This module adds what a
registry client needs on top: which part is the registry host, the Docker Hub defaults
(``docker.io`` and the ``library/`` namespace), the host to connect to, and a precise reason
when a reference is malformed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npa.core.errors import InvalidInput
from npa.spec.imageref import DIGEST, parse_image_ref

DEFAULT_DOMAIN = "docker.io"
# Docker Hub's API is not served from the name users write.
DOCKER_HUB_API = "registry-1.docker.io"
LEGACY_HUB_DOMAINS = ("index.docker.io", "registry-1.docker.io")
DEFAULT_TAG = "latest"
MAX_LENGTH = 255 + 1 + 128 + 1 + 71  # name, ':' tag, '@' sha256 digest

_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = re.compile(rf"^(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?$")


@dataclass(frozen=True)
class ImageReference:
    """A parsed, normalised reference: ``domain/path[:tag][@digest]``."""

    domain: str  # as written (or docker.io), e.g. "127.0.0.1:5000", "ghcr.io"
    path: str  # repository inside the registry, e.g. "library/ubuntu", "physai/curator"
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """``domain/path``: the repository as a runtime names it."""
        return f"{self.domain}/{self.path}"

    @property
    def reference(self) -> str:
        """What to ask the manifests endpoint for: the digest when pinned, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def api_host(self) -> str:
        """The host[:port] that serves the registry API for this reference."""
        return DOCKER_HUB_API if self.domain == DEFAULT_DOMAIN else self.domain

    @property
    def credential_host(self) -> str:
        """The key credentials are filed under (Docker Hub's is historical)."""
        return self.domain

    def pinned(self, digest: str) -> str:
        """``domain/path@digest``: the immutable form render writes."""
        return f"{self.name}@{digest}"

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def _is_domain(component: str) -> bool:
    # The rule every runtime applies: the first component is a registry host only if it
    # looks like one; "library/ubuntu" is a Docker Hub path, "localhost/x" is a host.
    return (
        "." in component
        or ":" in component
        or component == "localhost"
        or (component != component.lower())
    )


def names_registry(name: str) -> bool:
    """Whether a repository name starts with a registry host (``ghcr.io/x``, ``h:5000/x``)."""
    first, sep, _ = name.partition("/")
    return bool(sep) and _is_domain(first)


def parse_reference(value: str, *, default_registry: str | None = None) -> ImageReference:
    """Parse ``value``; a reference with no registry host resolves under ``default_registry``
    (``HOST[:PORT][/NAMESPACE]``) when given, else under Docker Hub.

    Raises InvalidInput naming what is wrong with a malformed reference.
    """
    problem = _problem(value)
    if problem:
        raise InvalidInput(
            # No command writes the reference the user meant: the form is the help.
            f"image reference {value!r} is malformed: {problem} (the form is "
            "[registry[:port]/]repository[:tag][@sha256:<64 hex>], e.g. ghcr.io/team/tool:1.0)",
        )
    parsed = parse_image_ref(value)
    assert parsed is not None  # _problem found nothing, so the shared grammar accepts it
    first, sep, rest = parsed.name.partition("/")
    if sep and _is_domain(first):
        domain, path = first, rest
    elif default_registry:
        host, _, namespace = default_registry.strip("/").partition("/")
        domain, path = host, f"{namespace}/{parsed.name}" if namespace else parsed.name
    else:
        domain, path = DEFAULT_DOMAIN, parsed.name
    if domain in LEGACY_HUB_DOMAINS:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = f"library/{path}"
    tag = parsed.tag if parsed.tag or parsed.digest else DEFAULT_TAG
    return ImageReference(domain=domain, path=path, tag=tag, digest=parsed.digest)


def parse_registry(value: str) -> str:
    """Check a ``--registry HOST[:PORT][/NAMESPACE]`` value and return it without slashes at
    the ends."""
    text = value.strip().strip("/")
    host, _, namespace = text.partition("/")
    ok = bool(host) and _is_host(host)
    if namespace:
        ok = ok and all(_PATH_COMPONENT.fullmatch(p) for p in namespace.split("/"))
    if not ok or "://" in value:
        meant = _meant_registry(text)
        raise InvalidInput(
            f"--registry {value!r} is not HOST[:PORT][/NAMESPACE] (no scheme, no tag)",
            # The flag alone: the CLI writes it into the command that was given.
            fix=f"--registry {meant}" if meant else None,
        )
    return text


def _meant_registry(text: str) -> str | None:
    """``text`` without a scheme and a tag, when that is a registry (else None)."""
    meant = text.split("://", 1)[-1].strip("/")
    head, _, last = meant.rpartition("/")
    if head and ":" in last:
        meant = f"{head}/{last.split(':', 1)[0]}"
    host, _, namespace = meant.partition("/")
    ok = bool(host) and _is_host(host)
    if namespace:
        ok = ok and all(_PATH_COMPONENT.fullmatch(p) for p in namespace.split("/"))
    return meant if ok else None


def _is_host(text: str) -> bool:
    return _HOST.fullmatch(text) is not None


def _shape_problem(value: str) -> str | None:
    """What is wrong with the text as a whole (before it is split into parts)."""
    if not value:
        return "it is empty"
    if any(c.isspace() for c in value):
        return "it contains whitespace"
    if len(value) > MAX_LENGTH:
        return f"it is longer than {MAX_LENGTH} characters"
    if "://" in value:
        return "it has a URL scheme; a reference has none"
    return None


def _name_problem(name: str) -> str | None:
    """What is wrong with the repository name (``[registry[:port]/]path``)."""
    if not name or name.startswith("/") or name.endswith("/") or "//" in name:
        return "the repository name is empty or has an empty path component"
    components = name.split("/")
    if len(components) > 1 and _is_domain(components[0]):
        if not _is_host(components[0]):
            return f"registry host {components[0]!r} is not HOST[:PORT]"
        components = components[1:]
    for part in components:
        if not _PATH_COMPONENT.fullmatch(part):
            return (
                f"repository component {part!r} must be lowercase letters and digits, "
                "separated by '.', '_', '__' or '-'"
            )
    return None


def _problem(value: str) -> str | None:
    """Why ``value`` is not a reference, or None when the shared grammar accepts it."""
    shape = _shape_problem(value)
    if shape is not None:
        return shape
    rest, at, digest = value.partition("@")
    if at and not DIGEST.fullmatch(digest):
        return f"digest {digest!r} is not sha256:<64 lowercase hex>"
    name, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = rest.rsplit(":", 1)
    if tag is not None and not _TAG.fullmatch(tag):
        return f"tag {tag!r} is not valid (letters, digits, _ . -, at most 128, no leading . or -)"
    named = _name_problem(name)
    if named is not None:
        return named
    if parse_image_ref(value) is None:
        return "it does not match [registry[:port]/]repository[:tag][@digest]"
    return None
