"""The docs cannot drift from the CLI: every ``npa ...`` command line in README.md, docs/ and the
runbooks under skills/ (in a fenced code block or an inline code span) names a command that
exists, with flags that command has. The runbooks' index lists every runbook, and each has the
front matter an agent reads (name, description). Every row of docs/conventions.md states its rule
once and links tests that exist (a ``file.py::test_name`` link names a test that file defines)."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SKILLS = ROOT / "skills"
# Where a shell line stops being the npa command: a pipe, a list, a comment, a redirection.
_END = re.compile(r"\s(?:\||&&|\|\||;|#|>|2>)(?:\s|$)")
_FENCE = re.compile(r"^\s*```")


def doc_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted(SKILLS.rglob("*.md")),
    ]


def command_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, command) of each npa command in fenced blocks and inline code spans."""
    fenced = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if pending is not None:  # the continuation of a line ending in a backslash
                start, head = pending
                joined = head + " " + line.strip()
            else:
                start, joined = number, line.strip().removeprefix("$ ")
            if joined.endswith("\\"):
                pending = (start, joined[:-1].rstrip())
                continue
            pending = None
            if joined.startswith("npa "):
                yield start, joined
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if span.startswith("npa "):
                yield number, span


@functools.cache
def _root() -> Any:
    import typer.main

    from npa.cli.main import app

    return typer.main.get_command(app)


def _leaf(tokens: list[str]) -> tuple[Any, list[str], list[str]]:
    command: Any = _root()
    path = ["npa"]
    while tokens and getattr(command, "commands", None) and tokens[0] in command.commands:
        command = command.commands[tokens[0]]
        path.append(tokens.pop(0))
    return command, path, tokens


def problems(line: str, *, strict: bool = False) -> list[str]:
    """What is wrong with one npa command line ([] when the CLI accepts its shape): a command,
    flag or argument it does not have. ``strict`` (a line npa printed, with real values) also
    has click parse it as the command would: a missing required option or a value its type
    refuses is a problem too."""
    line = _END.split(line, maxsplit=1)[0]
    try:
        tokens = shlex.split(line)[1:]
    except ValueError as exc:
        return [f"not a shell line ({exc})"]
    command, path, rest = _leaf(tokens)
    where = " ".join(path)
    if getattr(command, "commands", None):
        if rest and not rest[0].startswith("-") and rest[0] != "...":
            return [f"{where} has no command {rest[0]!r}"]
        return [f"{where} names no command"] if strict else []
    found = _unknown_flags(command, where, rest, strict=strict)
    if not found and strict:
        found = _parse_errors(command, where, rest)
    return found


def _unknown_flags(command: Any, where: str, rest: list[str], *, strict: bool) -> list[str]:
    """Each flag ``command`` does not have, and (``strict``: a docs synopsis such as
    ``[--context NAME]`` is no command line) arguments beyond the ones it takes."""
    options: dict[str, Any] = {"-h": None, "--help": None}
    for param in command.params:
        for opt in (*param.opts, *param.secondary_opts):
            options[opt] = param
    takes = [p.nargs for p in command.params if p.param_type_name == "argument"]
    found, positional = [], 0
    tokens = iter(rest)
    for token in tokens:
        flag = token.split("=", 1)[0]
        if flag.startswith("-") and flag not in ("-", "--"):
            if flag not in options:
                found.append(f"{where} has no flag {flag}")
                continue
            param = options[flag]
            takes_value = param is not None and not param.is_flag and not param.count
            if takes_value and "=" not in token:
                next(tokens, None)  # the option's value
        else:
            positional += 1
    if strict and -1 not in takes and positional > sum(takes):
        found.append(f"{where} takes {sum(takes)} argument(s), given {positional}")
    return found


def _parse_errors(command: Any, where: str, rest: list[str]) -> list[str]:
    """What click says of these arguments, parsed as ``command`` would parse them."""
    try:
        command.make_context(where, list(rest), resilient_parsing=False)
    except Exception as exc:  # click's (typer carries its own copy): a usage error, or an exit
        explain = getattr(exc, "format_message", None)
        if explain is None and hasattr(exc, "exit_code"):
            return []
        if explain is None:
            raise
        return [f"{where}: {explain()}"]
    return []


