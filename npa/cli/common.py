"""What every command shares: the ``--json`` flag and the one way a command ends.

Command modules are imported for ``npa --help``, so they (and this module) import nothing heavy
at the top: not even pydantic. Services and result models are imported inside the command
functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from npa.core.output import Result

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the result (or the error) as a JSON object.")
]


def rerun_command() -> str:
    """This process's command line, as a person would type it again."""
    import shlex
    import sys

    return shlex.join(["npa", *sys.argv[1:]])


def finish(as_json: bool, produce: Callable[[], Result], *, compact: bool = False) -> None:
    """Run ``produce``, print its result or its NpaError, and exit with the matching code.
    ``compact`` prints JSON on one line (the last line of an NDJSON stream).

    The operating system refusing one of npa's own files (a full disk, a read-only folder) is
    reported as an npa error too, with its path, the fix and the command to run again."""
    from npa.core.errors import LocalStateUnavailable, NpaError, local_state_error, with_rerun
    from npa.core.output import emit, emit_error

    try:
        result = produce()
    except OSError as exc:
        error = with_rerun(local_state_error(exc, "use"), rerun_command())
        raise typer.Exit(emit_error(error, as_json=as_json, compact=compact)) from None
    except NpaError as error:
        if isinstance(error, LocalStateUnavailable):
            with_rerun(error, rerun_command())
        raise typer.Exit(emit_error(error, as_json=as_json, compact=compact)) from None
    code = emit(result, as_json=as_json, compact=compact)
    if code:
        raise typer.Exit(code)
