"""Just enough of the image reference grammar to tell a digest-pinned image from a tag.

The image issue owns full registry handling; the spec only needs to know whether a reference
is well formed and whether it already names an immutable digest. :data:`PATTERN` is the same
grammar as one anchored pattern without named groups, for the spec model and its JSON Schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_NAME = rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*"
# ASCII word characters: what registries accept in a tag, in every regex engine alike.
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
MAX_LENGTH = 512
PATTERN = rf"^{_NAME}(?::{_TAG})?(?:@{_DIGEST})?$"
_REFERENCE = re.compile(rf"^(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$")
DIGEST = re.compile(rf"^{_DIGEST}$")


@dataclass(frozen=True)
class ImageRef:
    name: str
    tag: str | None
    digest: str | None

    def pinned(self, digest: str) -> str:
        """``name@digest``: the form render writes, immutable whatever the tag now points at."""
        return f"{self.name}@{digest}"


def parse_image_ref(value: str) -> ImageRef | None:
    """Parse ``[host[:port]/]repo[:tag][@sha256:<64 hex>]``; ``None`` if malformed."""
    match = _REFERENCE.fullmatch(value)
    if not match or len(value) > MAX_LENGTH:
        return None
    return ImageRef(match.group("name"), match.group("tag"), match.group("digest"))
