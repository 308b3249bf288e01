"""The test image's pod-wide boot time: a process's create time no longer moves with the clock."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.harness.pod_boot_time import stable


def test_every_reader_of_a_pod_keeps_the_first_boot_time_it_recorded(tmp_path: Path) -> None:
    path = str(tmp_path / "boot-time")
    kernel = iter([1000.0, 1001.0, 1001.0, 1002.0])  # the clock moves between the readers
    first, later = stable(lambda: next(kernel), path), stable(lambda: next(kernel), path)
    assert first() == 1000.0
    assert later() == 1000.0 and first() == 1000.0  # neither asks the kernel again


def test_readers_racing_to_record_agree_on_one_value(tmp_path: Path) -> None:
    # Threads of one process (one pid), as in SkyPilot's controller, released at once.
    for round_ in range(40):
        path = str(tmp_path / f"boot-time-{round_}")
        start = threading.Barrier(8)

        def first_read(v: float, path: str = path, start: threading.Barrier = start) -> float:
            start.wait()
            return stable(lambda: v, path)()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(first_read, [float(v) for v in range(8)]))
        assert len(set(answers)) == 1 and Path(path).read_text() == repr(answers[0]), answers
        assert not list(tmp_path.glob(f"boot-time-{round_}.*"))  # no partial file left
