"""``npa configure``: record a project alias, or show the resolved configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli.apps import app
from npa.cli.common import JsonFlag, finish

if TYPE_CHECKING:
    from npa.core.output import Result

Opt = typer.Option


@app.command("configure")
def configure(
    project: Annotated[
        str | None, Opt("--project", help="Project alias to record or show.")
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
    context: Annotated[str | None, Opt("--context", help="Kube context runs launch in.")] = None,
    show: Annotated[
        bool, Opt("--show", help="Print the resolved configuration and each value's source.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Record a project alias (owner-only file under NPA_HOME) or show what resolves."""

    def produce() -> Result:
        from npa.core.errors import InvalidInput
        from npa.services import configure as service

        values = {
            "store": store,
            "registry": registry,
            "endpoint_url": endpoint_url,
            "region": region,
            "profile": profile,
            "context": context,
        }
        if show:
            if any(v is not None for v in values.values()):
                raise InvalidInput(
                    "--show prints the configuration; it takes no settings",
                    fix=f"npa configure --show --project {project or 'PROJECT'}",
                )
            return service.show(project)
        if project is None:
            raise InvalidInput(
                "say which project to record", fix="npa configure --project PROJECT --store URI"
            )
        return service.record_project(project, values)

    finish(as_json, produce)
