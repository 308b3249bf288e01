"""Where npa's templates are: the task templates, the stage library and the report pages.

They are package data of ``npa`` (``npa/templates/``, listed in pyproject.toml's package-data):
a checkout, an editable install and an installed wheel all find them in the one place, through
:mod:`importlib.resources`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from npa.core.errors import InvalidInput

#: JSON's own string encoder (C), as ``json.dumps`` of a string calls it, without its frames.
_json_string = json.encoder.encode_basestring_ascii


def templates_dir() -> Path:
    """The folder of npa's templates: ``templates`` inside the installed ``npa`` package."""
    return Path(str(resources.files("npa").joinpath("templates")))


# --- YAML output -------------------------------------------------------------------------------
# A task template writes every value through one filter, ``yaml``. Scalars and collections are
# written as JSON, which is YAML: a JSON string is a double-quoted scalar, so no value can add a
# key, a comment, an anchor or any structure. ``yaml(block=True)`` writes a script a person reads
# as a literal block, but only when :func:`literal_block_holds` proves the block reads back
# exactly; otherwise it is the JSON string too.

# What a literal block holds as it is: printable ASCII and newline.
_LITERAL = bytes(range(0x20, 0x7F)) + b"\n"
# json.dumps(ensure_ascii=True) writes a character beyond the BMP as a UTF-16 surrogate pair;
# YAML's \u escapes do not pair up, so the pair is rewritten as one \U escape.
_PAIR = re.compile(r"\\ud([89ab][0-9a-f]{2})\\ud([c-f][0-9a-f]{2})")


class YamlText(str):
    """Text the yaml filter produced; the only thing a YAML template may output."""


def _joined(match: re.Match[str]) -> str:
    high, low = int("d" + match.group(1), 16), int("d" + match.group(2), 16)
    return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08X}"


def _flow_string(value: str) -> str:
    text = _json_string(value)
    return _PAIR.sub(_joined, text) if "\\ud" in text else text


# YAML reads a key written without "? " (an implicit key) only up to 1,024 characters.
IMPLICIT_KEY = 1024


def _flow_key(key: str) -> str:
    """A flow mapping's key: longer than an implicit key may be, it is an explicit one."""
    text = _flow_string(key)
    return text if len(text) < IMPLICIT_KEY else "? " + text


def yaml_flow(value: Any) -> str:
    """One YAML flow node for ``value`` (str, int, float, bool, None, mapping, sequence), in
    printable ASCII: strings are JSON strings, so every other character is an escape."""
    if isinstance(value, str):
        return _flow_string(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)  # what JSON writes for any int
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} into a YAML file")
        text = repr(value)
        # YAML 1.1 (PyYAML, SkyPilot's loader) reads 1e+20 as a string: it needs the dot.
        return text if "." in text or "e" not in text else text.replace("e", ".0e", 1)
    if isinstance(value, Mapping):
        items = ", ".join(f"{_flow_key(str(k))}: {yaml_flow(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(yaml_flow(v) for v in value) + "]"
    raise TypeError(f"cannot write a {type(value).__name__} into a YAML file")


class Joined(str):
    """Text made of parts joined by newlines, where a part may be large and the same in many
    texts (every stage's setup holds the whole stage library): :func:`literal_block_holds` and
    :func:`yaml_block` work part by part and keep what they made of a large part, so the part
    is checked and indented once, not once per text. Equal to the joined text in every other
    use."""

    parts: tuple[str, ...]

    def __new__(cls, parts: Sequence[str]) -> Joined:
        text = super().__new__(cls, "\n".join(parts))
        text.parts = tuple(parts)
        return text


# A Joined text's shared part is checked and indented once: these keep the last texts they
# were given (a few stages' own parts pass through between two uses of the shared one).
@lru_cache(maxsize=64)
def _clean(text: str) -> bool:
    """Printable ASCII and newlines only, and no line (but the last) ending in a space."""
    # Passes of C over the text: ASCII, then nothing left once the admitted bytes are deleted.
    return (
        text.isascii() and not text.encode("ascii").translate(None, _LITERAL) and " \n" not in text
    )


def literal_block_holds(text: str) -> bool:
    """Whether a literal block (``|2``, with the chomping indicator its trailing newlines
    need) reads back as exactly ``text``: printable ASCII and newlines only (no tab, no CR, no
    line separator), no line ending in a space (a reader could not see it), and at least one
    non-blank line. The hypothesis property in tests/unit/test_render.py parses the blocks
    this admits back through SkyPilot's loader."""
    # A Joined text's lines are its parts' lines: a part's own line ending in a space, or a
    # part ending in one (a newline or the text's end follows), is such a line.
    parts = text.parts if type(text) is Joined else (text,)
    return (
        all(_clean(part) for part in parts)
        and not any(part.endswith(" ") for part in parts)
        and any(part.strip() for part in parts)
    )


@lru_cache(maxsize=64)
def _indented(text: str, pad: str) -> str:
    """Every line of ``text`` but an empty one led by ``pad``. No line of ``text`` ends in a
    space (:func:`literal_block_holds`), so a line that is only ``pad`` once every line is
    indented was empty."""
    return (pad + text.replace("\n", "\n" + pad) + "\n").replace(pad + "\n", "\n")[:-1]


def yaml_block(text: str, indent: int = 2) -> str:
    """``text`` as a literal block indented by ``indent`` (for a top-level mapping value).
    ``text`` is one :func:`literal_block_holds` admits. A Joined text is indented part by part
    (indenting is line by line), when its last part holds more than newlines (the newlines it
    ends in are then all in that part)."""
    pad = " " * indent
    parts = text.parts if type(text) is Joined else ()
    last = parts[-1].rstrip("\n") if parts else ""
    if last:
        trailing = len(parts[-1]) - len(last)
        body = "\n".join([*(_indented(part, pad) for part in parts[:-1]), _indented(last, pad)])
    else:
        last = text.rstrip("\n")
        trailing = len(text) - len(last)
        body = _indented(last, pad)
    chomp = {0: "-", 1: ""}.get(trailing, "+")
    return f"|{indent}{chomp}\n" + body + "\n" * (trailing - 1)


