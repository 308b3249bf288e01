"""npa's templates are package data of npa: found inside the package, and every file there is one
the wheel carries (pyproject.toml's package-data), so nothing renders from a checkout alone."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

import npa
from npa.core.templates import templates_dir

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_templates_are_inside_the_npa_package() -> None:
    assert templates_dir() == Path(npa.__file__).parent / "templates"
    names = {p.name for p in templates_dir().iterdir()}
    assert {"skypilot-task.yaml.j2", "skypilot-stage.sh", "run-report.html.j2"} <= names
    assert not (REPO / "templates").exists()  # no second copy to drift


def test_every_template_is_declared_package_data() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    setuptools = config["tool"]["setuptools"]
    globs = setuptools["package-data"]["npa"]
    assert "data-files" not in setuptools  # the templates go nowhere outside the package
    for path in sorted(templates_dir().iterdir()):
        relative = path.relative_to(Path(npa.__file__).parent).as_posix()
        assert any(fnmatch.fnmatch(relative, g) for g in globs), (
            f"{relative} is not in pyproject.toml's package-data: a wheel would not carry it"
        )
