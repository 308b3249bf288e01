"""``npa skypilot status / verify / bootstrap``: the SkyPilot side of a submit.

The checks are the SkyPilot backend's own (its :class:`~npa.backends.base.ChecksItsSide`
capability); these commands open the backend through the registry and ask it.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli.apps import skypilot_app
from npa.cli.common import ContextFlag, JsonFlag, chosen_context, finish

if TYPE_CHECKING:
    from npa.backends.base import ChecksItsSide
    from npa.core.output import Result

Opt = typer.Option


def _side(context: str | None) -> ChecksItsSide:
    """The SkyPilot backend on ``context``, as the capability these commands use."""
    from npa.backends import open_backend
    from npa.backends.base import ChecksItsSide
    from npa.core.paths import NpaPaths

    backend = open_backend("skypilot", NpaPaths.from_env(), context=context)
    assert isinstance(backend, ChecksItsSide)
    return backend


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


@skypilot_app.command("status")
def status(
    project: Annotated[str, Opt("--project", help="Project alias (its namespace is npa-<alias>).")],
    context: ContextFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """API server, jobs controller, kube context, identity, namespace/RBAC and client version."""

    def produce() -> Result:
        chosen = chosen_context(context, ["npa", "skypilot", "status"], project=project)
        return _side(chosen).side_status(project)

    finish(as_json, produce)


@skypilot_app.command("verify")
def verify(
    project: Annotated[
        str | None, Opt("--project", help="Check pod access in npa-<project>.")
    ] = None,
    context: ContextFlag = None,
    namespace: Annotated[
        str | None, Opt("--namespace", help="Check pod access in this namespace instead.")
    ] = None,
    output_format: Annotated[
        OutputFormat, Opt("--output-format", help="text or json.")
    ] = OutputFormat.text,
    as_json: JsonFlag = False,
) -> None:
    """Can SkyPilot use this cluster? Nodes, GPUs, pod permissions and SkyPilot's own check."""

    def produce() -> Result:
        chosen = chosen_context(context, ["npa", "skypilot", "verify"], project=project)
        return _side(chosen).side_verify(project=project, namespace=namespace)

    finish(as_json or output_format is OutputFormat.json, produce)


@skypilot_app.command("bootstrap")
def bootstrap(
    venv: Annotated[
        Path | None,
        Opt("--venv", help="The environment SkyPilot runs in (default: npa's own)."),
    ] = None,
    repair: Annotated[
        bool, Opt("--repair", help="Fix a wrong kubernetes client or SkyPilot version in place.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create or repair SkyPilot's environment with a kubernetes client SkyPilot works with."""

    def produce() -> Result:
        return _side(None).side_bootstrap(venv, repair=repair)

    finish(as_json, produce)
