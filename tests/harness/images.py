"""Runnable test images, built without a container engine.

A static busybox (Debian's ``busybox-static``, installed by scripts/bootstrap-tools) plus one
symlink per applet is a complete root file system for shell stages: ``sh``, ``awk``, ``seq``,
``mkdir``, ``cat``... The layer is deterministic (fixed mtimes and owners), so pushing it twice
gives the same digest.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from functools import lru_cache
from pathlib import Path

from tests.harness.tools import require_tool


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


@lru_cache(maxsize=1)
def _busybox_rootfs(busybox: Path) -> bytes:
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    data = busybox.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "tmp", "etc"):
            _add_dir(tar, folder)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
        for applet in sorted(set(applets) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(link)
        # A passwd entry for the uid stages run as, so tools that look the user up work.
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnpa:x:1000:1000:npa:/tmp:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode, info.mtime = len(passwd), 0o644, 0
        tar.addfile(info, io.BytesIO(passwd))
    return buffer.getvalue()


def busybox_rootfs() -> bytes:
    """An uncompressed tar of a root file system whose ``/bin`` is busybox and its applets."""
    return _busybox_rootfs(require_tool("NPA_BUSYBOX_BIN", "busybox"))
