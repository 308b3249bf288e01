"""The pod boot-time module in a real interpreter: psutil's process start stays put when the
kernel's boot time moves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


HARNESS = Path(__file__).resolve().parents[1] / "harness"


def test_psutil_create_time_stays_put_when_the_kernels_boot_time_moves(tmp_path: Path) -> None:
    """What SkyPilot's jobs controller compares: its recorded start and its start read later."""
    script = f"""
import sys
sys.path.insert(0, {str(HARNESS)!r})
import psutil, psutil._pslinux as linux
moves = iter([1000.0, 1001.0, 1002.0, 1003.0])
linux.boot_time = lambda: next(moves)
import pod_boot_time
pod_boot_time.install({str(tmp_path / "boot-time")!r})
pod_boot_time.install({str(tmp_path / "boot-time")!r})  # a second load changes nothing
me = psutil.Process()
recorded = me.create_time()
print(recorded == psutil.Process().create_time() == me.create_time(), psutil.boot_time())
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "1000.0"]
