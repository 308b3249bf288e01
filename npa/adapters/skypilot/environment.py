"""The Python environment SkyPilot runs in: which SkyPilot and kubernetes client it holds, and
whether SkyPilot's own pod_config validation works there.

The environment is inspected by running its interpreter, so any venv can be checked, not only
the one npa itself runs from. Changes go through that environment's own pip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from npa.adapters.skypilot.home import private_home
from npa.core.procs import run_child

SKYPILOT_VERSION = "0.14.1"
# The client version npa is tested with (constraints.txt); 36+ breaks SkyPilot's pod_config
# validation, which deserialises through the client's models.
KNOWN_GOOD_CLIENT = "35.0.0"
FIRST_BROKEN_MAJOR = 36

# Runs inside the inspected interpreter: versions, SkyPilot's declared client range, and the
# result of SkyPilot's own pod_config validation on a minimal pod.
_PROBE = r"""
import json, importlib.metadata as md
out = {"python": __import__("sys").version.split()[0]}
for dist in ("skypilot", "kubernetes"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
try:
    reqs = md.requires("skypilot") or []
    out["declared"] = sorted({r.split(";")[0].strip() for r in reqs
                              if r.replace(" ", "").startswith("kubernetes")
                              and not r.replace(" ", "").startswith("kubernetes-")})
except md.PackageNotFoundError:
    out["declared"] = []
if out["skypilot"] and out["kubernetes"]:
    try:
        from sky.provision.kubernetes.utils import check_pod_config
        pod = {"spec": {"containers": [{"name": "probe", "image": "busybox",
                                        "resources": {"limits": {"cpu": "1"}}}]}}
        ok, reason = check_pod_config(pod)
        out["pod_config"] = {"ok": bool(ok), "reason": reason}
    except Exception as exc:
        out["pod_config"] = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
print("NPA-PROBE " + json.dumps(out))
"""


@dataclass
class EnvironmentFacts:
    venv: Path
    exists: bool
    python: str | None = None
    skypilot: str | None = None
    kubernetes: str | None = None
    declared: tuple[str, ...] = ()
    pod_config_ok: bool | None = None
    pod_config_reason: str | None = None
    detail: str = ""


def interpreter(venv: Path) -> Path:
    return venv / "bin" / "python"


def current_environment() -> Path:
    """The environment npa (and so the SkyPilot it imports and starts) runs in."""
    return Path(sys.prefix)


def inspect(venv: Path, *, timeout: float = 120) -> EnvironmentFacts:
    python = interpreter(venv)
    if not python.exists():
        return EnvironmentFacts(venv, False, detail=f"{python} does not exist")
    try:
        with private_home():  # the probe imports SkyPilot: it would create ~/.sky
            proc = run_child([str(python), "-c", _PROBE], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return EnvironmentFacts(venv, True, detail=f"could not run {python}: {exc}")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("NPA-PROBE ")), None)
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return EnvironmentFacts(venv, True, detail=f"{python} exited {proc.returncode}: {tail[0]}")
    data = json.loads(line.removeprefix("NPA-PROBE "))
    probe = data.get("pod_config") or {}
    return EnvironmentFacts(
        venv,
        True,
        python=data.get("python"),
        skypilot=data.get("skypilot"),
        kubernetes=data.get("kubernetes"),
        declared=tuple(data.get("declared") or ()),
        pod_config_ok=probe.get("ok"),
        pod_config_reason=probe.get("reason"),
    )


def client_major(version: str | None) -> int | None:
    if not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def create(venv: Path) -> str:
    """Create a venv at ``venv`` with npa's interpreter; returns the command it ran."""
    argv = [sys.executable, "-m", "venv", str(venv)]
    _run(argv)
    return " ".join(argv)


def pip_install(venv: Path, requirements: list[str]) -> str:
    """Install exactly these requirements with the environment's own pip; returns the command."""
    argv = [str(interpreter(venv)), "-m", "pip", "install", "--quiet", *requirements]
    _run(argv)
    return " ".join(argv)


class CommandFailed(Exception):
    pass


def _run(argv: list[str]) -> None:
    # pip and venv run in a process group that ends with npa (SIGTERM, Ctrl-C, the timeout).
    proc = run_child(argv, timeout=1800)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise CommandFailed(f"{' '.join(argv)} exited {proc.returncode}: {tail}")
