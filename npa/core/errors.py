"""One error hierarchy for npa.

Every failure a user can meet is an :class:`NpaError`: a message that says what is wrong, an exit
code, and where one exists the exact command that fixes it. The CLI prints these cleanly (never a
traceback) and, under ``--json``, as an object.
"""

from __future__ import annotations

from typing import Any, ClassVar

# Exit codes are part of the CLI contract; scripts branch on them.
EXIT_OK = 0
EXIT_FAILURE = 1  # a command ran and found the thing it checks not ok
EXIT_INVALID = 2  # bad input: usage, spec, reference
EXIT_NOT_FOUND = 3  # authoritatively absent
EXIT_UNAVAILABLE = 4  # could not verify: a source failed; never means "absent"
EXIT_BUSY = 5  # another process holds the lock
EXIT_TOOL_MISSING = 6  # a required external tool is not installed


class NpaError(Exception):
    """Base of every error npa reports to a user."""

    exit_code: ClassVar[int] = EXIT_FAILURE
    kind: ClassVar[str] = "error"

    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of the error, as ``--json`` prints it."""
        body: dict[str, Any] = {
            "kind": self.kind,
            "message": self.message,
            "exit_code": self.exit_code,
        }
        if self.fix:
            body["fix"] = self.fix
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidInput(NpaError):
    """The user's input (flags, spec, names, references) is wrong."""

    exit_code = EXIT_INVALID
    kind = "invalid_input"


class NotFound(NpaError):
    """Every applicable source answered authoritatively that the thing does not exist."""

    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


class Unavailable(NpaError):
    """A source could not be asked or did not answer: unknown, never absent."""

    exit_code = EXIT_UNAVAILABLE
    kind = "unavailable"


class LockBusy(NpaError):
    """Another process holds an exclusive lock npa needs."""

    exit_code = EXIT_BUSY
    kind = "lock_busy"


class ToolMissing(NpaError):
    """An external tool (pulumi, kube-apiserver, ...) is not installed where npa looks."""

    exit_code = EXIT_TOOL_MISSING
    kind = "tool_missing"


class StateCorrupt(NpaError):
    """A local state file exists but cannot be read as what npa wrote."""

    exit_code = EXIT_FAILURE
    kind = "state_corrupt"
