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
