"""The plan-spec evidence property: the bulk in process (typer's runner), a sample through the
console script. Both are integration tests: a proof's stack state on a file:// backend is read
as a file, but the mutated evidence names other backends too, and reading those starts the
pulumi CLI (pulumi stack export). The proof rule itself, over claims and states given as data,
is tests/unit/test_proof_property.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from npa.cli.main import app
from tests.harness.cli import run_npa
from tests.tiers import examples
from tests.unit.test_gates_property import RUNNER, expect, inputs, write_inputs

pytestmark = pytest.mark.integration


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=inputs)
def test_the_same_holds_for_the_console_script(
    case: tuple[dict[str, Any], Any, Any], npa_home: Path
) -> None:
    spec, quota, existing = case
    with tempfile.TemporaryDirectory() as tmp:
        res = run_npa(*write_inputs(Path(tmp), spec, quota, existing))
    assert "Traceback" not in res.stderr, res.stderr
    expect(spec, quota, existing, res.code, res.stdout)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # npa_home: one empty NPA_HOME, only read
    ],
)
@given(case=inputs)
def test_plan_spec_never_says_ok_on_evidence_that_is_not_evidence(
    case: tuple[dict[str, Any], Any, Any], npa_home: Path
) -> None:
    spec, quota, existing = case
    with tempfile.TemporaryDirectory() as tmp:
        args = write_inputs(Path(tmp), spec, quota, existing)
        result = RUNNER.invoke(app, args)
    # Only the clean exits of finish(): anything else is an exception that escaped.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception,
        result.output[-800:],
    )
    expect(spec, quota, existing, result.exit_code, result.output)
