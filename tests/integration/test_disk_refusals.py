"""A disk that says no to a file the user named (render's --out): the error names that path
and its fix is a command that runs, on a real full tmpfs and a real read-only mount."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.harness.cli import run_npa
from tests.harness.disks import fill, read_only, tmpfs
from tests.unit.specdata import DIGEST_A, base_spec, dump

pytestmark = pytest.mark.integration


def fix_runs(fix: str) -> None:
    """The fix's command (before its comment and its rerun) exits 0 as it is written."""
    command = fix.split("  #", 1)[0].split(" && ", 1)[0]
    proc = subprocess.run(shlex.split(command), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (command, proc.stderr)


def render(tmp_path: Path, out: Path) -> dict[str, str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_spec()))
    digests = tmp_path / "digests"
    digests.write_text(f"cur: {DIGEST_A}\n")
    r = run_npa("workbench", "workflow", "render", str(spec), "--run-id", "r1", "--out",
                str(out), "--digests", str(digests), "--json")  # fmt: skip
    assert r.code == 4, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    error: dict[str, str] = r.json()["error"]
    return error


def test_render_out_on_a_full_disk_names_the_out_path_and_a_fix_that_runs(
    npa_home: Path, tmp_path: Path
) -> None:
    # The write's ENOSPC carries no file name: it printed "could not use ?" and "df -h ?".
    with tmpfs(tmp_path / "small", "1m") as disk:
        filler = fill(disk)
        out = disk / "render"
        error = render(tmp_path, out)
        assert "?" not in error["message"] + error["fix"], error
        assert str(out) in error["message"] and "No space left" in error["message"], error
        assert error["fix"].startswith(f"df -h {disk} && npa "), error
        fix_runs(error["fix"])
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no half-written render
        filler.unlink()
        rerun = shlex.split(error["fix"].split("  #", 1)[0].split(" && ", 1)[1])
        assert rerun[:3] == ["npa", "workbench", "workflow"], error
        assert run_npa(*rerun[1:]).code == 0


def test_render_out_on_a_read_only_disk_names_the_out_path_and_a_fix_that_runs(
    npa_home: Path, tmp_path: Path
) -> None:
    with read_only(tmp_path / "ro") as folder:
        out = folder / "render"
        error = render(tmp_path, out)
        assert str(out) in error["message"] and "Read-only" in error["message"], error
        assert error["fix"].startswith(f"findmnt -T {folder} && npa "), error
        fix_runs(error["fix"])
