"""An installed wheel renders without the repository: the templates travel with it, as package
data of npa."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_installed_wheel_carries_the_template_and_renders(tmp_path: Path) -> None:
    # Built from a copy: an in-tree build would leave build/ behind and reuse a stale one.
    src = tmp_path / "src"
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for part in ("npa", "stacks"):
        shutil.copytree(REPO / part, src / part, ignore=junk)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(dist), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("npa-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    templates = sorted(p.name for p in (REPO / "npa" / "templates").iterdir())
    assert {"skypilot-task.yaml.j2", "skypilot-stage.sh", "run-report.html.j2"} <= set(templates)
    assert sorted(n for n in names if n.startswith("npa/templates/")) == [
        f"npa/templates/{t}" for t in templates
    ]
    assert not any(".data/" in n for n in names)  # nothing outside the package

    prefix = tmp_path / "prefix"
    # --ignore-installed: without it pip "upgrades" the venv's own npa, uninstalling it.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--ignore-installed", "--prefix", str(prefix), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (site,) = prefix.glob("lib/python3*/site-packages")
    # The installed copy comes first on the path; the checkout is neither on it nor the cwd.
    env = dict(os.environ, PYTHONPATH=str(site))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "rendered"
    proc = subprocess.run(
        [sys.executable, "-m", "npa", "workbench", "workflow", "render",
         str(REPO / "examples/physical-ai.yaml"), "--run-id", "wheel-1", "--out", str(out),
         "--digests", str(REPO / "examples/physical-ai.digests.yaml")],
        capture_output=True, text=True, env=env, cwd=elsewhere, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    probe = subprocess.run(
        [sys.executable, "-c",
         "import npa.backends.skypilot.tasks as t; print(t.__file__); print(t.templates_dir())"],
        capture_output=True, text=True, env=env, cwd=elsewhere, check=True,
    )  # fmt: skip
    module, templates = probe.stdout.split()
    assert Path(module).is_relative_to(site)
    assert Path(templates) == Path(module).parents[2] / "templates"
    # The report page renders from the installed template too.
    page = subprocess.run(
        [sys.executable, "-c",
         "from npa.core.templates import templates_dir as d; from npa.render import report as r; "
         "print(d()); print(len(r.render_report(r.RunReport(project='p', run_id='R', "
         "workflow=None, state='SUCCEEDED', trustworthy=True, final=True, reason='-', "
         "checked_at='-', built_at='-'))))"],
        capture_output=True, text=True, env=env, cwd=elsewhere, check=True,
    )  # fmt: skip
    found, size = page.stdout.split()
    assert Path(found) == site / "npa" / "templates" and int(size) > 1000
    rendered = sorted(p.name for p in out.iterdir())
    assert rendered == ["augment.yaml", "curate.yaml", "evaluate.yaml", "render.json"]
    # The environment running the tests still has its own npa (later tests start it).
    mine = subprocess.run(
        [sys.executable, "-c", "import npa; print(npa.__file__)"],
        capture_output=True, text=True, cwd=elsewhere, check=False,
    )  # fmt: skip
    assert mine.returncode == 0 and Path(mine.stdout.strip()).is_relative_to(REPO), mine.stderr
