"""Every SkyPilot import in npa runs with SkyPilot's home moved off ``~/.sky``, or is one of
the few listed here with the reason it may not.

Importing SkyPilot creates ``~/.sky/{user_hash,serve,locks}``; a read-only command that reached
one import outside :func:`npa.adapters.skypilot.home.private_home` would write in the user's
home. An import counts as covered when it sits (lexically) in a ``with`` block that enters
``private_home()`` or a ``_sdk()`` (the managed-jobs client's wrapper, which enters it for
reads), or in a function whose every caller in npa is such a block (listed in CALLED_INSIDE).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "npa"
COVERING = {"private_home", "_sdk"}
# Functions that import SkyPilot and are only called inside a covering block.
CALLED_INSIDE = {
    ("npa/adapters/skypilot/api.py", "_api_server"): "api_server enters private_home",
    ("npa/adapters/skypilot/api.py", "_jobs_controller"): "jobs_controller enters private_home",
    ("npa/adapters/skypilot/api.py", "_check_kubernetes"): "check_kubernetes enters it",
    ("npa/backends/skypilot/jobs.py", "_health_check_failed"): "called by _request, in _sdk",
    ("npa/backends/skypilot/jobs.py", "_request"): "every call is inside a _sdk block",
    ("npa/adapters/kube/pods.py", "managed_job_clusters"): "its callers enter private_home",
}
# SkyPilot run with the user's own home, on purpose: not a read.
OWN_HOME = {
    ("npa/backends/skypilot/jobs.py", "build_dag"): "submit's launch",
    ("npa/adapters/skypilot/layer.py", "applied"): "submit's launch (the config layer)",
    ("npa/adapters/skypilot/keeper.py", "keep"): "the API server npa starts for a launch",
}


def _sky_imports() -> list[tuple[str, str, bool, int]]:
    """(file, enclosing function, covered by a with block, line) of each SkyPilot import."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT.parent))
        tree = ast.parse(path.read_text("utf-8"))

        def visit(node: ast.AST, function: str, covered: bool, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                name, cover = function, covered
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = child.name
                if isinstance(child, ast.With):
                    for item in child.items:
                        call = item.context_expr
                        # `private_home() if private else nullcontext()` counts as covering too
                        calls = [n for n in ast.walk(call) if isinstance(n, ast.Call)]
                        for c in calls:
                            f = c.func
                            called = (
                                f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                            )
                            cover = cover or called in COVERING
                if isinstance(child, ast.Import | ast.ImportFrom):
                    names = [a.name for a in child.names] if isinstance(child, ast.Import) else [
                        child.module or ""]  # fmt: skip
                    if any(n == "sky" or n.startswith("sky.") for n in names):
                        found.append((rel, name, cover, child.lineno))
                visit(child, name, cover, rel)

        visit(tree, "<module>", False)
    return found


def test_every_skypilot_import_runs_with_skypilots_home_moved() -> None:
    imports = _sky_imports()
    assert imports, "SkyPilot is imported somewhere"
    loose = [
        f"{file}:{line} in {function}"
        for file, function, covered, line in imports
        if not covered and (file, function) not in CALLED_INSIDE | OWN_HOME.keys()
        and function != "<module>"  # TYPE_CHECKING-only imports at module level
    ]  # fmt: skip
    assert loose == [], "SkyPilot imported outside private_home: " + ", ".join(loose)


def test_module_level_skypilot_imports_are_for_type_checking_only() -> None:
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert not (module or "").startswith("sky"), path
