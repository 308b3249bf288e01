"""Did-you-mean: the real choice a mistyped name most likely meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(value: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to ``value`` (case-insensitive), or None when none is close."""
    options = list(dict.fromkeys(choices))
    by_lower = {c.lower(): c for c in options}
    if value.lower() in by_lower:
        return by_lower[value.lower()]
    found = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def unknown(what: str, value: str, choices: Iterable[str]) -> str:
    """``--target 'kubrnetes' is not one of: local, kubernetes, nebius; did you mean
    'kubernetes'?``"""
    options = list(dict.fromkeys(choices))
    if not options:
        return f"{what} {value!r} is unknown, and there is none to choose from"
    text = f"{what} {value!r} is not one of: {', '.join(options)}"
    guess = closest(value, options)
    return text + (f"; did you mean {guess!r}?" if guess is not None else "")