def _documented() -> list[tuple[str, int, str]]:
    out = []
    for path in doc_files():
        for number, line in command_lines(path.read_text("utf-8")):
            out.append((str(path.relative_to(ROOT)), number, line))
    return out


DOCUMENTED = _documented()


def test_the_docs_have_commands_to_check() -> None:
    assert len(DOCUMENTED) >= 60
    assert {where.split("/")[0] for where, _, _ in DOCUMENTED} >= {"README.md", "docs", "skills"}


@pytest.mark.parametrize(("where", "number", "line"), DOCUMENTED, ids=lambda v: str(v)[:40])
def test_every_documented_command_exists_with_its_flags(where: str, number: int, line: str) -> None:
    assert problems(line) == [], f"{where}:{number}: {line}"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("npa workbench workflow status RUN --project P --no-such-flag", "has no flag"),
        ("npa workbench workflow statuss RUN", "has no command 'statuss'"),
        ("npa skypilot verify --context c --namespaces x", "has no flag --namespaces"),
        ("npa teardown --project p --target local --yes | tee x", None),
        ("npa workbench workflow status RUN --watch --interval=2", None),
        ("npa workbench workflow status RUN STAGE --project P", "takes 1 argument(s), given 2"),
        ("npa workbench workflow status --project P RUN --json", None),
    ],
)
def test_the_checker_finds_drift(line: str, expected: str | None) -> None:
    found = problems(line, strict=expected is not None and "argument" in expected)
    if expected is None:
        assert found == []
    else:
        assert any(expected in p for p in found), found


def test_continued_lines_are_one_command() -> None:
    text = "```sh\nnpa workbench workflow render s.yaml --run-id R \\\n    --no-such x\n```\n"
    [(number, line)] = list(command_lines(text))
    assert number == 2
    assert problems(line) == ["npa workbench workflow render has no flag --no-such"]


def _front_matter(path: Path) -> dict[str, Any]:
    text = path.read_text("utf-8")
    assert text.startswith("---\n"), path
    head = text.split("---\n", 2)[1]
    data = yaml.safe_load(head)
    assert isinstance(data, dict), path
    return data


def test_every_runbook_is_indexed_and_described() -> None:
    runbooks = sorted(SKILLS.rglob("SKILL.md"))
    assert len(runbooks) >= 4
    index = (SKILLS / "README.md").read_text("utf-8")
    linked = set(re.findall(r"\]\(([^)]+/SKILL\.md)\)", index))
    assert linked == {str(p.relative_to(SKILLS)) for p in runbooks}
    names = set()
    for runbook in runbooks:
        meta = _front_matter(runbook)
        assert isinstance(meta.get("name"), str) and meta["name"], runbook
        assert isinstance(meta.get("description"), str) and len(meta["description"]) > 20
        names.add(meta["name"])
        assert any(line for _, line in command_lines(runbook.read_text("utf-8"))), runbook
    assert len(names) == len(runbooks)


_LINK = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _convention_rows() -> list[tuple[int, str, str]]:
    """(line number, the row's convention, its "proved by" cell) of docs/conventions.md."""
    rows = []
    text = (ROOT / "docs" / "conventions.md").read_text("utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and cells[0] not in ("area", "---"):
            rows.append((number, cells[1], cells[3]))
    return rows


def _defined_tests(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text("utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def test_every_convention_links_tests_that_exist() -> None:
    rows = _convention_rows()
    assert len(rows) >= 30
    for number, convention, proved_by in rows:
        links = _LINK.findall(proved_by)
        assert links, f"docs/conventions.md:{number}: {convention!r} links no test"
        for file, node in links:
            path = ROOT / file
            assert path.is_file(), f"docs/conventions.md:{number}: {file} does not exist"
            if node:
                assert node in _defined_tests(path), (
                    f"docs/conventions.md:{number}: {file} defines no {node}"
                )


def test_each_convention_is_stated_once() -> None:
    conventions = [convention for _, convention, _ in _convention_rows()]
    assert len(conventions) == len(set(conventions))


def test_the_link_checker_finds_a_missing_node() -> None:
    here = Path(__file__)
    assert "test_the_link_checker_finds_a_missing_node" in _defined_tests(here)
    assert "test_no_such_node" not in _defined_tests(here)
    assert _LINK.findall("`tests/unit/x.py::test_y` (why), `tests/a.py`") == [
        ("tests/unit/x.py", "test_y"),
        ("tests/a.py", ""),
    ]
