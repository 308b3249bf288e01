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


def finish(as_json: bool, produce: Callable[[], Result], *, compact: bool = False) -> None:
    """Run ``produce``, print its result or its NpaError, and exit with the matching code.
    ``compact`` prints JSON on one line (the last line of an NDJSON stream)."""
    from npa.core.errors import NpaError
    from npa.core.output import emit, emit_error

    try:
        result = produce()
    except NpaError as error:
        raise typer.Exit(emit_error(error, as_json=as_json, compact=compact)) from None
    code = emit(result, as_json=as_json, compact=compact)
    if code:
        raise typer.Exit(code)
