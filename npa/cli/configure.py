"""``npa configure``: record a project alias, or show the resolved configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli import complete
from npa.cli.apps import app
from npa.cli.common import JsonFlag, finish

if TYPE_CHECKING:
    from npa.core.emit import Printable

Opt = typer.Option


@app.command("configure")
def configure(
    project: Annotated[
        str | None,
        Opt("--project", help="Project alias to record or show.", autocompletion=complete.projects),
    ] = None,
    store: Annotated[
        str | None, Opt("--store", help="s3://BUCKET/PREFIX, file:///PATH or 'local'.")
    ] = None,
    registry: Annotated[str | None, Opt("--registry", help="HOST[:PORT][/NAMESPACE].")] = None,
    endpoint_url: Annotated[
        str | None, Opt("--endpoint-url", help="S3 endpoint (MinIO, Nebius, ...).")
    ] = None,
    region: Annotated[str | None, Opt("--region", help="S3 region.")] = None,
    profile: Annotated[
        str | None, Opt("--profile", help="AWS profile that holds the credentials.")
    ] = None,
    context: Annotated[
        str | None,
        Opt("--context", help="Kube context runs launch in.", autocompletion=complete.contexts),
    ] = None,
    backend_url: Annotated[
        str | None,
        Opt(
            "--backend-url",
            help="Pulumi state backend: file://, s3://, gs://, azblob://, postgres:// or a "
            "Pulumi Cloud URL (default: $PULUMI_BACKEND_URL, else file:// under NPA_HOME).",
        ),
    ] = None,
    stage_role_arn: Annotated[
        str | None,
        Opt(
            "--stage-role-arn",
            help="IAM role a pod's stage library assumes per run (S3 on the SkyPilot backend): "
            "credentials scoped to the run's prefix and inputs; '' unsets it.",
        ),
    ] = None,
    show: Annotated[
        bool, Opt("--show", help="Print the resolved configuration and each value's source.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Record a project alias (owner-only file under NPA_HOME) or show what resolves."""

    def produce() -> Printable:
        from npa.core.errors import InvalidInput
        from npa.services import configure as service

        values = {
            "store": store,
            "registry": registry,
            "endpoint_url": endpoint_url,
            "region": region,
            "profile": profile,
            "context": context,
            "backend_url": backend_url,
            "stage_role_arn": stage_role_arn,
        }
        from npa.core.commands import npa_command

        given = [
            x for k, v in values.items() if v is not None for x in (f"--{k.replace('_', '-')}", v)
        ]
        if show:
            if given:
                raise InvalidInput(
                    "--show prints the configuration; it takes no settings",
                    fix=npa_command(
                        "configure", "--show", *(["--project", project] if project else [])
                    ),
                )
            return service.show(project)
        if project is None:
            raise InvalidInput(
                "say which project alias to record the settings under",
                fix=npa_command("configure", "--project", service.DEFAULT_PROJECT, *given),
            )
        return service.record_project(project, values)

    finish(as_json, produce)
