"""The CLI as a user starts it: a real process (`python -m npa`), its exit code, and a start-up
that imports no heavy library. Everything else about the commands runs in process, in the
unit tier."""

from __future__ import annotations

import pytest

from npa import __version__
from tests.harness.cli import imported_packages, run_npa

pytestmark = pytest.mark.integration


HEAVY = (
    "sky", "pulumi", "boto3", "botocore", "obstore", "kubernetes", "pulumi_kubernetes",
    "pulumi_aws",
)  # fmt: skip


def test_help_imports_no_heavy_library() -> None:
    imported = imported_packages("--help")
    assert "npa" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    # Command modules are all imported for --help; pydantic alone would cost ~0.1 s there.
    assert "pydantic" not in imported


WF = ("workbench", "workflow")
PHYSAI = "examples/physical-ai.yaml"


def test_spec_commands_import_no_heavy_library() -> None:
    heavy = {"sky", "pulumi", "boto3", "botocore", "kubernetes", "nebius", "grpc", "jinja2"}
    for args in (["--help"], [*WF, "validate-spec", PHYSAI]):
        imported = imported_packages(*args)
        assert not imported & heavy, (args, imported & heavy)


def test_the_console_script_runs_as_a_process() -> None:
    res = run_npa("--version")
    assert res.code == 0
    assert res.stdout.strip() == f"npa {__version__}"
    res = run_npa("no-such-command")
    assert res.code == 2 and "Traceback" not in res.stderr
