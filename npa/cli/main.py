"""The ``npa`` command line: command groups and global options.

Only typer, pydantic and npa's own light modules are imported here; sky, pulumi, boto3 and
kubernetes are imported inside the adapters that use them so ``npa --help`` stays instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from npa import __version__
from npa.cli import (
    configure,
    images,
    insights,
    provision,
    readback,
    runs,
    skypilot,
    spec,
    submit,
)
from npa.cli.apps import app

# Command modules attach their commands to the apps when imported: list each one here.
COMMAND_MODULES = (
    configure,
    images,
    insights,
    provision,
    readback,
    runs,
    skypilot,
    spec,
    submit,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"npa {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the npa version and exit."
        ),
    ] = False,
) -> None:
    """npa: safe, reviewable, resumable GPU pipeline runs."""


def run() -> None:
    """Console-script entry point."""
    from npa.core.ending import end_children_on_signals

    end_children_on_signals()  # no helper npa starts outlives it
    app(prog_name="npa")
