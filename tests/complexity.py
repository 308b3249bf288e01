"""The complexity bound ``make lint`` checks: no function or method of ``npa`` above a cyclomatic
complexity of 20 as radon measures it (it counts boolean operators, comprehension conditions
and conditional expressions, which ruff's C901 does not), except in the files listed in
``EXEMPT`` with their reason.

Run it as ``python -m tests.complexity [ROOT]``; it prints each function over the bound and the
counts above 10 and 20, and exits 1 when any non-exempt function is over it.
"""

from __future__ import annotations

import sys
from pathlib import Path

BOUND = 20
# The spec validator: one check per field of a stage, kept together so each rule reads next to
# the field it guards.
EXEMPT = {"npa/spec/validate.py"}


def measure(root: Path) -> list[tuple[int, str, str]]:
    """(complexity, file, function) for every function and method under ``root``/npa."""
    from radon.complexity import cc_visit  # type: ignore[import-untyped]

    found = []
    for path in sorted((root / "npa").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for block in cc_visit(path.read_text()):
            if type(block).__name__ == "Class":
                continue
            name = f"{block.classname}.{block.name}" if block.classname else block.name
            found.append((block.complexity, rel, f"{name} (line {block.lineno})"))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    found = measure(root)
    over = sorted((f for f in found if f[0] > BOUND and f[1] not in EXEMPT), reverse=True)
    for complexity, rel, name in over:
        print(f"{rel}: {name} has complexity {complexity} (bound {BOUND})")
    above_10 = sum(1 for f in found if f[0] > 10)
    above_20 = sum(1 for f in found if f[0] > BOUND)
    print(
        f"complexity: {len(found)} functions, {above_10} above 10, {above_20} above {BOUND} "
        f"({above_20 - len(over)} in exempt files)"
    )
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
