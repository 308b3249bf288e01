"""Spec commands: validate-spec, plan-spec, render, schema (``npa workbench workflow ...``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from npa.cli import complete
from npa.cli.apps import workflow_app
from npa.cli.common import JsonFlag, finish

SpecArg = Annotated[Path, typer.Argument(help="Workflow spec (YAML).", show_default=False)]
RunIdOpt = Annotated[str, typer.Option("--run-id", help="The run this plan or render is for.")]
ProjectOpt = Annotated[
    str | None, typer.Option("--project", help="Project the run is reserved in (npa configure).")
]


@workflow_app.command("validate-spec")
def validate_spec(spec: SpecArg, as_json: JsonFlag = False) -> None:
    """Report every problem in a spec at once (exit 0 when valid, 2 when not). Read-only."""
    from npa.services.spec import validate_spec as run

    finish(as_json, lambda: run(spec))


@workflow_app.command("schema")
def schema(as_json: JsonFlag = False) -> None:
    """Print the JSON Schema of the workflow spec (for editors)."""
    from npa.services.spec import spec_schema

    finish(as_json, spec_schema)


@workflow_app.command("plan-spec")
def plan_spec(
    spec: SpecArg,
    run_id: RunIdOpt,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            help="nebius (the disks npa creates: their quota), kubernetes (a cluster that "
            "exists: no quota to check) or local (the store's disk).",
            autocompletion=complete.targets,
        ),
    ] = "nebius",
    quota_file: Annotated[
        list[Path] | None,
        typer.Option("--quota-file", help="Quota figures to review offline (repeatable)."),
    ] = None,
    existing: Annotated[
        Path | None,
        typer.Option("--existing", help="Disks proven to exist already; deducted from the need."),
    ] = None,
    nebius_project: Annotated[
        str | None,
        typer.Option("--nebius-project", help="Ask the Nebius quota API for this project id."),
    ] = None,
    nebius_region: Annotated[
        str | None, typer.Option("--nebius-region", help="Region of the Nebius quotas.")
    ] = None,
    nebius_endpoint: Annotated[
        str | None, typer.Option("--nebius-endpoint", help="Nebius API address override.")
    ] = None,
    local_quota: Annotated[
        bool, typer.Option("--local-quota", help="Also check the local store's free disk.")
    ] = False,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            help="Project the run is reserved in; the local target measures its store.",
        ),
    ] = None,
    skip_quota: Annotated[
        bool, typer.Option("--skip-quota", help="Show the plan only; the quota is not checked.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The run's DAG, waves, resources, infrastructure and quota arithmetic. Read-only.

    Exit 0 when the quota is ok (or --skip-quota), 1 when blocked by a shortfall, 4 when the
    evidence is unknown or contradictory.
    """
    from npa.core.targets import checked_target
    from npa.services.plan import QuotaOptions
    from npa.services.plan import plan_spec as run
    from npa.targets.base import QuotaApiAsk

    def produce():  # type: ignore[no-untyped-def]
        chosen = checked_target(target, ["workbench", "workflow", "plan-spec"],
                                [str(spec), "--run-id", run_id])  # fmt: skip
        options = QuotaOptions(
            quota_files=quota_file or [],
            existing_file=existing,
            quota_api=QuotaApiAsk(nebius_project, nebius_region, nebius_endpoint),
            local=local_quota,
            skip=skip_quota,
            project=project,
        )
        return run(spec, run_id, target=chosen, quota=options, project=project)

    finish(as_json, produce)


@workflow_app.command("render")
def render(
    spec: SpecArg,
    run_id: RunIdOpt,
    out: Annotated[Path, typer.Option("--out", help="Directory for the task files.")],
    digests: Annotated[
        Path | None,
        typer.Option(
            "--digests",
            help="TOOL_REF: sha256:<digest> file, or the output of preflight-images --json "
            "(pinned exactly as it verified).",
        ),
    ] = None,
    image_override: Annotated[
        list[str] | None,
        typer.Option(
            "--image-override",
            metavar="TOOL_REF=IMAGE",
            help="TOOL_REF=IMAGE: render IMAGE for that tool, as preflight-images does. "
            "Repeatable.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", metavar="IMAGE", help="IMAGE for every tool without an override."),
    ] = None,
    infra: Annotated[
        str | None,
        typer.Option(
            "--infra",
            metavar="local|k8s/CONTEXT",
            help="The backend to render for, as submit's --infra (default: k8s/<--context>).",
        ),
    ] = None,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime", metavar="auto|container|process", help="--infra local: as submit's."
        ),
    ] = "auto",
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            help="Kube context (default: the spec's, else the project's, else current-context).",
        ),
    ] = None,
    project: ProjectOpt = None,
    store_uri: Annotated[
        str | None,
        typer.Option(
            "--store-uri", help="Store of a run that is not reserved (default: the spec's)."
        ),
    ] = None,
    diff: Annotated[
        Path | None,
        typer.Option(
            "--diff", help="Unified diff against this render, run ids aside; exit 1 if any."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Render the task files the run launches, with images pinned by digest.

    The run's store is the one prepare-run reserved it in (what submit and status use); the
    files are byte for byte what submit launches for the same run, images and --infra.
    """
    from npa.services.render import render_spec

    finish(
        as_json,
        lambda: render_spec(
            spec,
            run_id,
            out,
            digests_file=digests,
            kube_context=context,
            infra=infra,
            runtime=runtime,
            project=project,
            store_uri=store_uri,
            diff_against=diff,
            image_overrides=image_override or [],
            image=image,
        ),
    )
