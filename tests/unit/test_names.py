"""The names check ``make lint`` runs: it passes on npa as it is, and fails on each kind of
planted mention of a backend or a target in the code of ``npa/services`` and ``npa/launch``: an
identifier, a string, an alias (``sky``, ``k8s/``), an import of a backend's adapter, the
ordinary word ``local`` as a name, and the name of a target folder the check has never seen.
Comments, docstrings and ``local`` in its other senses pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.names import main, violations

pytestmark = pytest.mark.unit

NPA = Path(__file__).resolve().parents[2] / "npa"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the npa package to plant code into."""
    copy = tmp_path / "npa"
    shutil.copytree(NPA, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def plant(tree: Path, module: str, code: str) -> None:
    path = tree / module
    path.write_text(path.read_text("utf-8") + f"\n\n{code}\n", "utf-8")


def test_npa_as_it_is_passes() -> None:
    assert violations(NPA) == []


def test_the_command_fails_on_a_planted_name(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tree)]) == 0, capsys.readouterr().out
    plant(
        tree, "services/status.py", 'def later(infra: str) -> bool:\n    return infra == "nebius"'
    )
    assert main([str(tree)]) == 1
    out = capsys.readouterr()
    assert "services/status.py:" in out.out and "names 'nebius': string 'nebius'" in out.out
    assert "1 line(s) of npa/services, npa/launch name a backend or a target" in out.err


@pytest.mark.parametrize(
    ("module", "code", "name", "what"),
    [
        # What plan.py's options were called before the quota API became a target capability.
        ("services/plan.py", "nebius_parent_id = None", "nebius", "identifier nebius_parent_id"),
        ("launch/watch.py", "class SkyPilotPoller: ...", "skypilot", "identifier SkyPilotPoller"),
        ("launch/watch.py", "def later(sky_ok: bool) -> None: ...", "skypilot",
         "identifier sky_ok"),
        # What images.py and release.py wrote before they asked for provision_command.
        ("services/images.py", 'FIX = "npa provision-if-absent --target kubernetes"',
         "kubernetes", "string 'npa provision-if-absent --target kubernetes'"),
        ("services/render.py", 'def later(c: str) -> str:\n    return f"k8s/{c}"',
         "kubernetes", "string 'k8s/'"),
        ("services/gpus.py", "def later() -> None:\n    from npa.adapters.skypilot import api",
         "skypilot", "identifier npa.adapters.skypilot"),
        # "local" as the name of the local backend or target.
        ("services/gates.py", 'STORE = "local"', "local", "string 'local'"),
        ("services/gates.py", 'FIX = " --target local --project "', "local",
         "string ' --target local --project '"),
        ("launch/transaction.py", 'ARGV = "--infra=local"', "local", "string '--infra=local'"),
    ],
)  # fmt: skip
def test_each_kind_of_mention_is_refused(
    tree: Path, module: str, code: str, name: str, what: str
) -> None:
    plant(tree, module, code)
    found = violations(tree)
    assert len(found) == 1, found
    assert f"{module}:" in found[0] and f"names {name!r}: {what}" in found[0], found


def test_prose_and_local_in_its_other_senses_pass(tree: Path) -> None:
    plant(
        tree,
        "launch/supervision.py",
        "def later(local_dir: str) -> str:\n"
        '    """SkyPilot retries a start by itself; Nebius and Kubernetes say why."""\n'
        "    # the kubernetes target and the skypilot backend, in a comment\n"
        '    return f"{local_dir}: the local store\'s disk, a local path, --local-quota"',
    )
    assert violations(tree) == []


def test_a_new_target_folder_is_a_name(tree: Path) -> None:
    # No list of names to keep in step: any package under npa/targets (or npa/backends) is one.
    plant(tree, "services/provision.py", 'KIND = "slurm"')
    assert violations(tree) == []
    (tree / "targets" / "slurm").mkdir()
    (tree / "targets" / "slurm" / "__init__.py").write_text('"""A target."""\n')
    (found,) = violations(tree)
    assert "services/provision.py:" in found and "names 'slurm': string 'slurm'" in found
