"""Rendering of result models: JSON is the model dumped, text is rendered from the same model.

Commands return a :class:`Result`; ``emit`` prints it either way, so text and JSON can never
disagree about the facts.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict

from npa.core.errors import NpaError


class Result(BaseModel):
    """Base of every command result. Subclasses override ``text_lines`` for a human view."""

    model_config = ConfigDict(extra="forbid")

    def text_lines(self) -> list[str]:
        """The plain-text view; by default one ``field: value`` line per field."""
        lines = []
        for name, value in self.model_dump(mode="json").items():
            lines.append(f"{name}: {_scalar(value)}")
        return lines

    def exit_code(self) -> int:
        """The process exit code for this result (0 unless a subclass says the check failed)."""
        return 0


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def emit(
    result: Result, *, as_json: bool, stream: TextIO | None = None, compact: bool = False
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
