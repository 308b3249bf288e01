"""Printing a command's result or error, without importing pydantic.

``emit`` prints anything shaped like a result (:class:`Printable`): the pydantic
:class:`npa.core.output.Result` most commands return, or a :class:`PlainResult`, the dataclass
base of the few results on a path that must start fast (``list``, and the project settings every
command resolves), which never needs pydantic: pydantic's import and model building cost about
0.1 s of CPU, several times what ``list --limit 50`` itself does. Both print JSON alike: the
fields in order, non-ASCII text as it is, indented by two or on one line without spaces.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from npa.core.errors import NpaError


class Printable(Protocol):
    """What ``emit`` prints: JSON of its fields, or the text lines made from the same fields."""

    def model_dump_json(self, *, indent: int | None = None) -> str: ...

    def text_lines(self) -> list[str]: ...

    def exit_code(self) -> int: ...


def field_lines(fields: dict[str, Any]) -> list[str]:
    """The default text view of a result: one ``field: value`` line per field."""
    return [f"{name}: {_scalar(value)}" for name, value in fields.items()]


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


@dataclasses.dataclass
class PlainResult:
    """A result as a dataclass of JSON values (str, int, bool, None, lists, dicts and other
    dataclasses of them), printed as a pydantic result with the same fields would be."""

    def model_dump(self, *, mode: str = "json") -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_dump_json(self, *, indent: int | None = None) -> str:
        separators = (",", ":") if indent is None else (",", ": ")
        return json.dumps(
            self.model_dump(), indent=indent, separators=separators, ensure_ascii=False
        )

    def text_lines(self) -> list[str]:
        return field_lines(self.model_dump())

    def exit_code(self) -> int:
        return 0


def emit(
    result: Printable, *, as_json: bool, stream: TextIO | None = None, compact: bool = False
) -> int:
    """Print ``result`` as JSON (on one line when ``compact``) or text; return the exit code
    it implies."""
    out = stream or sys.stdout
    if as_json:
        out.write(result.model_dump_json(indent=None if compact else 2) + "\n")
    else:
        for line in result.text_lines():
            out.write(line + "\n")
    out.flush()
    return result.exit_code()


def _redacted(error: NpaError, redact: Callable[[str], str]) -> NpaError:
    """``error`` with ``redact`` applied to its message, its fix and its text details."""
    message = redact(error.message)
    fix = redact(error.fix) if error.fix else error.fix
    details = {k: redact(v) if isinstance(v, str) else v for k, v in error.details.items()}
    if (message, fix, details) == (error.message, error.fix, error.details):
        return error
    shown = copy.copy(error)
    shown.message, shown.fix, shown.details = message, fix, details
    return shown


def emit_error(
    error: NpaError, *, as_json: bool, stream: TextIO | None = None, compact: bool = False
) -> int:
    """Print an error cleanly: an object under ``--json``, two short lines otherwise. An error
    may quote a command line (this one, to run again) or what a tool answered: a credential in
    it is redacted (:func:`npa.core.redaction.scrub`) before it is shown or captured."""
    from npa.core.redaction import scrub

    error = _redacted(error, scrub)
    if as_json:
        out = stream or sys.stdout
        out.write(json.dumps(error.to_dict(), indent=None if compact else 2, sort_keys=True) + "\n")
    else:
        out = stream or sys.stderr
        out.write(f"error: {error.message}\n")
        if error.fix:
            out.write(f"  fix: {error.fix}\n")
    out.flush()
    return error.exit_code
