"""SkyPilot run with a home of its own, so a read-only command leaves ``~/.sky`` as it was.

Importing SkyPilot creates ``~/.sky/{user_hash,serve,locks}``, and asking its API server's
health rewrites ``~/.sky/cookies.txt``: SkyPilot works out every one of those paths from
``$HOME``. :func:`private_home` points ``HOME`` at a temporary directory of this process while
SkyPilot code runs (in this process or in a probe it starts), and hands SkyPilot what it must
still read from the user's own ``~/.sky`` through the variables SkyPilot honours:

- ``SKYPILOT_GLOBAL_CONFIG``: the user's ``~/.sky/config.yaml`` (which API server, its token);
- ``SKYPILOT_USER_ID``: the user's ``~/.sky/user_hash``, so the server sees the same user;
- ``SKYPILOT_API_COOKIE_FILE``: a copy of the user's cookie jar (a login's session), which
  SkyPilot may rewrite without touching the original;
- ``KUBECONFIG``: the user's ``~/.kube/config`` when no ``KUBECONFIG`` is set (SkyPilot's
  kubernetes client would look for it under the moved ``HOME``).

Every SkyPilot import of a read path runs inside :func:`private_home` (the API server's
health and configuration, the environment probe, the managed-jobs reads behind ``status``,
``logs`` and ``list``, the pod names behind their pending reasons); only ``submit``'s launch
runs SkyPilot with the user's own home.

A variable the user set already is left as it is. The directory is removed when npa exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

GLOBAL_CONFIG_ENV = "SKYPILOT_GLOBAL_CONFIG"
USER_ID_ENV = "SKYPILOT_USER_ID"
COOKIE_ENV = "SKYPILOT_API_COOKIE_FILE"

_home: Path | None = None
_real_home: Path | None = None


def _private_dir() -> tuple[Path, Path]:
    """(this process's SkyPilot home, the user's real home), made on first use. One directory
    for the life of the process: SkyPilot fixes some paths when first imported."""
    global _home, _real_home
    if _home is None or _real_home is None:
        _real_home = Path(os.environ.get("HOME") or Path.home())
        _home = Path(tempfile.mkdtemp(prefix="npa-skypilot-home-"))
        atexit.register(shutil.rmtree, _home, ignore_errors=True)
    return _home, _real_home


def _user_hash(real_sky: Path) -> str | None:
    try:
        value = (real_sky / "user_hash").read_text().strip()
    except OSError:
        return None
    return value if value and value.replace("-", "").isalnum() else None


def _overrides(home: Path, real_home: Path) -> dict[str, str]:
    real_sky = real_home / ".sky"
    found = {"HOME": str(home)}
    kubeconfig = real_home / ".kube" / "config"
    if "KUBECONFIG" not in os.environ and kubeconfig.is_file():
        found["KUBECONFIG"] = str(kubeconfig)  # SkyPilot's kubernetes client reads ~/.kube
    config = real_sky / "config.yaml"
    if GLOBAL_CONFIG_ENV not in os.environ and config.is_file():
        found[GLOBAL_CONFIG_ENV] = str(config)
    user = _user_hash(real_sky)
    if USER_ID_ENV not in os.environ and user is not None:
        found[USER_ID_ENV] = user
    cookies = Path(os.environ.get(COOKIE_ENV) or real_sky / "cookies.txt").expanduser()
    copy = home / ".sky" / "cookies.txt"
    if cookies.is_file() and not copy.exists():
        copy.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(cookies, copy)
        copy.chmod(0o600)
    if copy.exists():
        found[COOKIE_ENV] = str(copy)
    return found


@contextlib.contextmanager
def private_home() -> Iterator[dict[str, str]]:
    """Run the body with SkyPilot's home in this process's temporary directory; yields the
    variables set (for a child process's environment). Nested uses share one directory."""
    home, real_home = _private_dir()
    if os.environ.get("HOME") == str(home):  # already inside
        yield {}
        return
    overrides = _overrides(home, real_home)
    before = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield overrides
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
