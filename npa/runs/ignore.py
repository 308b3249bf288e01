"""Which files of a source tree are staged.

- git's ignore rules from ``.gitignore`` and ``.npaignore`` files at any depth (``.npaignore``
  read after, so it can override), the deepest matching pattern deciding;
- ``.git`` is never staged, nor npa's own state (NPA_HOME, a ``file://`` store) when it lies
  inside the tree: a spec in ``$HOME`` would otherwise stage ``~/.npa`` while npa writes to it;
- a file that looks like a credential (:func:`looks_like_credential`) is not staged unless a
  ``.npaignore`` names it with ``!``; otherwise staging is refused, naming each one, so a
  ``.env`` beside a spec never leaves the machine by accident.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from npa.core.errors import InvalidInput
from npa.core.userfiles import read_user_bytes

IGNORE_FILES = (".gitignore", ".npaignore")
NPAIGNORE = ".npaignore"
ALWAYS_IGNORED = frozenset({".git"})
IGNORE_FILE_LIMIT = 1 << 20

# File names (or path endings) that hold credentials: secrets in environment files, private
# keys and certificates' keys, SSH identities, cloud and registry credentials, kubeconfigs.
CREDENTIAL_NAMES = (
    ".env",
    ".env.*",
    "*.env",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "id_rsa_*",
    "id_ed25519_*",
    "credentials",
    "credentials.json",
    "*.credentials",
    "service-account*.json",
    ".netrc",
    ".pgpass",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    ".dockercfg",
    "htpasswd",
    ".htpasswd",
    "kubeconfig",
    "kubeconfig.*",
    "*.kubeconfig",
)
CREDENTIAL_PATHS = (".kube/config", ".docker/config.json", ".aws/config")
# Templates of those files, which hold no secret by convention.
TEMPLATE_SUFFIXES = (".example", ".sample", ".template", ".dist", ".pub")


def looks_like_credential(rel_path: str) -> bool:
    """Whether the file at ``rel_path`` (relative, '/'-separated) is named like a credential."""
    name = rel_path.rsplit("/", 1)[-1]
    if name.lower().endswith(TEMPLATE_SUFFIXES):
        return False
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in CREDENTIAL_NAMES):
        return True
    return any(rel_path == p or rel_path.endswith("/" + p) for p in CREDENTIAL_PATHS)


@dataclass(frozen=True)
class _Spec:
    base: str  # the directory (relative, '' for the root) whose ignore files these are
    spec: pathspec.GitIgnoreSpec
    npaignore_from: int  # index of the first pattern that came from .npaignore


@dataclass
class _Found:
    """What the walk met that the caller reports: shared by every directory's rules."""

    credentials: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


@dataclass
class IgnoreRules:
    """Ignore specs by the directory whose files declared them, plus what is never staged.

    ``excluded`` holds paths relative to the tree root that are npa's own state (never staged,
    whatever the ignore files say)."""

    specs: list[_Spec] = field(default_factory=list)
    excluded: frozenset[str] = frozenset()
    found: _Found = field(default_factory=_Found)

    @classmethod
    def for_tree(cls, root: Path, state: Iterable[Path] = ()) -> IgnoreRules:
        """The rules at the top of ``root``, leaving out each of ``state`` inside it."""
        top = os.path.realpath(root)
        excluded = set()
        for path in state:
            real = os.path.realpath(path)
            if real != top and real.startswith(top.rstrip("/") + "/"):
                excluded.add(os.path.relpath(real, top).replace(os.sep, "/"))
        return cls(excluded=frozenset(excluded))

    def enter(self, root: Path, rel_dir: str) -> IgnoreRules:
        """The rules inside ``rel_dir``: these plus any ignore files that directory holds."""
        lines: list[str] = []
        npaignore_from = 0
        for name in IGNORE_FILES:
            if name == NPAIGNORE:
                npaignore_from = len(lines)
            path = root / rel_dir / name
            if path.is_file() and not path.is_symlink():
                raw = read_user_bytes(path, "ignore file", limit=IGNORE_FILE_LIMIT)
                lines += raw.decode("utf-8", "replace").splitlines()
        if not lines:
            return self
        spec = _Spec(rel_dir, pathspec.GitIgnoreSpec.from_lines(lines), npaignore_from)
        return IgnoreRules([*self.specs, spec], self.excluded, self.found)

    def _decide(self, rel_path: str, is_dir: bool) -> tuple[bool | None, bool]:
        """(ignored, by .npaignore) from the deepest ignore file with a matching pattern;
        ignored is None when no pattern matches."""
        for rule in reversed(self.specs):
            local = rel_path[len(rule.base) + 1 :] if rule.base else rel_path
            result = rule.spec.check_file(local + "/" if is_dir else local)
            if result.include is not None:
                index = result.index if result.index is not None else -1
                return bool(result.include), index >= rule.npaignore_from
        return None, False

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        """Whether ``rel_path`` is left out. A credential-like file that no ``.npaignore``
        names with ``!`` is left out too, and recorded so staging can be refused."""
        if rel_path.rsplit("/", 1)[-1] in ALWAYS_IGNORED:
            return True
        if rel_path in self.excluded:
            self.found.left_out.append(rel_path)
            return True
        ignored, by_npaignore = self._decide(rel_path, is_dir)
        if ignored:
            return True
        if not is_dir and looks_like_credential(rel_path):
            if ignored is False and by_npaignore:
                return False  # named with "!" in a .npaignore: the user's explicit choice
            self.found.credentials.append(rel_path)
            return True
        return False

    def check(self, root: Path) -> None:
        """Refuse the tree if the walk met credential-like files nobody chose to stage."""
        found = sorted(self.found.credentials)
        if not found:
            return
        shown = ", ".join(found[:20]) + (f" (+{len(found) - 20} more)" if len(found) > 20 else "")
        ignore = root / NPAIGNORE
        include = " ".join(f"!{p}" for p in found[:3])
        raise InvalidInput(
            f"source {root} holds files that look like credentials ({shown}); npa stages "
            "them only when you say so. To leave them out, list them in "
            f"{ignore}; to stage one anyway, add it there with '!' (e.g. {include})",
            fix="printf '%s\\n' " + " ".join(f"'{p}'" for p in found[:20]) + f" >> {ignore}",
            details={"credentials": found},
        )
