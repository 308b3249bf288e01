"""Where npa's templates are: the task templates and the report page.

They live in the repository's top-level ``templates/`` (people review them there); an installed
wheel carries them under ``<prefix>/share/npa/templates``.
"""

from __future__ import annotations

import os
from pathlib import Path


def templates_dir(marker: str) -> Path:
    """``$NPA_TEMPLATES_DIR``, else the repository's ``templates/`` (a checkout or an editable
    install), else the copy an installed wheel put under ``<prefix>/share/npa/templates``.
    ``marker`` is a template file the folder must hold."""
    override = os.environ.get("NPA_TEMPLATES_DIR")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if (checkout / marker).is_file():
        return checkout
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("npa").files or []
    except PackageNotFoundError:
        files = []
    for file in files:
        if file.name == marker and file.parent.name == "templates":
            return Path(str(file.locate())).resolve().parent
    return checkout  # missing: the caller's error names this path
