"""The complexity bound make lint checks (tests/complexity.py) fails on a function over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import complexity

pytestmark = pytest.mark.unit


def _module(root: Path, rel: str, branches: int) -> None:
    body = "".join(f"    if x == {i} and y:\n        return {i}\n" for i in range(branches))
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"def f(x, y):\n{body}    return -1\n")


def test_a_function_over_the_bound_fails_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each branch counts twice for radon (the if and its `and`): 11 branches are 23.
    _module(tmp_path, "npa/services/busy.py", 11)
    _module(tmp_path, "npa/core/calm.py", 3)
    assert complexity.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "npa/services/busy.py: f (line 1) has complexity 23" in out
    assert "calm" not in out.splitlines()[0]


def test_exempt_files_and_functions_within_the_bound_pass(tmp_path: Path) -> None:
    _module(tmp_path, "npa/spec/validate.py", 11)
    _module(tmp_path, "npa/core/calm.py", 9)  # 19
    assert complexity.main([str(tmp_path)]) == 0


def test_the_project_itself_is_within_the_bound() -> None:
    assert complexity.main([]) == 0


def _branches(n: int, indent: str) -> str:
    return "".join(f"{indent}if x == {i} and y:\n{indent}    return {i}\n" for i in range(n))


def test_a_nested_function_over_the_bound_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 12 branches of two decisions each and the function itself: 25. radon's own listing
    # reports it only as a closure of `outer`, whose complexity does not include it.
    path = tmp_path / "npa/services/nested.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        "class Holder:\n"
        "    def outer(self):\n"
        "        def inner(x, y):\n"
        f"{_branches(12, '            ')}"
        "            return -1\n"
        "        return inner\n"
    )
    assert complexity.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "npa/services/nested.py: Holder.outer.inner (line 3) has complexity 25" in out


def test_the_stack_programs_are_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _module(tmp_path, "stacks/busy.py", 11)
    (tmp_path / "npa").mkdir()
    assert complexity.main([str(tmp_path)]) == 1
    assert "stacks/busy.py: f (line 1) has complexity 23" in capsys.readouterr().out
