"""The CLI entry point: version, command groups, and a start-up free of heavy imports."""

from __future__ import annotations

import re

import pytest

from npa import __version__
from tests.harness.cli import imported_packages, run_npa

pytestmark = pytest.mark.unit

HEAVY = (
    "sky", "pulumi", "boto3", "botocore", "obstore", "kubernetes", "pulumi_kubernetes",
    "pulumi_aws",
)  # fmt: skip


def test_version() -> None:
    res = run_npa("--version")
    assert res.code == 0
    assert res.stdout.strip() == f"npa {__version__}"


def test_help_lists_the_command_groups() -> None:
    res = run_npa("--help")
    assert res.code == 0
    for group in ("skypilot", "workbench"):
        assert re.search(rf"^\s+{group}\s", res.stdout, re.M), res.stdout
    wb = run_npa("workbench", "--help")
    assert "workflow" in wb.stdout and "insights" in wb.stdout


def test_unknown_command_is_a_usage_error() -> None:
    res = run_npa("no-such-command")
    assert res.code == 2
    assert "Traceback" not in res.stderr


def test_help_imports_no_heavy_library() -> None:
    imported = imported_packages("--help")
    assert "npa" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    # Command modules are all imported for --help; pydantic alone would cost ~0.1 s there.
    assert "pydantic" not in imported
