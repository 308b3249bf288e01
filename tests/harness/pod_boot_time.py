"""One boot time for every process of a pod of the test cluster (installed in its SkyPilot image).

psutil gives a process's start as the boot time plus the ticks between boot and the start, and
it reads the boot time from ``/proc/stat`` on every call. The kernel derives that value from the
wall clock, so it moves by a whole second when the host's clock is adjusted, which this machine
kind does while it runs. SkyPilot's jobs controller records its own start once and later calls
it alive only on an exact match (``sky.jobs.utils.controller_process_alive``): after one such
move every live managed job ends FAILED_CONTROLLER, "Controller process is dead", with its
controller still running.

The image's runtime environments load this module at interpreter start (a ``.pth`` file).
The first process of a pod that asks for the boot time records it in :data:`PATH`; every later
call, in any process of the pod, answers that value. Nothing else changes. Standard library
only: it runs under the image's Python 3.10 with no npa installed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable

PATH = "/tmp/.npa-pod-boot-time"


def stable(read: Callable[[], float], path: str = PATH) -> Callable[[], float]:
    """``read`` (the kernel's boot time) as the pod first saw it: the first answer is kept in
    ``path`` (the first writer wins, atomically), and every answer after it is that one."""

    def recorded() -> float | None:
        try:
            with open(path) as f:
                return float(f.read())
        except (OSError, ValueError):
            return None

    def boot_time() -> float:
        found = recorded()
        if found is not None:
            return found
        value = read()
        # A file of this writer's own (threads of one process share a pid): a name shared by
        # two writers could be truncated by one while the other links it, and a reader of the
        # linked file would find it empty.
        fd, partial = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                                       dir=os.path.dirname(path) or ".")  # fmt: skip
        try:
            with os.fdopen(fd, "w") as f:
                f.write(repr(value))
            os.link(partial, path)  # fails when another writer recorded it first
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(partial)
        found = recorded()
        return value if found is None else found

    return boot_time


def install(path: str = PATH) -> None:
    """Route psutil's boot time on Linux (and so every process's create time) through
    :func:`stable`; a no-op where psutil is missing."""
    try:
        import psutil._pslinux as linux  # type: ignore[import-untyped,unused-ignore]
    except Exception:  # not installed (yet), or not Linux
        return
    if getattr(linux.boot_time, "npa_stable", False):
        return
    patched = stable(linux.boot_time, path)
    patched.npa_stable = True  # type: ignore[attr-defined]
    linux.boot_time = patched
