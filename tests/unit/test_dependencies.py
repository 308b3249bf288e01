"""Every third-party module npa imports at run time comes from a dependency pyproject.toml
declares (a dev extra is not enough: users install without it)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert match, requirement
        names.add(_normal(match.group(0)))
    return names


def imported_top_levels(package: Path) -> dict[str, str]:
    """Top-level module -> one place that imports it, for every import under ``package``."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                found.setdefault(top, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_runtime_import_is_a_declared_dependency() -> None:
    distributions = packages_distributions()
    wanted = declared()
    missing = []
    for module, where in sorted(imported_top_levels(ROOT / "npa").items()):
        if module in sys.stdlib_module_names or module in ("npa", "stacks", "__future__"):
            continue
        owners = {_normal(d) for d in distributions.get(module, [])}
        assert owners, f"{where}: {module} is imported but no installed distribution provides it"
        if not owners & wanted:
            missing.append(f"{where}: {module} (from {', '.join(sorted(owners))})")
    assert not missing, "imported but not declared in [project] dependencies:\n" + "\n".join(
        missing
    )
