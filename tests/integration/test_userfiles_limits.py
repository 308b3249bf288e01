"""Every file flag, in a CLI process with a memory limit: what is not a small regular file
(a device, a FIFO, a folder, a huge sparse file) is refused before it is read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import limited

pytestmark = pytest.mark.integration


TINY = "examples/tiny-local.yaml"


PHYSAI = "examples/physical-ai.yaml"


WF = ("workbench", "workflow")


MEMORY_LIMIT = 700 << 20  # far below what reading /dev/zero or 1 GiB would need


@pytest.fixture
def bad_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    sparse = tmp_path / "huge.yaml"
    with sparse.open("wb") as fh:
        fh.truncate(1 << 30)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    return {
        "device": (Path("/dev/zero"), "a character device"),
        "fifo": (fifo, "a FIFO"),
        "directory": (folder, "a directory"),
        "huge": (sparse, "1073741824 bytes"),
    }


def run_limited(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        limited([sys.executable, "-m", "npa", *args], RLIMIT_AS=MEMORY_LIMIT),
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,  # a FIFO that blocked the open would hang here
        check=False,
    )


def commands(bad: Path, tmp_path: Path) -> dict[str, tuple[str, ...]]:
    return {
        "validate-spec": (*WF, "validate-spec", str(bad)),
        "plan-spec spec": (*WF, "plan-spec", str(bad), "--run-id", "r1", "--skip-quota"),
        "plan-spec --quota-file": (*WF, "plan-spec", PHYSAI, "--run-id", "r1",
                                   "--quota-file", str(bad)),
        "plan-spec --existing": (*WF, "plan-spec", PHYSAI, "--run-id", "r1", "--quota-file",
                                 "examples/quota-ample.yaml", "--existing", str(bad)),
        "render --digests": (*WF, "render", PHYSAI, "--run-id", "r1", "--out",
                             str(tmp_path / "out"), "--digests", str(bad)),
        "prepare-run": (*WF, "prepare-run", str(bad), "--project", "demo"),
        "preflight-images --registry-auth": (*WF, "preflight-images", TINY,
                                             "--registry-auth", str(bad)),
        "provision --kubeconfig": ("provision-if-absent", "--target", "kubernetes",
                                   "--context", "c1", "--kubeconfig", str(bad), "--preview"),
        "gpus --spec": (*WF, "gpus", "--cluster", "c1", "--spec", str(bad)),
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "huge"])
def test_every_file_flag_refuses_what_is_not_a_small_regular_file(
    kind: str, bad_paths: dict[str, tuple[Path, str]], tmp_path: Path, npa_home: Path
) -> None:
    bad, said = bad_paths[kind]
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    for name, argv in commands(bad, tmp_path).items():
        proc = run_limited(*argv, env=env)
        where = f"{name} with {kind}: {proc.stderr[-600:]}"
        assert proc.returncode == 2, where
        assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, where
        assert str(bad) in proc.stderr and said in proc.stderr, where
