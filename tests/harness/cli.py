"""Run the npa CLI: ``run_npa`` the way a user does (a separate process, real argv, real exit
code), ``invoke_npa`` in this process (the same parsing, service, output and exit code, for the
unit tier, which may start no process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


# The least time a CLI call is given before the test calls it hung (seconds).
HANG_BOUND = 600.0


def run_npa(
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = HANG_BOUND,
    cwd: str | None = None,
    module: str = "npa",
    open_files: int | None = None,
) -> CliResult:
    """``python -m npa ARGS`` with the current environment plus ``env``; ``module`` runs
    another entry point of the same CLI (one that composes it with a test double);
    ``open_files`` caps the descriptors the process may hold (``ulimit -n``, soft and hard).

    ``timeout`` bounds a hang, never a speed: a command that answers in seconds idle took over
    120 s on two cores kept busy by a CI run, and one that takes a minute idle (a pulumi up)
    took over 240 s. So a shorter ``timeout`` is raised to ``HANG_BOUND``."""
    timeout = max(timeout, HANG_BOUND)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    limits = {} if open_files is None else {"RLIMIT_NOFILE": open_files}
    proc = subprocess.run(
        limited([sys.executable, "-m", module, *args], **limits),
        capture_output=True,
        text=True,
        env=full_env,
        input=input,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


# Sets each limit (soft and hard), then execs the command. The limits are set by a process of
# their own, never in a preexec_fn: Python code between fork and exec runs in a copy of the test
# worker, and a worker that loaded gRPC in an earlier test (the Nebius SDK, Pulumi) has gRPC's
# fork handlers abort that copy (CI of 2026-12-05: SIGABRT, "epoll_wait error: Bad file
# descriptor", under the address-space limit of test_userfiles_limits).
_LIMITED = (
    "import json, os, resource, sys\n"
    "for name, value in json.loads(sys.argv[1]).items():\n"
    "    resource.setrlimit(getattr(resource, name), (value, value))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def limited(argv: list[str], **limits: int) -> list[str]:
    """``argv`` run under the resource limits given by name (``RLIMIT_AS=...``); ``argv``
    itself when there are none. ``argv[0]`` is a path (no PATH search)."""
    if not limits:
        return argv
    return [sys.executable, "-c", _LIMITED, json.dumps(limits), *argv]


@contextmanager
def _working_dir(cwd: str | None) -> Iterator[None]:
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def invoke_npa(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    input: str | None = None,
    cwd: str | None = None,
) -> CliResult:
    """``npa ARGS`` in this process: typer's runner swaps stdin, stdout and stderr (kept apart)
    and the given environment variables (None removes one) for the call, and restores them
    after. An exception the CLI lets escape is raised here, as a traceback would end a real run
    with exit 1."""
    from typer.testing import CliRunner

    from npa.cli.main import app

    runner = CliRunner()
    with _working_dir(cwd):
        result = runner.invoke(
            app,
            list(args),
            env=dict(env or {}),
            input=input,
            prog_name="npa",
            catch_exceptions=False,
        )
    return CliResult(result.exit_code, result.stdout, result.stderr)


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
