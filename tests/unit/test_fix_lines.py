"""Every fix line npa can print carries real values: no placeholder a user must replace, no
path inside npa's repository. Checked over the source of every ``fix=`` npa passes (the class),
not a few examples: what a fix line's command part may contain is decided here once.

A fix line is ``COMMAND  # comment``; only the command part must be runnable as printed. The
one placeholder allowed is a secret npa never knows (``USER:PASSWORD``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

NPA = Path(__file__).resolve().parents[2] / "npa"
PLACEHOLDER_WORDS = (
    "P", "PROJECT", "CTX", "CONTEXT", "BUCKET", "PREFIX", "RUN", "RUN_ID", "SPEC", "DIR", "URI",
    "STORE", "NAME", "TOOL", "TOOL_REF", "TAG", "ALIAS", "HOST", "VAR", "RUN_PREFIX", "WORKFLOW",
    "PATH", "FILE", "ID", "STAGE", "PROFILE", "QUOTA_FILE", "PROJECT_ID",
)  # fmt: skip
PLACEHOLDER = re.compile(
    # a shell assignment (RUN_ID="$(...)") names a variable, it is no placeholder
    r"(?<![\w$-])(" + "|".join(PLACEHOLDER_WORDS) + r")(?![\w=-])"
    r"|<[A-Za-z][\w .-]*>"  # <spec.yaml>, <kube-context>
    r"|\.\.\.|…"  # an elided argument
    r"|(?:^|\s)(?:scripts|docs|examples)/"  # a path inside the repository
)
SECRETS = ("USER:PASSWORD",)


def _fix_expressions() -> list[tuple[str, ast.expr]]:
    found = []
    for path in sorted(NPA.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            where = f"{path.relative_to(NPA.parent)}:{getattr(node, 'lineno', 0)}"
            is_fix = isinstance(node, ast.keyword) and node.arg == "fix"
            assigns_fix = isinstance(node, ast.Assign) and any(
                (isinstance(t, ast.Name) and t.id in ("fix", "provision"))
                or (isinstance(t, ast.Attribute) and t.attr == "fix")  # result.fix = ...
                for t in node.targets
            )
            if is_fix or assigns_fix:
                found.append((where, node.value))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add"
                and len(node.args) >= 4
            ):
                found.append((where, node.args[3]))  # a submit gate: name, status, detail, fix
            elif isinstance(node, ast.Return) and node.value is not None:
                func = _enclosing_name(tree, node)
                if func is not None and ("fix" in func or func.endswith("_command")):
                    found.append((where, node.value))
    return found


def _enclosing_name(tree: ast.Module, target: ast.AST) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            child is target for child in ast.walk(node)
        ):
            return node.name
    return None


def _literal_text(expr: ast.expr) -> list[str]:
    """The literal parts of an expression, with each formatted value as one ``{}``."""
    parts: list[str] = []
    for node in ast.walk(expr):
        if isinstance(node, ast.JoinedStr):
            parts.append(
                "".join(
                    v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                    for v in node.values
                )
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
    return parts


def _command_part(text: str) -> str:
    command = text.split("  #", 1)[0]
    for secret in SECRETS:
        command = command.replace(secret, "")
    return command


FIXES = _fix_expressions()


def test_the_scan_sees_the_fix_lines() -> None:
    assert len(FIXES) > 100


@pytest.mark.parametrize(("where", "expr"), FIXES, ids=[w for w, _ in FIXES])
def test_no_fix_line_holds_a_placeholder_or_a_repository_path(where: str, expr: ast.expr) -> None:
    for text in _literal_text(expr):
        # Literal list items (argv for shlex.join) are checked one by one, as words.
        match = PLACEHOLDER.search(_command_part(text))
        assert match is None, f"{where}: {text!r} has {match.group(0)!r}" if match else ""
