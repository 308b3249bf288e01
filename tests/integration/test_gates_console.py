"""The plan-spec evidence property through the console script: a sample of the generated
inputs in a real process (the bulk runs in process, in the unit tier)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.harness.cli import run_npa
from tests.unit.test_gates_property import expect, inputs, write_inputs

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
