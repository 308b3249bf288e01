"""``provision-if-absent`` and ``teardown``: the infrastructure a project's runs need."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli import complete
from npa.cli.apps import app
from npa.cli.common import JsonFlag, finish

if TYPE_CHECKING:
    from npa.core.output import Result
    from npa.services.provision import StackReport

Opt = typer.Option

ProjectOpt = Annotated[
    str | None,
    Opt("--project", help="Project alias (npa configure).", autocompletion=complete.projects),
]
TargetOpt = Annotated[
    str, Opt("--target", help="local, kubernetes or nebius.", autocompletion=complete.targets)
]
ContextOpt = Annotated[
    str | None,
    Opt(
        "--context",
        help="Kube context (its kubeconfig goes to ~/.npa/clusters/).",
        autocompletion=complete.contexts,
    ),
]
BackendOpt = Annotated[
    str | None,
    Opt(
        "--backend-url",
        help="Pulumi state backend: file://, s3://, gs://, azblob://, postgres:// or a Pulumi "
        "Cloud URL (default: $PULUMI_BACKEND_URL, then npa configure --backend-url, then "
        "file:// under NPA_HOME).",
    ),
]
PreviewOpt = Annotated[bool, Opt("--preview", help="Show what would change; change nothing.")]
YesOpt = Annotated[bool, Opt("--yes", help="Apply without asking (required without a terminal).")]


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def _progress(line: str) -> None:
    """Live progress goes to stderr, so stdout stays the result (text or --json)."""
    typer.echo(line, err=True)


def _confirm(verb: str, destroy: bool = False) -> Callable[[list[StackReport]], bool]:
    def ask(reports: list[StackReport]) -> bool:
        from npa.services.provision import stack_text

        for report in reports:
            for line in stack_text(report, destroy=destroy):
                typer.echo(line, err=True)
        typer.echo(f"{verb}? [y/N] ", err=True, nl=False)
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask


@app.command("provision-if-absent")
def provision_if_absent(
    project: ProjectOpt = None,
    target: TargetOpt = "local",
    context: ContextOpt = None,
    kubeconfig: Annotated[
        Path | None,
        Opt(
            "--kubeconfig",
            help="Kubeconfig holding --context, or a list like $KUBECONFIG "
            "(default: $KUBECONFIG, then ~/.kube/config).",
        ),
    ] = None,
    preview: PreviewOpt = False,
    yes: YesOpt = False,
    backend_url: BackendOpt = None,
    spec: Annotated[
        Path | None, Opt("--spec", help="Take the cluster shape (or local disk need) from a spec.")
    ] = None,
    quota_file: Annotated[
        list[Path] | None, Opt("--quota-file", help="Quota figures to review offline (repeatable).")
    ] = None,
    nebius_project: Annotated[
        str | None, Opt("--nebius-project", help="Ask the Nebius quota API for this project id.")
    ] = None,
    nebius_region: Annotated[str | None, Opt("--nebius-region", help="Nebius region.")] = None,
    nebius_endpoint: Annotated[
        str | None, Opt("--nebius-endpoint", help="Nebius API address override.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Quota gate, preview, then create what the target lacks (Pulumi stacks).

    Always previews first. --preview stops there and changes nothing; on a terminal npa asks
    before applying; without one it applies only with --yes. Exit 0 when applied or nothing was
    missing, 1 when blocked by quota or not applied, 4 when the quota is unknown.
    """

    def produce() -> Result:
        from npa.services.provision import ProvisionRequest
        from npa.services.provision import provision_if_absent as service
        from npa.targets.base import QuotaApiAsk

        request = ProvisionRequest(
            project=project,
            target=target,
            context=context,
            kubeconfig=kubeconfig,
            backend_url=backend_url,
            preview_only=preview,
            yes=yes,
            spec=spec,
            quota_files=quota_file or [],
            quota_api=QuotaApiAsk(nebius_project, nebius_region, nebius_endpoint),
            progress=_progress,
        )
        interactive = _interactive() and not as_json
        return service(request, interactive=interactive, confirm=_confirm("apply"))

    finish(as_json, produce)


@app.command("teardown")
def teardown(
    project: ProjectOpt = None,
    target: TargetOpt = "local",
    context: ContextOpt = None,
    preview: PreviewOpt = False,
    yes: YesOpt = False,
    backend_url: BackendOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Destroy the target's stacks in reverse order (refused while the project has runs)."""

    def produce() -> Result:
        from npa.services.provision import TeardownRequest
        from npa.services.provision import teardown as service

        request = TeardownRequest(
            project=project,
            target=target,
            context=context,
            backend_url=backend_url,
            preview_only=preview,
            yes=yes,
            progress=_progress,
        )
        interactive = _interactive() and not as_json
        return service(request, interactive=interactive, confirm=_confirm("destroy", True))

    finish(as_json, produce)
