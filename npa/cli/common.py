"""What every command shares: the ``--json`` flag and the one way a command ends.

Command modules are imported for ``npa --help``, so they (and this module) import nothing heavy
at the top: not even pydantic. Services and result models are imported inside the command
functions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli import complete

if TYPE_CHECKING:
    from npa.core.emit import Printable
    from npa.core.errors import NpaError

# Every command that acts on a cluster names it the same way (--cluster is kept as an alias);
# without it, chosen_context picks one in the documented order.
ContextFlag = Annotated[
    str | None,
    typer.Option(
        "--context",
        "--cluster",
        help="Kube context (default: the project's configured one, else current-context).",
        autocompletion=complete.contexts,
    ),
]
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the result (or the error) as a JSON object.")
]


def rerun_command() -> str:
    """This process's command line, as a person would type it again."""
    import shlex
    import sys

    return shlex.join(["npa", *sys.argv[1:]])


def _complete_fix(error: NpaError) -> None:
    """A fix that names only the flags to change (``--runtime auto``), or an error that says
    which values a repeated flag takes (``rerun_with``), becomes this command again with them
    changed: a command, not a fragment to splice in by hand."""
    import sys

    # typer carries its own copy of click (constraints.txt pins the typer that does).
    from typer._click.globals import get_current_context

    from npa.core.commands import with_flags, with_values

    rerun_with = error.details.pop("rerun_with", None)
    if rerun_with and not error.fix:  # the flags' values it takes to run
        error.fix = with_values(sys.argv[1:], rerun_with)
        return
    if not error.fix or not error.fix.startswith("--"):
        return
    ctx = get_current_context(silent=True)
    if ctx is None:
        return
    takes_value = {
        opt: not (getattr(p, "is_flag", False) or getattr(p, "count", False))
        for p in ctx.command.params
        for opt in (*p.opts, *p.secondary_opts)
        if opt.startswith("--")
    }
    error.fix = with_flags(sys.argv[1:], error.fix, takes_value) or error.fix


def finish(as_json: bool, produce: Callable[[], Printable], *, compact: bool = False) -> None:
    """Run ``produce``, print its result or its NpaError, and exit with the matching code.
    ``compact`` prints JSON on one line (the last line of an NDJSON stream).

    The operating system refusing one of npa's own files (a full disk, a read-only folder) is
    reported as an npa error too, with its path, the fix and the command to run again."""
    from npa.core.emit import emit, emit_error
    from npa.core.errors import LocalStateUnavailable, NpaError, local_state_error, with_rerun

    try:
        result = produce()
    except OSError as exc:
        error = with_rerun(local_state_error(exc, "use"), rerun_command())
        raise typer.Exit(emit_error(error, as_json=as_json, compact=compact)) from None
    except NpaError as error:
        if isinstance(error, LocalStateUnavailable):
            with_rerun(error, rerun_command())
        _complete_fix(error)
        raise typer.Exit(emit_error(error, as_json=as_json, compact=compact)) from None
    code = emit(result, as_json=as_json, compact=compact)
    if code:
        raise typer.Exit(code)


def chosen_context(
    flag: str | None,
    command: list[str],
    *,
    project: str | None = None,
    spec: Path | None = None,
) -> str:
    """The kube context a command acts on, in the one order (``choose_context``): ``--context``,
    the spec's ``infrastructure.context``, the project's configured context, the kubeconfig's
    current-context."""
    from npa.services.configure import choose_context, no_context_error

    spec_context = None
    if flag is None and spec is not None:
        from npa.spec.validate import load_workflow

        spec_context = load_workflow(spec).infrastructure.context
    chosen = choose_context(flag, project=project, spec_context=spec_context)
    if chosen is None:
        raise no_context_error(command)
    return chosen.name
