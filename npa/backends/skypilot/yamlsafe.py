"""Emit any value as YAML that parses back to exactly that value.

Templates never paste a spec value into YAML as-is: every value goes through
:func:`yaml_value`, which writes strings as double-quoted scalars with every character outside
printable ASCII (and the quote and backslash) escaped, and mappings and lists in flow style.
So a value holding a newline, ``: ``, ``#``, ``{{ }}``, ``&anchor``/``*alias``, a tab or a YAML
line separator (U+2028) stays one scalar and cannot add keys, comments or structure.

A script a person reviews (a task's ``setup`` and ``run``) reads better as a literal block:
:func:`yaml_script` writes one when the text is plain enough that a block holds it exactly, and
the double-quoted scalar otherwise; either parses back to the same string.
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


def yaml_script(text: str, indent: int = 2) -> str:
    """``text`` as a literal block scalar (``|``) indented by ``indent``, for a mapping value at
    the top level; the double-quoted scalar when a block does not hold it exactly (characters
    outside printable ASCII, tabs, trailing spaces, blank edges...). The block is parsed back
    before it is used, so the choice never changes the value."""
    lines = text.split("\n")
    body = text.rstrip("\n")
    plain = all(ch in _PLAIN or ch in '"\\' for ch in text.replace("\n", ""))
    if not body.strip() or not plain or any(line != line.rstrip(" ") for line in lines):
        return yaml_string(text)
    trailing = len(text) - len(body)
    chomp = {0: "-", 1: ""}.get(trailing, "+")
    pad = " " * indent
    out = [f"|{indent}{chomp}"]
    out += [pad + line if line else "" for line in body.split("\n")]
    out += [""] * (trailing - 1)
    block = "\n".join(out)
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        back = yaml.load(f"k: {block}\nz: 0\n", Loader=loader)  # a safe loader: plain data
    except yaml.YAMLError:
        back = None
    return block if back == {"k": text, "z": 0} else yaml_string(text)


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
