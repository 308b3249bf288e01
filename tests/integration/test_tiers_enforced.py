"""The tier rules hold in a real pytest run: a child pytest with the tiers plugin collects a
planted tree of tests. A test with no tier stops the collection; a unit test that starts a
process, touches a socket or sleeps fails, even when its code swallows the exception; the
cluster tier runs first; each tier's time is printed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def plant(root: Path, files: dict[str, str]) -> None:
    (root / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    unit\n    integration\n    cluster\n"
    )
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))


def child_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.tiers", "-p", "no:cacheprovider",
         "-p", "no:randomly", "--rootdir", str(root), "-c", str(root / "pytest.ini"),
         "--import-mode=importlib", "-rA", *args, str(root / "tests")],
        cwd=root, env={**_env(), "PYTHONPATH": str(REPO), "COLUMNS": "1000"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_a_test_outside_every_tier_stops_the_collection(tmp_path: Path) -> None:
    plant(
        tmp_path,
        {
            "tests/unit/test_fine.py": "def test_fine():\n    pass\n",
            "tests/elsewhere/test_stray.py": "def test_stray():\n    pass\n",
            "tests/integration/test_marked.py": """
                import pytest
                pytestmark = pytest.mark.unit
                def test_wrong_tier():
                    pass
            """,
        },
    )
    res = child_pytest(tmp_path)
    assert res.returncode == 4, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "tests/elsewhere/test_stray.py: no tier" in out
    assert "marked unit but lives in the integration tier" in out
    assert "1 passed" not in out  # nothing ran


UNIT_BREAKERS = """
    import socket
    import subprocess
    import time

    import pytest

    def test_starts_a_process():
        subprocess.run(["true"], check=True)

    def test_swallows_the_refusal():
        try:
            subprocess.run(["true"], check=True)
        except Exception:
            pass

    def test_opens_a_socket():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))

    def test_sleeps():
        time.sleep(0.01)

    def test_forks():
        import os
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    @pytest.fixture
    def spawning():
        subprocess.run(["true"], check=True)

    def test_with_a_spawning_fixture(spawning):
        pass

    def test_in_process():
        assert sum(range(10)) == 45
"""


def test_a_unit_test_that_leaves_the_process_fails_and_an_integration_test_may(
    tmp_path: Path,
) -> None:
    plant(
        tmp_path,
        {
            "tests/unit/test_breakers.py": UNIT_BREAKERS,
            "tests/integration/test_allowed.py": UNIT_BREAKERS.replace(
                "def test_", "def test_integration_"
            ),
        },
    )
    res = child_pytest(tmp_path)
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    for name, what in [
        ("test_starts_a_process", "start a process (['true']"),
        ("test_swallows_the_refusal", "start a process"),
        ("test_opens_a_socket", "use a socket"),
        ("test_sleeps", "sleep"),
        ("test_forks", "start a process"),
    ]:
        assert f"FAILED tests/unit/test_breakers.py::{name} - unit tier broken in call" in out
        assert what in out
    assert "ERROR tests/unit/test_breakers.py::test_with_a_spawning_fixture" in out
    assert "PASSED tests/unit/test_breakers.py::test_in_process" in out
    assert "test_integration_" in out and "FAILED tests/integration" not in out
    assert "ERROR tests/integration" not in out
    assert "8 passed" in out  # the integration copies and the in-process unit test
    assert "time per tier" in out
    assert (
        "unit" in out.split("time per tier")[1] and "integration" in out.split("time per tier")[1]
    )


def test_the_cluster_tier_is_scheduled_first_whatever_the_file_names(tmp_path: Path) -> None:
    plant(
        tmp_path,
        {
            "tests/integration/test_aaa.py": "def test_a():\n    pass\n",
            "tests/integration/test_cluster_skypilot.py": "def test_c():\n    pass\n",
            "tests/unit/test_b.py": "def test_b():\n    pass\n",
        },
    )
    res = child_pytest(tmp_path, "--collect-only", "-q")
    assert res.returncode == 0, res.stdout + res.stderr
    order = [line for line in res.stdout.splitlines() if "::" in line]
    assert order[0] == "tests/integration/test_cluster_skypilot.py::test_c", order
    assert len(order) == 3
    selected = child_pytest(tmp_path, "--collect-only", "-q", "-m", "unit")
    assert [line for line in selected.stdout.splitlines() if "::" in line] == [
        "tests/unit/test_b.py::test_b"
    ]
