"""The command groups of the ``npa`` CLI.

Command modules attach their commands to these apps; ``npa.cli.main`` imports every command
module. Keep module tops light: import services inside command functions.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

# The parser's exception classes, from the module typer's own BadParameter lives in: click's,
# or the copy of click that newer typer releases carry.
_PARSER_ERRORS: Any = sys.modules[typer.BadParameter.__module__]
UsageError: type[Exception] = _PARSER_ERRORS.UsageError
ClickException: type[Exception] = _PARSER_ERRORS.ClickException

JSON_FLAG = "--json"


def asks_for_json(argv: Sequence[str]) -> bool:
    """Whether a command line asks for JSON: ``--json`` among its options (not after ``--``)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == JSON_FLAG:
            return True
    return False


def usage_error_code(error: Any, argv: Sequence[str]) -> int:
    """Report a usage error (unknown flag, missing argument, bad value) the way every other
    error is reported: an error object on stdout under ``--json``, click's usage text
    otherwise; exit 2 either way."""
    from npa.core.emit import emit_error
    from npa.core.errors import InvalidInput

    if not asks_for_json(argv):
        error.show()
        return int(error.exit_code)
    path = error.ctx.command_path if error.ctx is not None else "npa"
    details: dict[str, Any] = {"usage": error.ctx.get_usage()} if error.ctx is not None else {}
    wrapped = InvalidInput(error.format_message(), fix=f"{path} --help", details=details)
    return emit_error(wrapped, as_json=True)


class NpaGroup(TyperGroup):
    """The root group: every outcome of a command line, usage errors included, ends the one
    way npa's errors end (``--json`` means JSON whatever went wrong)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(
                args=argv,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except UsageError as error:
            code = usage_error_code(error, argv)
        except ClickException as error:
            shown: Any = error
            shown.show()
            code = shown.exit_code
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            code = 1
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=NpaGroup,
    name="npa",
    help=(
        "Declarative multi-stage GPU data pipelines on cloud Kubernetes: validate and plan a "
        "workflow spec, provision what it needs as Pulumi stacks, render SkyPilot tasks, launch "
        "them once, and triage runs."
    ),
    no_args_is_help=True,
    # --install-completion / --show-completion for bash, zsh, fish and PowerShell.
    add_completion=True,
    # -h as well as --help, on every command (child contexts inherit it).
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

skypilot_app = typer.Typer(
    help="Health of the SkyPilot side a submit depends on.", no_args_is_help=True
)
workbench_app = typer.Typer(help="Workflow runs and post-mortems.", no_args_is_help=True)
workflow_app = typer.Typer(
    help="Check, plan, render, submit and read back workflow runs.", no_args_is_help=True
)
insights_app = typer.Typer(help="Compare runs after the fact.", no_args_is_help=True)

workbench_app.add_typer(workflow_app, name="workflow")
workbench_app.add_typer(insights_app, name="insights")
app.add_typer(skypilot_app, name="skypilot")
app.add_typer(workbench_app, name="workbench")
