"""What every command shares: the ``--json`` flag and the one way a command ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from npa.core.errors import NpaError
from npa.core.output import Result, emit, emit_error

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the result (or the error) as a JSON object.")
]


def finish(as_json: bool, produce: Callable[[], Result]) -> None:
    """Run ``produce``, print its result or its NpaError, and exit with the matching code."""
    try:
        result = produce()
    except NpaError as error:
        raise typer.Exit(emit_error(error, as_json=as_json)) from None
    code = emit(result, as_json=as_json)
    if code:
        raise typer.Exit(code)
