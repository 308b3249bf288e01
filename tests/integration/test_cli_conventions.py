"""The command line as a shell user meets it: -h on every command, completion through bash
itself, and a did-you-mean from the real choices for a mistyped name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa

pytestmark = pytest.mark.integration

EKS = "arn:aws:eks:us-east-1:123456789012:cluster/gpu-prod"


def _command_paths() -> list[list[str]]:
    import typer

    from npa.cli.main import app

    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_every_command_takes_dash_h() -> None:
    paths = _command_paths()
    assert len(paths) > 20
    for path in paths:
        out = run_npa(*path, "-h")
        assert out.code == 0, (path, out.stderr)
        assert out.stdout.startswith("Usage: npa"), (path, out.stdout[:200])
        assert "-h, --help" in out.stdout


def _complete(words: list[str], env: dict[str, str]) -> list[str]:
    """What bash completes for ``words`` (the last one being typed), through the script
    ``npa --show-completion bash`` prints."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    npa_dir = Path(sys.executable).parent
    script = (
        'eval "$(npa --show-completion bash)"\n'
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        "_npa_completion npa\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run(
        [bash, "--norc", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PATH": f"{npa_dir}{os.pathsep}{os.environ['PATH']}"},
        check=True,
    )
    return [line for line in proc.stdout.splitlines() if line]


def test_bash_completes_commands_flags_and_real_values(npa_home: Path, tmp_path: Path) -> None:
    assert run_npa("configure", "--project", "robotics", "--store", "local").code == 0
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: kind-npa, context: {cluster: c}},"
        " {name: gke_p_z_gpu, context: {cluster: c}}]\n"
    )
    env = {"KUBECONFIG": str(kubeconfig)}
    assert _complete(["npa", "workbench", "workflow", "li"], env) == ["list"]
    assert _complete(["npa", "provision-if-absent", "--ta"], env) == ["--target"]
    assert _complete(["npa", "provision-if-absent", "--target", "kub"], env) == ["kubernetes"]
    assert _complete(["npa", "workbench", "workflow", "list", "--project", "ro"], env) == [
        "robotics"
    ]
    assert _complete(["npa", "skypilot", "verify", "--cluster", "g"], env) == ["gke_p_z_gpu"]
    assert _complete(["npa", "workbench", "workflow", "submit", "x", "--infra", "k8s/k"], env) == [
        "k8s/kind-npa"
    ]


def test_mistyped_names_get_a_did_you_mean_from_the_real_choices(npa_home: Path) -> None:
    target = run_npa("provision-if-absent", "--project", "p", "--target", "kubrnetes")
    assert target.code == 2
    assert "did you mean 'kubernetes'?" in target.stderr
    assert "fix: npa provision-if-absent --project p --target kubernetes" in target.stderr

    assert run_npa("configure", "--project", "robotics").code == 0
    typo = run_npa("workbench", "workflow", "list", "--project", "robotcs", "--json")
    assert typo.code == 3, typo.stdout
    error = typo.json()["error"]
    assert "did you mean 'robotics'?" in error["message"]
    assert error["fix"] == "npa workbench workflow list --project robotics"
    known = run_npa("workbench", "workflow", "list", "--project", "robotics")
    assert known.code == 0 and known.stdout.startswith("0 runs of project robotics")


def test_teardown_names_the_contexts_npa_placed_by_their_real_names(npa_home: Path) -> None:
    from npa.core.paths import NpaPaths

    placed = NpaPaths(npa_home).cluster_kubeconfig(EKS)
    placed.parent.mkdir(parents=True)
    placed.write_text("apiVersion: v1\nkind: Config\n")
    out = run_npa("teardown", "--project", "p", "--target", "kubernetes", "--json")
    assert out.code == 2
    error = out.json()["error"]
    assert EKS in error["message"]
    assert error["fix"] == f"npa teardown --project p --target kubernetes --context {EKS}"
