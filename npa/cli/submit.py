"""``npa workbench workflow submit``: gate, stage, render, record and launch one run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli import complete
from npa.cli.apps import workflow_app
from npa.cli.common import JsonFlag, finish
from npa.cli.progress import ProgressFlag, staging_progress

if TYPE_CHECKING:
    from npa.core.output import Result

Opt = typer.Option


@workflow_app.command("submit")
def submit(
    spec: Annotated[Path, typer.Argument(help="Workflow spec (YAML).", show_default=False)],
    project: Annotated[
        str | None,
        Opt("--project", help="Project alias (npa configure).", autocompletion=complete.projects),
    ] = None,
    run_id: Annotated[
        str | None, Opt("--run-id", help="The run prepare-run reserved (a fresh submit).")
    ] = None,
    resume_run: Annotated[
        str | None, Opt("--resume-run", help="Continue this run (adopts its job if launched).")
    ] = None,
    infra: Annotated[
        str,
        Opt(
            "--infra",
            metavar="local|k8s/CONTEXT",
            help="Where the run executes.",
            autocompletion=complete.infra,
        ),
    ] = "local",
    runtime: Annotated[
        str,
        Opt(
            "--runtime",
            metavar="auto|container|process",
            help="--infra local: run each stage in its image (container), as a host process, "
            "or in its image when a container engine answers (auto).",
        ),
    ] = "auto",
    image_override: Annotated[
        list[str] | None,
        Opt("--image-override", metavar="TOOL_REF=IMAGE", help="Image for one tool. Repeatable."),
    ] = None,
    image: Annotated[
        str | None, Opt("--image", help="Image for every tool without an --image-override.")
    ] = None,
    digests: Annotated[
        Path | None,
        Opt(
            "--digests",
            help="TOOL_REF: sha256:<digest> file, or the output of preflight-images --json: "
            "the tasks pin exactly these (as render --digests shows them).",
        ),
    ] = None,
    registry_auth: Annotated[
        list[str] | None,
        Opt("--registry-auth", metavar="HOST=env:VAR|FILE", help="Registry credentials source."),
    ] = None,
    retries: Annotated[
        int | None,
        Opt("--retries", min=0, max=100, help="Payload retries per wave (default: the stage's)."),
    ] = None,
    startup_failure_threshold: Annotated[
        int,
        Opt(
            "--startup-failure-threshold",
            min=1,
            max=100,
            help="Identical startup failures that end the run FAILED_STARTUP.",
        ),
    ] = 3,
    max_infrastructure_recoveries: Annotated[
        int,
        Opt(
            "--max-infrastructure-recoveries",
            min=0,
            max=100,
            help="Transient infrastructure recoveries before INFRASTRUCTURE_RECOVERY_EXHAUSTED.",
        ),
    ] = 3,
    no_resolve_accelerators: Annotated[
        bool,
        Opt("--no-resolve-accelerators", help="Keep the spec's GPU names; no node-label remap."),
    ] = False,
    no_preflight_images: Annotated[
        bool,
        Opt(
            "--no-preflight-images",
            help="Skip image preflight: each chosen image must then be pinned by digest (in the "
            "spec, the --image flags or --digests), as render requires.",
        ),
    ] = False,
    max_parallel: Annotated[
        int, Opt("--max-parallel", min=1, max=256, help="Local backend: processes at once.")
    ] = 4,
    progress: ProgressFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Check every gate, stage the source, render the tasks, then launch the run once.

    Nothing is staged or launched unless every gate passes; everything missing is listed at
    once with the command that fixes it. Rerunning the same submit adopts the run's job.
    """

    def produce() -> Result:
        from npa.services.submit import SubmitOptions
        from npa.services.submit import submit as service

        with staging_progress(progress, as_json) as reporter:
            return service(
                SubmitOptions(
                    spec=spec,
                    project=project,
                    run_id=run_id,
                    resume_run=resume_run,
                    infra=infra,
                    runtime=runtime,
                    image_overrides=tuple(image_override or ()),
                    image=image,
                    registry_auth=tuple(registry_auth or ()),
                    digests=digests,
                    retries=retries,
                    startup_failure_threshold=startup_failure_threshold,
                    max_infrastructure_recoveries=max_infrastructure_recoveries,
                    resolve_accelerators=not no_resolve_accelerators,
                    preflight_images=not no_preflight_images,
                    max_parallel=max_parallel,
                ),
                progress=reporter,
            )

    finish(as_json, produce)
