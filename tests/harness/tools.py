"""Where the harness finds the external tools scripts/bootstrap-tools installs.

A missing tool skips an integration test on a developer's machine (with the command that
installs it) but fails it under CI=true, where a skip would hide a broken set-up.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

BOOTSTRAP = "scripts/bootstrap-tools"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str) -> None:
    message = (
        f"{what} is not installed; run `{BOOTSTRAP}` (then `source ~/.cache/npa-tools/env.sh`)"
    )
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def find_tool(env_var: str, *names: str) -> Path | None:
    """The tool ``env_var`` names (set by env.sh), else the first of ``names`` on PATH."""
    explicit = os.environ.get(env_var)
    if explicit and os.access(explicit, os.X_OK):
        return Path(explicit)
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def require_tool(env_var: str, *names: str) -> Path:
    tool = find_tool(env_var, *names)
    if tool is None:
        missing(names[0] if names else env_var)
        raise AssertionError("unreachable")  # pytest.skip/fail raise
    return tool


def kubebuilder_asset(name: str) -> Path | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        p = Path(assets) / name
        if os.access(p, os.X_OK):
            return p
    return None
