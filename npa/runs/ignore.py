"""Which files of a source tree are staged: git's ignore rules from ``.gitignore`` and
``.npaignore`` files at any depth (``.npaignore`` read after, so it can override), plus ``.git``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".npaignore")
ALWAYS_IGNORED = frozenset({".git"})


@dataclass
class IgnoreRules:
    """Ignore specs by the directory (relative, '' for the root) whose files declared them."""

    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = field(default_factory=list)

    def enter(self, root: Path, rel_dir: str) -> IgnoreRules:
        """The rules inside ``rel_dir``: these plus any ignore files that directory holds."""
        lines: list[str] = []
        for name in IGNORE_FILES:
            path = root / rel_dir / name
            if path.is_file() and not path.is_symlink():
                lines += path.read_text("utf-8", "replace").splitlines()
        if not lines:
            return self
        return IgnoreRules([*self.specs, (rel_dir, pathspec.GitIgnoreSpec.from_lines(lines))])

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        """Git semantics: the deepest ignore file with a matching pattern decides."""
        if rel_path.rsplit("/", 1)[-1] in ALWAYS_IGNORED:
            return True
        for base, spec in reversed(self.specs):
            local = rel_path[len(base) + 1 :] if base else rel_path
            result = spec.check_file(local + "/" if is_dir else local)
            if result.include is not None:
                return bool(result.include)
        return False
