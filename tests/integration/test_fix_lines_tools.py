"""The missing-tools fix line is an absolute command that runs from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_the_tools_fix_is_an_absolute_command_that_runs_from_anywhere(tmp_path: Path) -> None:
    import shlex
    import subprocess

    from npa.core.commands import bootstrap_tools_command

    [script] = shlex.split(bootstrap_tools_command())
    assert Path(script).is_absolute() and Path(script).is_file()
    # From another directory, as a user pastes it: it answers (--plan changes nothing).
    plan = subprocess.run(
        [script, "--plan", "--only", "pulumi"], cwd=tmp_path, capture_output=True, text=True
    )
    assert plan.returncode == 0, plan.stderr
    assert "pulumi" in plan.stdout + plan.stderr
