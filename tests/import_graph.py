"""The import-graph check ``make lint`` runs: imports follow the layer order docs/development.md
documents ("How the code is layered"), and no package cycle.

Layers, top to bottom::

    5  npa.__main__, npa.cli
    4  npa.services
    3  npa.spec, npa.plan, npa.images, npa.render, npa.runs, npa.launch, npa.insights,
       npa.targets                                                                 (domain)
    2  npa.adapters.*, npa.backends, stacks                                         (adapters)
    1  npa.core, npa (the package itself: its version)

A module may import its own layer or any layer below it. Within the domain, each package may
import only the domain packages ``DOMAIN`` lists for it (the documented table). Within the
other layers, packages may import one another, but the package graph has no cycle (a package is
``npa.<name>``, each ``npa.adapters.<name>`` on its own, and ``stacks``, the Pulumi programs
beside ``npa``, which the infra adapter runs). Outside ``npa.backends`` a backend is reached
through the registry (``npa.backends``) and the interface (``npa.backends.base``) only, never by
importing a backend's own folder (any package under ``npa/backends/``, found on disk, so a new
backend is covered the day its folder exists), with no exception: ``render`` too reaches the
encoder through the registry. Upward imports still owed are listed, with their reason, in
``UPWARD_EXCEPTIONS``.

Run it as ``python -m tests.import_graph [ROOT]``; it prints each violation and exits 1.
Every import counts, also those inside functions and under ``if TYPE_CHECKING``, and a module
named in a string to ``importlib.import_module`` or ``__import__`` (an f-string counts by its
leading constant part: ``f"stacks.{kind}"`` imports the ``stacks`` package). ``from P import M``
imports ``P.M`` as well when ``M`` is a module or package of ours (``from npa.backends import
local`` imports the backend's folder).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LAYERS: dict[str, int] = {
    "__main__": 5,
    "cli": 5,
    "services": 4,
    "spec": 3,
    "plan": 3,
    "images": 3,
    "render": 3,
    "runs": 3,
    "launch": 3,
    "insights": 3,
    "targets": 3,
    "adapters": 2,
    "backends": 2,
    "stacks": 2,  # the top-level stacks/ package: Pulumi programs the infra adapter runs
    "core": 1,
    "": 1,  # npa/__init__.py
}
# The domain packages each domain package may import (docs/development.md's table); importing
# one not listed, in either direction, is refused even when it closes no cycle.
DOMAIN: dict[str, set[str]] = {
    "spec": set(),
    "plan": {"spec"},
    "images": {"spec"},
    "runs": {"spec", "plan"},
    "render": {"spec", "plan", "images"},
    "launch": {"spec", "plan", "runs"},
    "insights": {"spec", "plan", "runs"},
    "targets": {"spec", "plan"},
}
# Upward imports known and owed, each with its reason; the list may only shrink.
UPWARD_EXCEPTIONS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module
    path: Path
    line: int


OURS = ("npa", "stacks")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _ours(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in OURS)


def _named_module(node: ast.Call) -> str | None:
    """The module a call to ``importlib.import_module`` or ``__import__`` names, when it names
    one absolutely (a constant, or an f-string's constant head up to its last dot)."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str) and "." in head.value:
            return head.value.rsplit(".", 1)[0]
    return None


def _is_module(root: Path, name: str) -> bool:
    """Whether ``name`` is a module or package of ours under ``root`` (the ``npa`` folder) or
    ``stacks/`` beside it."""
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _targets(root: Path, node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if not node.level:
            source = node.module or ""
        else:
            base = module.split(".")
            base = base if is_package else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        # ``from npa.backends import local`` imports the module npa.backends.local: each
        # module named is the import (of the same package and layer as ``source``).
        named = [f"{source}.{alias.name}" for alias in node.names]
        modules = [n for n in named if _ours(n) and _is_module(root, n)]
        return modules or [source]
    if isinstance(node, ast.Call):
        named = _named_module(node)
        return [named] if named else []
    return []


def sources(root: Path) -> Iterator[Path]:
    """The modules read: the ``npa`` package at ``root`` and ``stacks/`` beside it."""
    yield from sorted(root.rglob("*.py"))
    yield from sorted((root.parent / "stacks").rglob("*.py"))


def imports(root: Path) -> Iterator[Import]:
    """Every import of ``npa`` or ``stacks`` made by a module of either (``root`` is the ``npa``
    package folder; ``stacks/`` is read beside it)."""
    for path in sources(root):
        module = module_name(root, path)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            for target in _targets(root, node, module, is_package):
                if _ours(target):
                    yield Import(module, target, path, getattr(node, "lineno", 0))


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "stacks":
        return LAYERS["stacks"]
    name = parts[1] if len(parts) > 1 else ""
    if name not in LAYERS or name == "stacks":
        raise SystemExit(f"{module}: package npa.{name} has no layer in tests/import_graph.py")
    return LAYERS[name]


def package_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "stacks":
        return "stacks"
    if len(parts) > 2 and parts[1] == "adapters":
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def domain_refusal(source: str, target: str) -> str | None:
    """Why ``source`` (a package) may not import ``target``, when both are domain packages and
    the documented table does not allow it."""
    mine, theirs = source.removeprefix("npa."), target.removeprefix("npa.")
    if mine not in DOMAIN or theirs not in DOMAIN or mine == theirs or theirs in DOMAIN[mine]:
        return None
    allowed = ", ".join(sorted(DOMAIN[mine])) or "no other domain package"
    return f"domain order: {source} may import {allowed}, not {target}"


def backend_folders(root: Path) -> list[str]:
    """Each backend's own folder, as a module name: every package under ``npa/backends``."""
    folder = root / "backends"
    return sorted(
        f"npa.backends.{p.name}" for p in folder.iterdir() if (p / "__init__.py").is_file()
    )


def backend_folder(target: str, folders: list[str]) -> str | None:
    """The backend folder ``target`` is in or is, if any."""
    return next((f for f in folders if target == f or target.startswith(f + ".")), None)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def violations(root: Path) -> list[str]:
    """Every upward import, import against the domain order, backend-folder import and package
    cycle under ``root`` (the ``npa`` package folder) and ``stacks/`` beside it."""
    problems: list[str] = []
    edges: dict[str, set[str]] = {}
    folders = backend_folders(root)
    for imp in imports(root):
        where = f"{imp.path}:{imp.line}"
        owed = (imp.module, imp.target) in UPWARD_EXCEPTIONS
        if layer_of(imp.target) > layer_of(imp.module) and not owed:
            problems.append(f"{where}: upward import: {imp.module} imports {imp.target}")
        if backend_folder(imp.target, folders) and not imp.module.startswith("npa.backends"):
            problems.append(
                f"{where}: {imp.module} imports a backend's folder ({imp.target}); use the "
                "interface in npa.backends.base and the registry in npa.backends"
            )
        source, target = package_of(imp.module), package_of(imp.target)
        refusal = domain_refusal(source, target)
        if refusal and not owed:
            problems.append(f"{where}: {refusal} ({imp.module} imports {imp.target})")
        if source != target:
            edges.setdefault(source, set()).add(target)
    for component in cycles(edges):
        problems.append("package cycle: " + " <-> ".join(component))
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "npa"
    problems = violations(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} import-graph violation(s)", file=sys.stderr)
        return 1
    print(f"import graph ok: {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
