"""The import-graph check ``make lint`` runs: it passes on npa as it is, and fails on each kind of
planted violation: an upward import (also one named in a string to ``importlib``, and one made by
a stack program), a domain package importing one the documented order does not allow it, a
package cycle, and a service or ``render`` importing a backend's own folder (in each spelling of
the import, and a backend folder the check has never seen)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.import_graph import main, violations

pytestmark = pytest.mark.unit

NPA = Path(__file__).resolve().parents[2] / "npa"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the npa package, and of the stack programs beside it, to plant imports into."""
    copy = tmp_path / "npa"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(NPA, copy, ignore=ignore)
    shutil.copytree(NPA.parent / "stacks", tmp_path / "stacks", ignore=ignore)
    return copy


def plant(tree: Path, module: str, line: str) -> None:
    """Append ``line`` to ``module`` (relative to the npa folder; ``../stacks/...`` for a stack
    program)."""
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


@pytest.mark.parametrize(
    "line",
    [
        # What npa.render.tasks did before render reached the encoder through the registry.
        "import npa.backends.skypilot.tasks as skypilot_tasks",
        "from npa.backends.skypilot import tasks",
        "from npa.backends import skypilot",
        "from ..backends.local import backend",
    ],
)
def test_render_importing_a_backend_folder_is_refused(tree: Path, line: str) -> None:
    plant(tree, "render/tasks.py", f"def later() -> None:\n    {line}  # noqa")
    found = violations(tree)
    assert len(found) == 1, found
    assert "npa.render.tasks imports a backend's folder (npa.backends." in found[0]


def test_a_new_backend_folder_is_a_backend_folder(tree: Path) -> None:
    # No list of backend names to keep in step: any package under npa/backends is one.
    (tree / "backends" / "slurm").mkdir()
    (tree / "backends" / "slurm" / "__init__.py").write_text('"""A backend."""\n')
    (tree / "backends" / "slurm" / "tasks.py").write_text("ENCODE = None\n")
    assert violations(tree) == []
    plant(tree, "render/report.py", "from npa.backends.slurm.tasks import ENCODE  # noqa")
    (found,) = violations(tree)
    assert "npa.render.report imports a backend's folder (npa.backends.slurm.tasks)" in found


@pytest.mark.parametrize(
    ("module", "line", "source", "target"),
    [
        ("images/probe.py", "from npa.launch import transaction", "npa.images", "npa.launch"),
        ("plan/dag.py", "from npa.images import reference", "npa.plan", "npa.images"),
        ("insights/scan.py", "from npa.launch import watch", "npa.insights", "npa.launch"),
        ("render/report.py", "from npa.launch import progress", "npa.render", "npa.launch"),
    ],
)
def test_a_domain_import_the_documented_order_does_not_allow_is_refused(
    tree: Path, module: str, line: str, source: str, target: str
) -> None:
    # None of these closes a cycle: the domain order itself refuses them.
    plant(tree, module, f"def later() -> None:\n    {line}  # noqa")
    found = violations(tree)
    assert len(found) == 1, found
    assert f"domain order: {source} may import" in found[0]
    assert f"not {target} (" in found[0]


def test_an_upward_import_named_in_a_string_is_found(tree: Path) -> None:
    plant(
        tree,
        "core/paths.py",
        "def later() -> None:\n"
        "    import importlib\n\n"
        '    importlib.import_module("npa.services.status")  # noqa',
    )
    found = violations(tree)
    assert any("upward import: npa.core.paths imports npa.services.status" in f for f in found), (
        found
    )


def test_an_f_string_module_name_counts_by_its_constant_head(tree: Path) -> None:
    plant(
        tree,
        "core/text.py",
        "def later(verb: str) -> None:\n"
        "    from importlib import import_module\n\n"
        '    import_module(f"npa.services.{verb}")  # noqa',
    )
    found = violations(tree)
    assert any("upward import: npa.core.text imports npa.services" in f for f in found), found


def test_the_stack_programs_are_read(tree: Path) -> None:
    plant(tree, "../stacks/local.py", "from npa.services.status import status  # noqa")
    found = violations(tree)
    assert any("upward import: stacks.local imports npa.services.status" in f for f in found), found


def test_a_stack_program_importing_the_infra_runner_closes_a_cycle(tree: Path) -> None:
    # The runner runs the stack programs (stacks.PROGRAMS); a program importing it back loops.
    plant(tree, "../stacks/localfs.py", "from npa.adapters.infra import runner  # noqa")
    assert "package cycle: npa.adapters.infra <-> stacks" in violations(tree)
