"""The provider plugin each installed Pulumi SDK asks for, read from the SDK itself.

A Pulumi provider SDK ships ``pulumi-plugin.json`` naming the plugin (and its exact version) its
resources run on. Reading it means the SDK pin in pyproject.toml is the one place that version
is written: the plugin npa checks for is the one the installed SDK will request."""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path

from npa.core.errors import ToolMissing


@cache
def sdk_plugin(package: str) -> tuple[str, str, str]:
    """``(kind, name, version)`` of the plugin the installed SDK ``package`` asks for.

    Found without importing the SDK (a Pulumi SDK takes seconds to import)."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        manifest = Path(folder) / "pulumi-plugin.json"
        if manifest.is_file():
            data = json.loads(manifest.read_text(encoding="utf-8"))
            kind = "resource" if data.get("resource") else "language"
            return kind, str(data["name"]), str(data["version"])
    dist = package.replace("_", "-")
    raise ToolMissing(
        f"the Pulumi SDK {package} (or its pulumi-plugin.json) is not installed",
        fix=f"pip install -c constraints.txt '{dist}'",
    )
