"""SkyPilot's own answers: its API server, its jobs controller, and its check of a context.

Nothing here starts anything. SkyPilot's SDK starts a local API server on most calls when none
is running; these functions ask the health endpoint first and only call the SDK further when
the server already answered healthy. :func:`configured_server_url` and
:func:`server_reachable` do not even import SkyPilot (importing it creates ``~/.sky``), so a
read-only command can find out the server is down and say so without touching anything; the
functions that do import it run it with its home in a temporary directory (:mod:`.home`).
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from npa.adapters.skypilot.home import private_home

ServerState = Literal[
    "healthy", "not_running", "unreachable", "unhealthy", "needs_auth", "version_mismatch"
]
ControllerState = Literal["up", "stopped", "init", "absent", "unknown"]
CONTROLLER_PREFIX = "sky-jobs-controller-"
# SkyPilot's own names (sky/server/common.py, sky/skylet/constants.py, sky/skypilot_config.py).
DEFAULT_LOCAL_PORT = 46580
ENDPOINT_ENV = "SKYPILOT_API_SERVER_ENDPOINT"
LOCAL_PORT_ENV = "SKYPILOT_API_SERVER_LOCAL_PORT"
GLOBAL_CONFIG_ENV = "SKYPILOT_GLOBAL_CONFIG"
NO_LOCAL_SERVER_ENV = "SKYPILOT_DISABLE_LOCAL_API_SERVER"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]")
# Seconds a server that took the connection is given to answer before npa says it does not.
PATIENCE = 20.0


class ApiServerDown(Exception):
    """The configured SkyPilot API server does not answer, and npa will not start one here."""

    def __init__(self, url: str, why: str = "") -> None:
        self.url = url
        local = is_local(url)
        reading = "; npa starts no server to read a run" if local and not why else ""
        super().__init__(
            f"the SkyPilot API server at {url} does not answer"
            + (f" ({why})" if why else "")
            + reading
        )
        self.fix = "sky api start" if local else f"sky api login -e {url}"


def configured_server_url() -> str:
    """The API server SkyPilot's client would use, worked out as SkyPilot does (its endpoint
    variable, else ``api_server.endpoint`` of its configuration, else the local server on the
    configured port), without importing SkyPilot."""
    url = os.environ.get(ENDPOINT_ENV)
    if url:
        return url.rstrip("/")
    config = Path(os.environ.get(GLOBAL_CONFIG_ENV) or Path.home() / ".sky" / "config.yaml")
    if config.is_file():
        import yaml

        try:
            data = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError):
            data = {}
        endpoint = (
            (data.get("api_server") or {}).get("endpoint") if isinstance(data, dict) else None
        )
        if endpoint:
            return str(endpoint).rstrip("/")
    port = os.environ.get(LOCAL_PORT_ENV) or DEFAULT_LOCAL_PORT
    return f"http://127.0.0.1:{port}"


def is_local(url: str) -> bool:
    return (urllib.parse.urlsplit(url).hostname or "") in {h.strip("[]") for h in LOCAL_HOSTS}


def server_reachable(url: str, timeout: float = PATIENCE) -> bool:
    """Whether anything answers HTTP at the server's health endpoint (any status: a server
    that wants authentication is up).

    A refused connection is an answer at once: nothing listens. A server that takes the
    connection but is slow to answer (busy with a launch on a loaded machine) is given
    ``timeout`` seconds, because busy is not down."""
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


@dataclass
class ServerAnswer:
    url: str
    local: bool
    state: ServerState
    version: str | None = None
    api_version: str | None = None
    commit: str | None = None
    detail: str = ""


@dataclass
class ControllerAnswer:
    state: ControllerState
    names: list[str] = field(default_factory=list)
    detail: str = ""


@contextlib.contextmanager
def kubeconfig_env(path: str | Path | None) -> Iterator[None]:
    """Point SkyPilot (and the kubernetes client under it) at exactly this kubeconfig."""
    if path is None:
        yield
        return
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before


def api_server() -> ServerAnswer:
    """Ask the configured API server's health endpoint once, without starting a server (and,
    as every function here, with SkyPilot's home moved off ``~/.sky``: :mod:`.home`)."""
    with private_home():
        return _api_server()


def _api_server() -> ServerAnswer:
    from sky.server import common

    url = common.get_server_url()
    local = bool(common.is_api_server_local())
    response = common.get_api_server_status_response(url)
    if response is None:
        # A refused loopback port is an authoritative "not running" for a local server; a
        # remote one that does not answer is only "unreachable".
        if local:
            return ServerAnswer(url, local, "not_running", detail="nothing listens on the port")
        return ServerAnswer(url, local, "unreachable", detail="no answer from the server")
    info = common.get_api_server_status(url)
    state: ServerState = {
        "healthy": "healthy",
        "needs_auth": "needs_auth",
        "version_mismatch": "version_mismatch",
    }.get(str(info.status.value), "unhealthy")  # type: ignore[assignment]
    return ServerAnswer(
        url,
        local,
        state,
        version=info.version,
        api_version=info.api_version,
        commit=info.commit,
        detail=str(info.error or f"HTTP {response.status_code}"),
    )


def jobs_controller() -> ControllerAnswer:
    """The jobs controller cluster(s) as the (already healthy) API server reports them.

    The answer covers every user's controller; an empty list from a healthy server is an
    authoritative "absent" (SkyPilot creates the controller on the next managed-job launch).
    """
    with private_home():
        return _jobs_controller()


def _jobs_controller() -> ControllerAnswer:
    import sky

    try:
        records = sky.get(sky.status(all_users=True))
    except Exception as exc:
        return ControllerAnswer("unknown", detail=f"sky.status: {type(exc).__name__}: {exc}")
    controllers = [r for r in records if str(_field(r, "name")).startswith(CONTROLLER_PREFIX)]
    if not controllers:
        return ControllerAnswer("absent", detail="the API server lists no jobs controller")
    names = sorted(str(_field(r, "name")) for r in controllers)
    states = {str(getattr(_field(r, "status"), "value", _field(r, "status"))) for r in controllers}
    for candidate, state in (("UP", "up"), ("INIT", "init"), ("STOPPED", "stopped")):
        if candidate in states:
            return ControllerAnswer(state, names, detail=", ".join(sorted(states)))  # type: ignore[arg-type]
    return ControllerAnswer("unknown", names, detail=f"unexpected status {sorted(states)}")


def _field(record: object, name: str) -> object:
    if isinstance(record, dict):
        return record.get(name)
    return getattr(record, name, None)


def check_kubernetes(kubeconfig: Path, context: str) -> tuple[bool, str]:
    """SkyPilot's own ``sky check kubernetes`` logic for one context, run in this process.

    It is the code the API server runs for each allowed context (networking dependencies, then
    the credential probe and SkyPilot's optional checks), pointed at npa's kubeconfig file.
    """
    with private_home():
        return _check_kubernetes(kubeconfig, context)


def _check_kubernetes(kubeconfig: Path, context: str) -> tuple[bool, str]:
    from sky.provision.kubernetes import utils as kube_utils

    missing = kube_utils.check_port_forward_mode_dependencies(False)
    if missing:
        return False, " ".join(missing)
    with kubeconfig_env(kubeconfig):
        try:
            ok, reason = kube_utils.check_credentials(context, run_optional_checks=True)
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
    return bool(ok), str(reason or "")
