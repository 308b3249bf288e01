"""The command groups of the ``npa`` CLI.

Command modules attach their commands to these apps; ``npa.cli.main`` imports every command
module. Keep module tops light: import services inside command functions.
"""

from __future__ import annotations

import typer

app = typer.Typer(
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
