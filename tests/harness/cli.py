"""Run the npa CLI the way a user does: a separate process, real argv, real exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_npa(
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 120,
    cwd: str | None = None,
    module: str = "npa",
) -> CliResult:
    """``python -m npa ARGS`` with the current environment plus ``env``; ``module`` runs
    another entry point of the same CLI (one that composes it with a test double)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=full_env,
        input=input,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def imported_packages(*args: str) -> set[str]:
    """Top-level packages ``python -X importtime -m npa ARGS`` imported (e.g. {"npa", "typer"})."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "npa", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        line.split("|")[-1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
