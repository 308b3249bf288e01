"""The names check ``make lint`` runs: the code of ``npa/services`` and ``npa/launch`` names no
execution backend and no provisioning target. They reach a backend through ``ExecutionBackend``
and its capabilities (``npa/backends/base.py``) and a target through ``Target`` and its
capabilities (``npa/targets/base.py``); only the registries (``npa/backends/__init__.py``,
``npa/targets/__init__.py``), the backends' and targets' own folders, the CLI and the adapters
know a name.

The names are found on disk, so a new backend or target is covered the day its folder exists:
every package under ``npa/backends`` and ``npa/targets`` (today ``local``, ``skypilot``,
``kubernetes``, ``nebius``), and ``ALIASES``, the other spellings code uses for one of them.

What counts is code, read from the syntax tree:

- an identifier (a name, an attribute, a parameter, a keyword argument, a function or class
  name, an imported name) one of whose words is a name; words split at ``_`` and at a change
  from lower to upper case (``SkyPilotBackend`` is ``sky pilot backend``, so ``sky`` counts);
- a string literal (f-strings included) one of whose words is a name, words split at anything
  that is not a letter or digit (``"--target kubernetes"``, ``"kubernetes-pods"``).

Comments and docstrings do not count: they explain where a rule comes from ("SkyPilot retries a
start by itself"), which is not the same as code deciding by a name. ``ORDINARY_WORDS`` are
names that are also words npa uses in other senses (``local``: the local store, a local path,
``--local-quota``); for them identifiers do not count, and a string counts only when it is the
name alone (``"local"``) or the name follows ``--target`` or ``--infra`` in it.

Run it as ``python -m tests.names [ROOT]``; it prints each line that names one and exits 1.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

# The packages whose code may name no backend and no target, under the npa folder.
CHECKED = ("services", "launch")
# The folders whose packages are the names.
NAMED = ("backends", "targets")
# Other spellings of a name: SkyPilot's own module and CLI (``sky``), and the ``--infra`` prefix
# of a Kubernetes context (``k8s/<context>``).
ALIASES = {"sky": "skypilot", "k8s": "kubernetes"}
ORDINARY_WORDS = {"local"}


def names(root: Path) -> dict[str, str]:
    """Each word that names a backend or a target -> the name it spells."""
    found = {
        p.name: p.name
        for folder in NAMED
        for p in sorted((root / folder).iterdir())
        if (p / "__init__.py").is_file()
    }
    return found | {alias: name for alias, name in ALIASES.items() if name in found}


def identifier_words(text: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    return {w.lower() for w in re.findall(r"[A-Za-z0-9]+", spaced)}


def string_words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)} | identifier_words(text)


def ordinary_named(text: str, word: str) -> bool:
    """Whether the string ``text`` names the ordinary word ``word`` as a backend or target."""
    flagged = re.search(rf"--(target|infra)[ =]{re.escape(word)}\b", text, re.IGNORECASE)
    return text.strip().lower() == word or flagged is not None


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def identifiers(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword):
        return [node.arg] if node.arg else []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.alias):
        return [node.name, *([node.asname] if node.asname else [])]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module]
    return []


def mentions(path: Path, words: dict[str, str]) -> Iterator[tuple[int, str, str]]:
    """(line, the name, what named it) for each mention in the code of ``path``."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    skip = docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for ident in identifiers(node):
            for word in sorted(identifier_words(ident) & words.keys() - ORDINARY_WORDS):
                yield line, words[word], f"identifier {ident}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            for word in sorted(string_words(text) & words.keys()):
                if word not in ORDINARY_WORDS or ordinary_named(text, word):
                    yield line, words[word], f"string {text[:60]!r}"


def violations(root: Path) -> list[str]:
    """Every mention of a backend or target name in the code of the checked packages under
    ``root`` (the ``npa`` package folder)."""
    words = names(root)
    found: list[str] = []
    for package in CHECKED:
        for path in sorted((root / package).rglob("*.py")):
            for line, name, what in sorted(set(mentions(path, words))):
                found.append(f"{path}:{line}: names {name!r}: {what}")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "npa"
    found = violations(root)
    for problem in found:
        print(problem)
    if found:
        lines = len({p.split(": names ")[0] for p in found})
        print(
            f"{lines} line(s) of {', '.join(f'npa/{p}' for p in CHECKED)} name a backend or a "
            "target; reach it through its interface and capabilities (docs/development.md)",
            file=sys.stderr,
        )
        return 1
    print(f"names ok: {', '.join(f'npa/{p}' for p in CHECKED)} name no backend and no target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
