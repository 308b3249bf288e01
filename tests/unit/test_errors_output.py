"""Errors print cleanly (text or a JSON object) and results render from one model."""

from __future__ import annotations

import io
import json

import pytest
import typer
from typer.testing import CliRunner

from npa.cli.common import JsonFlag, finish
from npa.core.emit import emit, emit_error
from npa.core.errors import (
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    InvalidInput,
    NotFound,
    NpaError,
    Unavailable,
)
from npa.core.output import Result

pytestmark = pytest.mark.unit


class Sample(Result):
    run_id: str
    stages: list[str]
    ok: bool

    def text_lines(self) -> list[str]:
        return [f"run {self.run_id}: {len(self.stages)} stages", *self.stages]

    def exit_code(self) -> int:
        return 0 if self.ok else 1


def test_error_carries_message_exit_code_and_fix() -> None:
    err = InvalidInput("spec has 2 errors", fix="npa workbench workflow validate-spec s.yaml")
    assert err.exit_code == EXIT_INVALID
    assert err.to_dict() == {
        "error": {
            "kind": "invalid_input",
            "message": "spec has 2 errors",
            "exit_code": 2,
            "fix": "npa workbench workflow validate-spec s.yaml",
        }
    }
    assert NotFound("x").exit_code == EXIT_NOT_FOUND
    assert Unavailable("x").exit_code == EXIT_UNAVAILABLE
    assert isinstance(Unavailable("x"), NpaError)


def test_json_is_the_model_dump_and_text_comes_from_the_same_model() -> None:
    result = Sample(run_id="r1", stages=["curate", "augment"], ok=False)
    out = io.StringIO()
    assert emit(result, as_json=True, stream=out) == 1
    assert json.loads(out.getvalue()) == result.model_dump(mode="json")
    out = io.StringIO()
    emit(result, as_json=False, stream=out)
    assert out.getvalue().splitlines() == ["run r1: 2 stages", "curate", "augment"]


def test_default_text_view_lists_fields() -> None:
    class Plain(Result):
        name: str
        count: int

    out = io.StringIO()
    emit(Plain(name="x", count=3), as_json=False, stream=out)
    assert out.getvalue() == "name: x\ncount: 3\n"


def test_emit_error_text_has_message_and_fix() -> None:
    out = io.StringIO()
    code = emit_error(
        NotFound("run r9 not found", fix="npa workbench workflow list"), as_json=False, stream=out
    )
    assert code == EXIT_NOT_FOUND
    assert out.getvalue() == "error: run r9 not found\n  fix: npa workbench workflow list\n"


def _app(raise_error: bool) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def go(as_json: JsonFlag = False) -> None:
        def produce() -> Result:
            if raise_error:
                raise Unavailable("S3 did not answer", fix="npa configure --show")
            return Sample(run_id="r1", stages=[], ok=True)

        finish(as_json, produce)

    return app


def test_cli_prints_npa_errors_without_traceback() -> None:
    runner = CliRunner()
    res = runner.invoke(_app(True), [])
    assert res.exit_code == EXIT_UNAVAILABLE
    assert "Traceback" not in res.output
    assert "error: S3 did not answer" in res.output
    res = runner.invoke(_app(True), ["--json"])
    assert res.exit_code == EXIT_UNAVAILABLE
    assert json.loads(res.stdout)["error"]["kind"] == "unavailable"


def test_cli_success_exit_zero() -> None:
    res = CliRunner().invoke(_app(False), ["--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["run_id"] == "r1"
