"""Rendering of result models: JSON is the model dumped, text is rendered from the same model.

Commands return a :class:`Result` (or, on a path that must start fast, a
:class:`npa.core.emit.PlainResult`); :func:`npa.core.emit.emit` prints it either way, so text and
JSON can never disagree about the facts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from npa.core.emit import field_lines


class Result(BaseModel):
    """Base of every command result. Subclasses override ``text_lines`` for a human view."""

    model_config = ConfigDict(extra="forbid")

    def text_lines(self) -> list[str]:
        """The plain-text view; by default one ``field: value`` line per field."""
        return field_lines(self.model_dump(mode="json"))

    def exit_code(self) -> int:
        """The process exit code for this result (0 unless a subclass says the check failed)."""
        return 0
