"""docker's client as a stage's engine: it must pass the container nothing the stage did not
declare. The client adds the ``proxies`` of its own config.json to every container it creates
(as HTTP_PROXY, http_proxy, NO_PROXY...), unless npa starts it with a configuration without
them (npa.adapters.containers.docker_client_config).

Real parts: docker's own client (scripts/bootstrap-tools takes it from Debian's docker.io
package, without the daemon, unless one is on PATH) talking to podman's
docker-compatible API service on a unix socket of this test's own, so the container below is
created by a real engine from exactly the command line and environment the local executor
gives the client. ``create`` stands for ``run``: podman 4.3's compatible API refuses the
attach that ``docker run`` asks for, and the variables are fixed at creation."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from npa.adapters.containers import RUN_LABEL, ContainerEngine, client_env, find_engine
from npa.backends.local.executor import ContainerRuntime
from tests.harness.images import busybox_rootfs
from tests.harness.procs import ManagedProcess
from tests.harness.tools import require_tool

pytestmark = pytest.mark.integration

PROXIES = {
    "httpProxy": "http://canary-http.proxy.invalid:3128",
    "httpsProxy": "http://canary-https.proxy.invalid:3128",
    "ftpProxy": "http://canary-ftp.proxy.invalid:21",
    "allProxy": "socks5://canary-all.proxy.invalid:1080",
    "noProxy": "canary-no-proxy.invalid",
}
AUTH = "Y2FuYXJ5LXVzZXI6Y2FuYXJ5LXBhc3N3b3Jk"  # canary-user:canary-password


@pytest.fixture(scope="module")
def docker_on_podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(DOCKER_HOST, an image id): podman's API service on a socket of this module's, with a
    busybox image imported into podman's storage."""
    podman = require_tool("NPA_PODMAN_BIN", "podman")
    work = tmp_path_factory.mktemp("docker-client")
    socket = work / "podman.sock"
    service = ManagedProcess(
        name="podman-api",
        argv=[str(podman), "system", "service", "--time=0", f"unix://{socket}"],
        log_path=work / "podman-api.log",
    ).start()
    host = f"unix://{socket}"
    try:
        service.wait_until(socket.exists, 60, "listening")
        rootfs = work / "rootfs.tar"
        rootfs.write_bytes(busybox_rootfs())
        tag = f"localhost/npa-tests/docker-client:{uuid.uuid4().hex[:8]}"
        imported = subprocess.run(
            [str(podman), "import", str(rootfs), tag],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert imported.returncode == 0, imported.stderr
        yield host, imported.stdout.strip().splitlines()[-1]
        subprocess.run([str(podman), "rmi", "--force", tag], capture_output=True, timeout=120,
                       check=False)  # fmt: skip
    finally:
        service.stop()


def user_config(tmp_path: Path) -> Path:
    """A user's docker configuration folder: proxies, a registry login, and a plugin folder."""
    folder = tmp_path / "user-docker"
    (folder / "cli-plugins").mkdir(parents=True)
    config = {"proxies": {"default": PROXIES}, "auths": {"registry.invalid": {"auth": AUTH}},
              "detachKeys": "ctrl-e,e"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def created_env(client: ContainerEngine, argv: list[str], env: dict[str, str]) -> list[str]:
    """The variables the container holds when the client creates it from ``argv`` (a run's
    command line, created instead of run) in ``env``."""
    assert argv[:3] == [client.binary, "run", "--rm"], argv
    create = [client.binary, "create", *argv[3:]]
    made = subprocess.run(create, env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip().splitlines()[-1]
    try:
        shown = subprocess.run([client.binary, "inspect", "--format", "{{json .Config.Env}}",
                                container], env=env, capture_output=True, text=True,
                               timeout=60, check=False)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        return list(json.loads(shown.stdout))
    finally:
        subprocess.run([client.binary, "rm", "--force", container], env=env,
                       capture_output=True, timeout=60, check=False)  # fmt: skip


def proxy_names(variables: list[str]) -> set[str]:
    return {v.split("=", 1)[0] for v in variables if "proxy" in v.split("=", 1)[0].lower()}


def test_a_container_docker_starts_for_a_stage_gets_no_proxy_of_the_clients_config(
    docker_on_podman: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, image = docker_on_podman
    monkeypatch.setenv("DOCKER_HOST", host)
    monkeypatch.setenv("DOCKER_CONFIG", str(user_config(tmp_path)))
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    docker = require_tool("NPA_DOCKER_BIN", "docker")
    client = find_engine("docker", path=str(docker.parent))
    assert client is not None and client.name == "docker"
    work = tmp_path / "executor"
    runtime = ContainerRuntime(client, "run-docker", tmp_path / "source", work)
    env = {"GREETING": "hi", "NPA_STAGE": "probe"}
    argv = client.run_argv(
        image=image, command=["/bin/sh", "-c", "env"], name=f"npa-{uuid.uuid4().hex[:8]}",
        env=env, mounts=[], workdir="/", labels={RUN_LABEL: "run-docker"},
    )  # fmt: skip

    # The client left to its user's configuration hands the container every proxy it names:
    # what npa must not let through.
    leaked = created_env(client, argv, client_env(env))
    assert proxy_names(leaked) >= {"HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"}, leaked

    # Started as the executor starts it, the container holds what npa gave and no proxy.
    given = created_env(client, argv, runtime.client_env(env))
    assert proxy_names(given) == set(), given
    assert {"GREETING=hi", "NPA_STAGE=probe"} <= set(given), given
    # The client's configuration npa wrote keeps the rest of the user's and no credential;
    # every other entry of the user's folder is the user's own, linked.
    written = work / "docker-client"
    kept = json.loads((written / "config.json").read_text())
    assert kept == {"detachKeys": "ctrl-e,e"}, kept
    assert (written / "cli-plugins").resolve() == (tmp_path / "user-docker" / "cli-plugins")
    assert AUTH not in (written / "config.json").read_text()
    assert oct(written.stat().st_mode & 0o777) == "0o700"
