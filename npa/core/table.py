"""Tables in text output: one style everywhere (kubectl's: a header row, no rules), drawn by
rich, as wide as the terminal says.

The width is ``$COLUMNS`` when set (as shells and CI logs set it), else the terminal's; a pipe
or a file gets rows that never wrap, so grep and awk see one row per line. Cells never carry
colour or markup. Numbers are right-aligned and grouped by thousands
(:func:`npa.core.text.number`); a missing value shows as ``-``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from npa.core.text import number

UNWRAPPED = 10_000  # wide enough that no row wraps


def width() -> int:
    """The width text output may use."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if not os.isatty(1):
        return UNWRAPPED
    return shutil.get_terminal_size(fallback=(UNWRAPPED, 24)).columns


def cell(value: object) -> str:
    """A value as one cell: numbers grouped, None as ``-``, everything else as text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return number(value)
    return str(value)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, indent: int = 2
) -> list[str]:
    """``headers`` and ``rows`` as text lines, fitted to :func:`width` (long cells wrap)."""
    from rich.console import Console
    from rich.table import Table

    # kubectl's look: a header row, columns two spaces apart, no rules.
    grid = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), highlight=False)
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) or r[i] is None for r in rows)
        for i in range(len(headers))
    ]
    for header, is_number in zip(headers, numeric, strict=True):
        grid.add_column(header, justify="right" if is_number else "left", overflow="fold")
    for row in rows:
        grid.add_row(*(cell(v) for v in row))
    console = Console(
        width=max(20, width() - indent),
        no_color=True,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
        markup=False,
    )
    with console.capture() as captured:
        console.print(grid)
    pad = " " * indent
    return [pad + line.rstrip() for line in captured.get().splitlines() if line.strip()]
