"""The CLI entry point: version, command groups, and a start-up free of heavy imports."""

from __future__ import annotations

import re

import pytest

from npa import __version__
from tests.harness.cli import invoke_npa

pytestmark = pytest.mark.unit


def test_version() -> None:
    res = invoke_npa("--version")
    assert res.code == 0
    assert res.stdout.strip() == f"npa {__version__}"


def test_help_lists_the_command_groups() -> None:
    res = invoke_npa("--help")
    assert res.code == 0
    for group in ("skypilot", "workbench"):
        assert re.search(rf"^\s+{group}\s", res.stdout, re.M), res.stdout
    wb = invoke_npa("workbench", "--help")
    assert "workflow" in wb.stdout and "insights" in wb.stdout


def test_unknown_command_is_a_usage_error() -> None:
    res = invoke_npa("no-such-command")
    assert res.code == 2
    assert "Traceback" not in res.stderr
