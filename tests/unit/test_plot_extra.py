"""`insights compare --plot` without npa's `plot` extra: matplotlib cannot be imported, and the
command stops before any work with the pip command that installs the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from npa.core.errors import NotFound, ToolMissing
from npa.insights.plot import PLOT_EXTRA_FIX, durations_png, pyplot
from npa.services.insights import compare

pytestmark = pytest.mark.unit


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``None`` entry in sys.modules makes ``import`` raise ImportError, as if not installed."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def test_the_fix_installs_the_plot_extra() -> None:
    assert PLOT_EXTRA_FIX == "pip install 'npa[plot]'"


@pytest.mark.usefixtures("no_matplotlib")
def test_missing_matplotlib_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing) as caught:
        pyplot()
    assert "matplotlib" in str(caught.value) and "`plot` extra" in str(caught.value)
    assert caught.value.fix == "pip install 'npa[plot]'"
    with pytest.raises(ToolMissing):
        durations_png([], "a", "b", tmp_path / "d.png")
    assert not (tmp_path / "d.png").exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_compare_stops_before_reading_anything(tmp_path: Path) -> None:
    """The input does not exist: the missing extra is what is reported, and nothing is written."""
    absent = tmp_path / "absent.sqlite"
    with pytest.raises(ToolMissing) as caught:
        compare(absent, "r1", "r2", plot=tmp_path / "d.png", html=tmp_path / "p.html")
    assert caught.value.fix == "pip install 'npa[plot]'"
    assert sorted(tmp_path.iterdir()) == []


def test_compare_without_plot_needs_no_matplotlib(no_matplotlib: None, tmp_path: Path) -> None:
    """Only --plot needs the extra: without it, compare goes on to read its input."""
    with pytest.raises(NotFound, match="no insights store"):
        compare(tmp_path / "absent.sqlite", "r1", "r2")
