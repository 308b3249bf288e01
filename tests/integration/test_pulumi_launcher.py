"""The plain ``pulumi`` CLI in this repository: the dynamic-provider launcher bootstrap-tools
installs finds the project's virtualenv the way the engine describes it (no PULUMI_PYTHON_CMD),
and the per-stack files ``pulumi stack select`` writes are not committed by accident."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "scripts" / "pulumi-plugins" / "pulumi-resource-pulumi-python"


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_PYTHON", "PULUMI_RUNTIME"))
    }
    return {**env, **extra}


def test_the_engine_given_virtualenv_runs_the_real_dynamic_provider() -> None:
    # The engine starts the plugin in the program's directory with Pulumi.yaml's runtime
    # options as PULUMI_RUNTIME_* variables: here virtualenv .venv, relative to the repository.
    venv = Path(sys.prefix)
    assert (venv / "bin" / "python").exists()
    workdir = venv.parent
    proc = subprocess.Popen(
        [str(LAUNCHER)],
        cwd=workdir,
        env=_env(PULUMI_RUNTIME_VIRTUALENV=venv.name),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # A provider plugin's handshake: the port of its gRPC server on the first line.
        first = proc.stdout.readline().strip()
        assert first.isdigit(), proc.stderr.read() if proc.stderr else first
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_without_a_virtualenv_the_launcher_uses_pulumi_python_cmd(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "ran $0 $*"\n')
    fake.chmod(0o755)
    out = subprocess.run(
        [str(LAUNCHER), "127.0.0.1:1"],
        cwd=tmp_path,
        env=_env(PULUMI_PYTHON_CMD=str(fake), PULUMI_RUNTIME_VIRTUALENV="no-such-venv"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"ran {fake} -u -m pulumi.dynamic 127.0.0.1:1"


def test_stack_settings_files_are_ignored_and_pulumi_yaml_is_not() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "Pulumi.demo.local.yaml", "Pulumi.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ignored.stdout.split() == ["Pulumi.demo.local.yaml"]
