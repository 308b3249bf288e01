"""``npa workbench insights ingest-run / compare``: post-mortems across runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli.apps import insights_app
from npa.cli.common import JsonFlag, finish

if TYPE_CHECKING:
    from npa.core.output import Result

Opt = typer.Option


@insights_app.command("ingest-run")
def ingest_run(
    input_path: Annotated[
        str, Opt("--input-path", help="The run prefix: file://, s3:// or a local path.")
    ],
    output_path: Annotated[
        Path, Opt("--output-path", help="The SQLite store (a file, or a directory to hold one).")
    ],
    endpoint_url: Annotated[
        str | None, Opt("--endpoint-url", help="S3-compatible endpoint for an s3:// prefix.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Add what a run left in its prefix to a local store; re-ingesting is idempotent."""

    def produce() -> Result:
        from npa.services.insights import ingest_run as service

        return service(input_path, output_path, endpoint_url=endpoint_url)

    finish(as_json, produce)


@insights_app.command("compare")
def compare(
    input_path: Annotated[Path, Opt("--input-path", help="The insights store.")],
    base_run: Annotated[str, Opt("--base-run", help="The run to compare against (last good).")],
    candidate_run: Annotated[str, Opt("--candidate-run", help="The run under suspicion.")],
    plot: Annotated[
        Path | None, Opt("--plot", help="Also draw per-stage durations to this PNG.")
    ] = None,
    html: Annotated[
        Path | None,
        Opt("--html", help="Also write the comparison as one self-contained HTML page."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Two runs side by side per stage; the first divergence is stated first."""

    def produce() -> Result:
        from npa.services.insights import compare as service

        return service(input_path, base_run, candidate_run, plot=plot, html=html)

    finish(as_json, produce)