def yaml_filter(value: Any, block: bool = False) -> YamlText:
    """The template filter: ``{{ v | yaml }}``, or ``{{ script | yaml(block=True) }}``. A
    :class:`Slot` is written as a hole (:class:`Shape`)."""
    if type(value) is Slot:
        return YamlText(f"{_HOLE}{str.__str__(value)}{'b' if block else 'f'}{_HOLE}")
    if block and isinstance(value, str) and literal_block_holds(value):
        return YamlText(yaml_block(value))
    return YamlText(yaml_flow(value))


# --- Shapes ------------------------------------------------------------------------------------
# Files rendered from one template differ, file to file, mostly in the values the yaml filter
# writes. A shape is the template's text for one outcome of its control flow, with a hole where
# each value goes: it is rendered once, with a Slot in each value's place, and every file of the
# same shape is then the shape's text with each value's filter output put in its hole.

# Marks a hole in a shape's text; never in a template's own text or in anything the filter writes
# (printable ASCII and newlines).
_HOLE = "\x00"
_HOLE_MARK = re.compile(r"(\d+)([bf])")
# How many mappings and lists a shape keeps written.
_WRITTEN = 256


class ShapeRefused(Exception):
    """A template did something with a value other than write it or test it for none or
    emptiness, so the value's place in the text may depend on the value: no shape."""


def _refuse(self: Any, *args: Any) -> Any:
    raise ShapeRefused("a template looked into a value")


class Slot(str):
    """A value's stand-in while a shape is rendered: the yaml filter writes it as a hole, and a
    template may test it for none (it is not) or emptiness (it is not: only values that are
    neither become slots). Any other use (compare, measure, iterate, index, call a method,
    convert) raises :class:`ShapeRefused`, since its outcome could differ from file to file."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is Slot:  # two keys of one mapping
            return False
        raise ShapeRefused("a template compared a value")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __bool__(self) -> bool:
        return True

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):
            return str.__getattribute__(self, name)
        raise ShapeRefused(f"a template called {name!r} on a value")

    __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __contains__ = __len__ = __iter__ = __getitem__ = _refuse
    __add__ = __radd__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _refuse
    __format__ = __str__ = _refuse


class Shape:
    """A template's text with holes: :meth:`fill` puts the yaml filter's output for each value
    in its hole. Made by :meth:`recorded` from a render whose values were :class:`Slot` s."""

    __slots__ = ("chunks", "holes", "written")

    def __init__(self, chunks: list[str], holes: list[tuple[int, bool]]) -> None:
        self.chunks = chunks
        self.holes = holes
        self.written: dict[str, str] = {}

    @classmethod
    def recorded(cls, text: str, slots: int) -> Shape:
        """The shape of ``text``, rendered with Slots ``0`` .. ``slots - 1`` for values."""
        parts = text.split(_HOLE)
        holes: list[tuple[int, bool]] = []
        for mark in parts[1::2]:
            found = _HOLE_MARK.fullmatch(mark)
            if found is None or int(found.group(1)) >= slots:
                raise ShapeRefused("a hole's mark is not one the filter writes")
            holes.append((int(found.group(1)), found.group(2) == "b"))
        if len(parts) % 2 == 0:  # an odd count of marks: not written by the filter
            raise ShapeRefused("an unpaired hole mark")
        return cls(parts[0::2], holes)

    def fill(self, values: Sequence[Any], forms: Mapping[int, int]) -> str:
        """The text with ``values[i]`` in each of slot i's holes, as the yaml filter writes it:
        ``forms`` gives :func:`block_form` of each value with a block hole. A mapping or list
        written before (most files share their pod's variables) is not written again."""
        chunks = self.chunks
        written = self.written
        out = [chunks[0]]
        for (slot, block), chunk in zip(self.holes, chunks[1:], strict=True):
            value = values[slot]
            if block and forms[slot] >= 0:
                out.append(yaml_block(value))
            elif type(value) is str:
                out.append(_flow_string(value))
            elif isinstance(value, (list, dict)):
                seen = repr(value)  # one text per value of these types
                text = written.get(seen)
                if text is None:
                    text = yaml_flow(value)
                    if len(written) < _WRITTEN:
                        written[seen] = text
                out.append(text)
            else:
                out.append(yaml_flow(value))
            out.append(chunk)
        return "".join(out)


def block_form(value: Any) -> int:
    """How the yaml filter writes ``value`` where a template asks for a block: a literal block
    ending in that many newlines (its chomping indicator and what follows it depend on them), or
    -1, a flow node."""
    if isinstance(value, str) and literal_block_holds(value):
        return len(value) - len(value.rstrip("\n"))
    return -1


def _only_yaml(value: Any) -> Any:
    if not isinstance(value, YamlText):
        raise InvalidInput(
            f"template bug: a value ({type(value).__name__}) was written without the yaml "
            "filter; every value in a YAML template goes through '| yaml'"
        )
    return value


@lru_cache(maxsize=8)
def yaml_environment(root: str) -> Any:
    """The Jinja environment of npa's YAML templates under ``root``: undefined names are errors,
    nothing is HTML-escaped (the output is YAML), and any output that did not come through the
    ``yaml`` filter is refused."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # the output is YAML; the yaml filter does the escaping
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_only_yaml,
    )
    env.filters["yaml"] = yaml_filter
    return env
