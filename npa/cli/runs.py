"""``prepare-run`` and ``stage-source``: run identity and a run's committed source."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli import complete
from npa.cli.apps import workflow_app
from npa.cli.common import JsonFlag, finish
from npa.cli.progress import ProgressFlag, staging_progress

if TYPE_CHECKING:
    from npa.core.output import Result
    from npa.runs.identity import RunEntry

Opt = typer.Option
Arg = typer.Argument


def _warn(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line, err=True)


@workflow_app.command("prepare-run")
def prepare_run(
    spec: Annotated[Path, Arg(help="The workflow spec (its metadata.name names the workflow).")],
    project: Annotated[
        str | None,
        Opt("--project", help="Project alias (npa configure).", autocompletion=complete.projects),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Reserve a new run id and print only it: RUN_ID="$(npa ... prepare-run SPEC --project P)"."""

    def produce() -> Result:
        from npa.services.runs import prepare_run as service

        result = service(spec, project)
        _warn(result.warnings)
        typer.echo(
            f"reserved run {result.run_id} of workflow {result.workflow} "
            f"(project {result.project}, {result.workflow_prefix})",
            err=True,
        )
        return result

    finish(as_json, produce)


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def _ask(candidates: list[RunEntry]) -> str | None:
    typer.echo("which run? (npa never picks one for you)", err=True)
    ids = [c.run_id for c in candidates]
    for n, run_id in enumerate(ids, 1):
        typer.echo(f"  {n}) {run_id}", err=True)
    typer.echo("number, or empty to stop: ", err=True, nl=False)
    answer = sys.stdin.readline().strip()
    if answer.isdigit() and 1 <= int(answer) <= len(ids):
        return ids[int(answer) - 1]
    return None


@workflow_app.command("stage-source")
def stage_source(
    spec: Annotated[Path, Arg(help="The workflow spec of the run.")],
    project: Annotated[
        str | None,
        Opt("--project", help="Project alias (npa configure).", autocompletion=complete.projects),
    ] = None,
    run_id: Annotated[
        str | None,
        Opt("--run-id", "--resume-run", help="The reserved run (from prepare-run) to stage for."),
    ] = None,
    source: Annotated[
        Path | None,
        Opt("--source", help="Source tree to stage (default: the spec's directory)."),
    ] = None,
    jobs: Annotated[
        int | None,
        Opt("--jobs", min=1, max=64, help="Parallel uploads (default: 4 per CPU, at most 32)."),
    ] = None,
    verify: Annotated[
        bool,
        Opt(
            "--verify",
            help="List the stored blobs and repair missing or damaged ones (a plain re-run "
            "confirms the committed source with one request and trusts it).",
        ),
    ] = False,
    progress: ProgressFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Stage a source tree for a run: content-addressed, idempotent, committed once."""

    def produce() -> Result:
        from npa.services.runs import stage_run_source

        with staging_progress(progress, as_json) as reporter:
            result = stage_run_source(
                spec,
                project,
                run_id,
                source,
                jobs=jobs,
                interactive=_interactive(),
                ask=_ask,
                progress=reporter,
                verify=verify,
            )
        _warn(result.warnings)
        return result

    finish(as_json, produce)
