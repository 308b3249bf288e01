"""The complexity bound ``make lint`` checks: no function or method of ``npa`` or ``stacks``
above a cyclomatic complexity of 20 as radon measures it (it counts boolean operators,
comprehension conditions and conditional expressions, which ruff's C901 does not), except in
the files listed in ``EXEMPT`` with their reason.

Every function counts, nested ones included: radon reports a function defined inside another
only as a closure of its parent (and does not add its complexity there), so each ``def`` is
measured here on its own, wherever it sits.

Run it as ``python -m tests.complexity [ROOT]``; it prints each function over the bound and the
counts above 10, 15 and 20, and exits 1 when any non-exempt function is over it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

BOUND = 20
# The folders measured, under ROOT.
PACKAGES = ("npa", "stacks")
# The spec validator: one check per field of a stage, kept together so each rule reads next to
# the field it guards.
EXEMPT = {"npa/spec/validate.py"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """(qualified name, node) for every function under ``tree``, at any depth: module level,
    methods, functions nested in functions and methods of classes nested anywhere."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def complexity_of(node: Function) -> int:
    """Radon's complexity of ``node`` alone (its nested functions are measured on their own)."""
    from radon.visitors import ComplexityVisitor  # type: ignore[import-untyped]

    visitor = ComplexityVisitor.from_ast(ast.Module(body=[node], type_ignores=[]))
    (block,) = visitor.functions
    return int(block.complexity)


def measure(root: Path) -> list[tuple[int, str, str]]:
    """(complexity, file, function) for every function and method under ``root``/npa and
    ``root``/stacks."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text("utf-8"), rel)
            for name, node in functions(tree):
                found.append((complexity_of(node), rel, f"{name} (line {node.lineno})"))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    found = measure(root)
    over = sorted((f for f in found if f[0] > BOUND and f[1] not in EXEMPT), reverse=True)
    for complexity, rel, name in over:
        print(f"{rel}: {name} has complexity {complexity} (bound {BOUND})")
    above_10 = sum(1 for f in found if f[0] > 10)
    above_15 = sum(1 for f in found if f[0] > 15)
    above_20 = sum(1 for f in found if f[0] > BOUND)
    print(
        f"complexity: {len(found)} functions, {above_10} above 10, {above_15} above 15, "
        f"{above_20} above {BOUND} ({above_20 - len(over)} in exempt files)"
    )
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
