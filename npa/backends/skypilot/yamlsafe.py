"""Emit any value as YAML that parses back to exactly that value.

Templates never paste a spec value into YAML as-is: every value goes through
:func:`yaml_value`, which writes strings as double-quoted scalars with every character outside
printable ASCII (and the quote and backslash) escaped, and mappings and lists in flow style.
So a value holding a newline, ``: ``, ``#``, ``{{ }}``, ``&anchor``/``*alias``, a tab or a YAML
line separator (U+2028) stays one scalar and cannot add keys, comments or structure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0", '"': '\\"', "\\": "\\\\"}


def yaml_string(text: str) -> str:
    """A double-quoted YAML scalar for ``text``."""
    out = ['"']
    for ch in text:
        if ch in _PLAIN:
            out.append(ch)
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        else:
            code = ord(ch)
            if code <= 0xFF:
                out.append(f"\\x{code:02X}")
            elif code <= 0xFFFF:
                out.append(f"\\u{code:04X}")
            else:
                out.append(f"\\U{code:08X}")
    out.append('"')
    return "".join(out)


def yaml_value(value: Any) -> str:
    """One YAML flow node for ``value`` (str, int, float, bool, None, mapping, sequence)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} into a task file")
        return repr(value)
    if isinstance(value, str):
        return yaml_string(value)
    if isinstance(value, Mapping):
        items = ", ".join(f"{yaml_string(str(k))}: {yaml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write a {type(value).__name__} into a task file")
