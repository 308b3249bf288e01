"""How npa writes counts and numbers in text output, one way everywhere.

Counts agree with their noun ("1 shard", "2 shards"), and integers are grouped by thousands
("74,247,069,696"). JSON output keeps plain numbers; only the text view uses these.
"""

from __future__ import annotations

# Nouns whose plural is not the noun plus "s".
_IRREGULAR = {"entry": "entries", "directory": "directories", "process": "processes"}


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 shard``, ``2 shards``, ``1,000 entries``."""
    word = noun if count == 1 else (many or _IRREGULAR.get(noun) or noun + "s")
    return f"{number(count)} {word}"


def number(value: int | float) -> str:
    """An integer grouped by thousands (``70,458,961,920``); a float to at most two places."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def gib_text(value: int | None, gib: int | None = None) -> str:
    """A size in bytes as npa prints one everywhere: ``1,251 GiB (1,343,251,021,824 bytes)``.
    ``gib`` is the GiB figure when the caller rounds on purpose (a requirement up, what is
    available down); without it, the whole GiB with ``+`` when bytes remain. None is
    ``unknown``."""
    if value is None:
        return "unknown"
    if gib is None:
        whole, rest = divmod(value, 2**30)
        return f"{number(whole)}{'+' if rest else ''} GiB ({plural(value, 'byte')})"
    return f"{number(gib)} GiB ({plural(value, 'byte')})"


_ELLIPSIS = "…"


def clipped(text: str, limit: int) -> str:
    """``text`` whole when it fits in ``limit`` characters; else its start, cut where a word
    ends (at a space, else after a separator such as ``/`` or ``,``; a single word longer than
    half the room is cut inside it), then ``…`` to say it was cut. Never more than ``limit``
    characters."""
    if len(text) <= limit:
        return text
    room = max(limit - len(_ELLIPSIS), 0)
    head = text[:room]
    if not text[room : room + 1].isspace():
        space = max(head.rfind(c) for c in " \t\n")
        separator = max(head.rfind(c) + 1 for c in "/,;:)]}=&|-")
        end = space if space >= room // 2 else separator
        if end >= room // 2:
            head = head[:end]
    return head.rstrip() + _ELLIPSIS
