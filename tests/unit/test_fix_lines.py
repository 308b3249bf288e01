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
                or (isinstance(t, ast.Name) and t.id.endswith("_FIX"))  # RUNC_FIX = ...
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
                # (a *prefix* or *suffix* function builds a store key, not a fix line)
                if func is not None and (
                    "fix" in func.replace("prefix", "").replace("suffix", "")
                    or func.endswith("_command")
                ):
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


# The programs a fix line may start with: npa, the tools npa drives, and the few shell commands
# that show or repair what an error names. A fix that names only flags (``--runtime auto``) is
# completed into the failed command by the CLI (npa.cli.common._complete_fix).
PROGRAMS = frozenset({
    "npa", "kubectl", "aws", "docker", "podman", "pulumi", "sky", "nebius", "curl", "ls", "df",
    "cat", "mv", "findmnt", "flock", "iconv", "kill", "printf", "python3", "pip", "read",
    "export", "ulimit", "sudo", "apt-get", "${EDITOR:-vi}",
})  # fmt: skip
# Words of a sentence, not of a command: "X, or Y", "(or ...)", "then rerun", "e.g.".
PROSE = re.compile(r",\s+or\b|\s\(or\b|\bthen rerun\b|\bthen:|\be\.g\.")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SUBSTITUTION = re.compile(r"^[A-Za-z_]\w*=\"?\$\(")  # RUN_ID="$(npa ...)": npa runs


def _whole_strings(expr: ast.expr) -> list[str]:
    """The texts ``expr`` can be as a whole (each formatted value as ``{}``): a string, an
    f-string, a concatenation that starts with one, either branch of ``a or b`` and ``x if c
    else y``. A builder's call is checked where it is defined."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in expr.values)]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        right = _whole_strings(expr.right)
        lefts = _whole_strings(expr.left) or ["{}"]  # a built command, then literal text
        return [left + (right[0] if right else "{}") for left in lefts]
    if isinstance(expr, ast.BoolOp):
        return [text for value in expr.values for text in _whole_strings(value)]
    if isinstance(expr, ast.IfExp):
        return _whole_strings(expr.body) + _whole_strings(expr.orelse)
    return []


def _joiners(expr: ast.expr) -> list[str]:
    """The separators of every ``"SEP".join(...)`` in ``expr``: fixes joined into one line."""
    return [
        node.func.value.value
        for node in ast.walk(expr)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ]


def prose_problem(text: str) -> str | None:
    """Why ``text`` (a fix line, ``{}`` standing for a value) is no command a user can paste,
    or None."""
    command = _command_part(text).strip()
    if not command or command.startswith("--"):
        return None
    if PROSE.search(command):
        return f"prose in the command part: {command!r}"
    words = _SUBSTITUTION.sub("", command).split()
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    if not words or words[0].startswith("{}"):
        return None  # the program is a value (an engine's binary, a built command)
    if words[0] not in PROGRAMS:
        return f"starts with {words[0]!r}, which is no program: {command!r}"
    return None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("remove the stage's secrets, or run it here: --infra local", "prose"),
        ("reinstall npa, or point NPA_TEMPLATES_DIR at its templates/ folder", "prose"),
        ("pass only one of them", "no program"),
        ("edit {}", "no program"),
        ("{}; {}; then: {}", "prose"),
        ("printf 'x' > f  (or add those lines to the file CONTAINERS_CONF names)", "prose"),
    ],
)
def test_the_prose_check_finds_sentences(text: str, expected: str) -> None:
    assert expected in (prose_problem(text) or "")


@pytest.mark.parametrize(
    "text",
    [
        "npa workbench workflow status {} --project {}",
        "KUBECONFIG={} kubectl config get-contexts -o name",
        'RUN_ID="$({})"  # a new run, or the same one',
        "--infra {} --runtime auto",
        "${EDITOR:-vi} {}  # role: gpu, or remove the claim",
        "{} info",
    ],
)
def test_the_prose_check_passes_commands(text: str) -> None:
    assert prose_problem(text) is None


@pytest.mark.parametrize(("where", "expr"), FIXES, ids=[w for w, _ in FIXES])
def test_every_fix_line_is_a_command_not_prose(where: str, expr: ast.expr) -> None:
    """A fix line is one command (issue 29): never a sentence, never "X, or Y". When no command
    can express the remedy, the error has no fix and its message explains."""
    for text in _whole_strings(expr):
        problem = prose_problem(text)
        assert problem is None, f"{where}: {problem}"
    for sep in _joiners(expr):
        assert sep.strip() in ("", "&&", ";", ","), f"{where}: fixes joined by {sep!r}"
