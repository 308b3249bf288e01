"""The import-graph check ``make lint`` runs: it passes on npa as it is, and fails on a planted
upward import, a planted package cycle and a service that imports a backend's own folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.import_graph import main, violations

pytestmark = pytest.mark.unit

NPA = Path(__file__).resolve().parents[2] / "npa"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the npa package to plant imports into."""
    copy = tmp_path / "npa"
    shutil.copytree(NPA, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def plant(tree: Path, module: str, line: str) -> None:
    path = tree / module
    path.write_text(path.read_text("utf-8") + f"\n{line}\n", "utf-8")


def test_npa_as_it_is_passes() -> None:
    assert violations(NPA) == []


def test_the_command_fails_on_a_planted_upward_import(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tree)]) == 0, capsys.readouterr().out
    plant(tree, "core/paths.py", "from npa.services.status import status  # noqa")
    assert main([str(tree)]) == 1
    assert "upward import: npa.core.paths imports npa.services.status" in capsys.readouterr().out


def test_an_adapter_importing_the_domain_is_upward_even_inside_a_function(tree: Path) -> None:
    plant(
        tree,
        "backends/local/executor.py",
        "def later() -> None:\n    from npa.runs.manifest import RunManifest  # noqa",
    )
    found = violations(tree)
    assert any(
        "upward import: npa.backends.local.executor imports npa.runs.manifest" in f for f in found
    ), found
    # runs imports the backend interface, so the planted import also closes a cycle.
    assert "package cycle: npa.backends <-> npa.runs" in found


def test_a_package_cycle_within_a_layer_is_found(tree: Path) -> None:
    # spec is below plan's users but plan imports spec: planting the reverse closes a cycle.
    plant(tree, "spec/model.py", "from npa.plan import dag  # noqa")
    found = violations(tree)
    assert any(f.startswith("package cycle:") and "npa.plan" in f for f in found), found


def test_a_service_importing_a_backend_folder_is_refused(tree: Path) -> None:
    plant(tree, "services/cancel.py", "from npa.backends.local.jobs import LocalJobTable  # noqa")
    (found,) = violations(tree)
    assert "npa.services.cancel imports a backend's folder" in found
