"""``npa workbench workflow preflight-images``: resolve and verify every tool's image."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli.apps import workflow_app
from npa.cli.common import JsonFlag, finish

if TYPE_CHECKING:
    from npa.core.output import Result

Opt = typer.Option


@workflow_app.command("preflight-images")
def preflight_images(
    spec: Annotated[Path, typer.Argument(help="Workflow spec file.", show_default=False)],
    registry: Annotated[
        str | None,
        Opt(
            "--registry",
            metavar="HOST[:PORT][/NAMESPACE]",
            help="HOST[:PORT][/NAMESPACE] that references without a registry host resolve "
            "under (default: the project's, else Docker Hub).",
        ),
    ] = None,
    project: Annotated[
        str | None,
        Opt("--project", metavar="ALIAS", help="Project alias: its registry and kube context."),
    ] = None,
    context: Annotated[
        str | None,
        Opt(
            "--context",
            metavar="CTX",
            help="Kube context the capability probe of unattested images runs in.",
        ),
    ] = None,
    image_override: Annotated[
        list[str] | None,
        Opt(
            "--image-override",
            metavar="TOOL_REF=IMAGE",
            help="TOOL_REF=IMAGE: verify (and render) IMAGE for that tool. Repeatable.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        Opt("--image", metavar="IMAGE", help="IMAGE for every tool without an --image-override."),
    ] = None,
    registry_auth: Annotated[
        list[str] | None,
        Opt(
            "--registry-auth",
            metavar="HOST=env:VAR|FILE",
            help="HOST=env:VAR (VAR holds USER:PASSWORD) or a Docker config.json path. "
            "Repeatable; ~/.docker/config.json is read after these.",
        ),
    ] = None,
    probe_timeout: Annotated[
        float,
        Opt(
            "--probe-timeout",
            metavar="SECONDS",
            min=1,
            max=3600,
            help="Seconds a capability probe may take.",
        ),
    ] = 120.0,
    as_json: JsonFlag = False,
) -> None:
    """Fetch each tool's manifest as a node would and report ok / not_found / forbidden /
    unreachable, the digest, and how its bootstrap contract was verified."""

    def produce() -> Result:
        from npa.services import images as service

        return service.preflight(
            spec,
            registry=registry,
            project=project,
            context=context,
            image_overrides=image_override or [],
            image=image,
            registry_auth=registry_auth or [],
            probe_timeout=probe_timeout,
        )

    finish(as_json, produce)
