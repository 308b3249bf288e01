"""The world the end-to-end SkyPilot tests share: one project provisioned on the test cluster.

Everything a user would set up once, done once per session: a moto S3 server on the cluster's
gateway address (pods cannot reach the host's loopback), a SkyPilot home whose configuration
sizes the jobs controller for the cluster's 2-CPU node and points it at the runtime image, a
local SkyPilot API server on a free port, and project ``e2e`` configured and provisioned with
``npa provision-if-absent --target kubernetes`` (namespace, service account, RBAC, placed
kubeconfig). The jobs controller SkyPilot creates on the first launch (a pod of about 1.6 GiB)
is then shared by every test, as it would be by a user's runs.

Teardown stops the run supervisors npa started, the API server and every process of its tree
(SkyPilot's idle request workers ignore SIGTERM, so survivors get SIGKILL), before the cluster
itself goes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.cli import CliResult, run_npa
from tests.harness.cluster import CATALOG_CONFIGMAP, Cluster, free_port_on, sky_config
from tests.harness.procs import pid_alive, stop_lock_holders
from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.harness.skypilot import SKY, api_server_port, stop_sky_processes

PROJECT = "e2e"
BUCKET = "npa-e2e"
SUPERVISOR_LOCKS = ("locks/supervisor.*.lock", "local-jobs/*/supervisor.lock")


@dataclass
class SkyCluster:
    """A provisioned project on the test cluster, and the environment that reaches it."""

    cluster: Cluster
    s3: S3Server
    home: Path  # HOME of npa and SkyPilot (~/.sky holds SkyPilot's state and configuration)
    npa_home: Path
    env: dict[str, str]
    project: str = PROJECT
    bucket: str = BUCKET
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def context(self) -> str:
        return self.cluster.context

    @property
    def namespace(self) -> str:
        return f"npa-{self.project}"

    def npa(self, *args: str, timeout: float = 600, **env: str) -> CliResult:
        """The npa CLI in a subprocess, in this world's environment."""
        return run_npa(*args, env={**self.env, **env}, timeout=timeout)

    def sky(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SKY), *args],
            env={**os.environ, **self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start_api_server(self) -> subprocess.CompletedProcess[str]:
        """``sky api start`` as a user who set the cluster up would: with the kubeconfig
        provisioning placed in the server's ``KUBECONFIG`` (the server resolves a launch's
        context with its own kubeconfig)."""
        placed = self.npa_home / "clusters" / self.context / "kubeconfig"
        return self.sky("api", "start", "--host", "127.0.0.1", KUBECONFIG=str(placed))

    def store_keys(self, prefix: str) -> dict[str, int]:
        """Key -> size of every object under ``prefix`` in the run store."""
        client = self.s3.client()
        keys: dict[str, int] = {}
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            keys.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return keys


@contextlib.contextmanager
def gateway_moto(gateway: str) -> Iterator[S3Server]:
    """moto's S3 server on the cluster's gateway: reachable from the host and from pods."""
    from moto.server import ThreadedMotoServer

    port = free_port_on(gateway)
    server = ThreadedMotoServer(ip_address=gateway, port=port, verbose=False)
    server.start()
    try:
        yield S3Server(endpoint_url=f"http://{gateway}:{port}", port=port)
    finally:
        server.stop()


# GPU names SkyPilot's catalog knows (a subset of its common/accelerators.csv): enough for the
# tests' requests, all on Kubernetes.
CATALOG_GPUS = ("A100", "A100-80GB", "H100", "H200", "L4", "L40S", "T4")


def seed_accelerator_catalog(home: Path) -> Path:
    """SkyPilot's accelerator catalog, written where it keeps its downloaded copy.

    Every task that asks for a GPU makes SkyPilot canonicalize the name against
    ``common/accelerators.csv``, which it downloads from GitHub on first use; this machine
    cannot reach GitHub, so the launch would fail before any pod exists. A catalog SkyPilot
    finds in place is used as is, as on a site that mirrors SkyPilot's catalogs. The jobs
    controller, which has no internet either and is sent no catalog, mounts the same file
    from a ConfigMap (:func:`tests.harness.cluster.sky_config`).
    """
    from sky.skylet import constants

    path = home / ".sky" / "catalogs" / constants.CATALOG_SCHEMA_VERSION / "common"
    path.mkdir(parents=True, exist_ok=True)
    rows = "".join(f"{gpu},['Kubernetes']\n" for gpu in CATALOG_GPUS)
    (path / "accelerators.csv").write_text("AcceleratorName,Clouds\n" + rows)
    return path / "accelerators.csv"


@contextlib.contextmanager
def sky_cluster_world(
    cluster: Cluster, workdir: Path, *, cpu_request: str | None = None
) -> Iterator[SkyCluster]:
    """Configure and provision project ``e2e`` on ``cluster``; see the module docstring
    (``cpu_request``: :func:`tests.harness.cluster.sky_config`)."""
    timings: dict[str, float] = {}
    home = workdir / "home"
    npa_home = home / ".npa"
    home.mkdir(parents=True)
    sky_config(cluster, home / ".sky" / "config.yaml", cpu_request=cpu_request)
    catalog = seed_accelerator_catalog(home)
    kubectl_dir = str(cluster.tools.kubectl.parent)
    with gateway_moto(cluster.gateway) as s3:
        env = {
            "HOME": str(home),
            "NPA_HOME": str(npa_home),
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "SKYPILOT_API_SERVER_LOCAL_PORT": str(api_server_port()),
            # SkyPilot copies files to pods and reads their logs through kubectl.
            "PATH": f"{kubectl_dir}:{os.environ.get('PATH', '')}",
            "NPA_READYZ_WINDOW_SECONDS": "1",
            "NPA_READYZ_INTERVAL_SECONDS": "0.5",
            "NPA_SKYPILOT_POLL_SECONDS": "10",
        }
        env.pop("AWS_ENDPOINT_URL_S3", None)
        world = SkyCluster(
            cluster=cluster, s3=s3, home=home, npa_home=npa_home, env=env, timings=timings
        )
        s3.client().create_bucket(Bucket=BUCKET)
        try:
            started = time.monotonic()
            configured = world.npa(
                "configure", "--project", PROJECT, "--store", f"s3://{BUCKET}/runs",
                "--endpoint-url", s3.endpoint_url, "--region", REGION,
                "--context", cluster.context, "--registry", cluster.registry,
            )  # fmt: skip
            assert configured.code == 0, configured.stdout + configured.stderr
            provisioned = world.npa(
                "provision-if-absent", "--project", PROJECT, "--target", "kubernetes",
                "--context", cluster.context, "--kubeconfig", str(cluster.kubeconfig),
                "--yes", "--json",
            )  # fmt: skip
            assert provisioned.code == 0, provisioned.stdout + provisioned.stderr
            timings["provision_seconds"] = round(time.monotonic() - started, 1)
            mirrored = cluster.kubectl(
                "create", "configmap", CATALOG_CONFIGMAP, "-n", world.namespace,
                f"--from-file=accelerators.csv={catalog}",
            )  # fmt: skip
            assert mirrored.returncode == 0, mirrored.stderr
            started = time.monotonic()
            api = world.start_api_server()
            for _ in range(2):  # a queue port taken between the check and the start: once more
                if api.returncode == 0:
                    break
                env["SKYPILOT_API_SERVER_LOCAL_PORT"] = str(api_server_port())
                api = world.start_api_server()
            assert api.returncode == 0, api.stdout + api.stderr
            timings["api_server_seconds"] = round(time.monotonic() - started, 1)
            yield world
        finally:
            stop_lock_holders(npa_home, SUPERVISOR_LOCKS)
            stop_sky_processes(home, env)


def main(argv: list[str]) -> int:
    """``python -m tests.harness.skypilot_cluster up WORKDIR [--pod-cpu-request QUANTITY]``:
    the cluster and project ``e2e`` (as the tests get them) until SIGTERM or SIGINT;
    ``WORKDIR/world.json`` holds what a shell needs (the environment for npa, the context, the
    images). Used by ``make demo-cluster``."""
    import json
    import sys

    from tests.harness.cluster import pod_cluster, tools_from_env

    cpu_request = None
    if len(argv) == 4 and argv[2] == "--pod-cpu-request":
        cpu_request, argv = argv[3], argv[:2]
    if len(argv) != 2 or argv[0] != "up":
        sys.stderr.write(
            "usage: python -m tests.harness.skypilot_cluster up WORKDIR"
            " [--pod-cpu-request QUANTITY]\n"
        )
        return 2
    tools = tools_from_env()
    if isinstance(tools, str):
        sys.stderr.write(f"missing: {tools}; run scripts/bootstrap-tools, then source env.sh\n")
        return 6
    workdir = Path(argv[1])
    stop = {"now": False}

    def request_stop(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    started = time.monotonic()
    with (
        pod_cluster(tools, workdir / "cluster") as cluster,
        sky_cluster_world(cluster, workdir / "world", cpu_request=cpu_request) as world,
    ):
        info = {
            "context": cluster.context,
            "project": world.project,
            "images": cluster.images,
            "env": world.env,
            "store": f"s3://{world.bucket}/runs",
            "up_seconds": round(time.monotonic() - started, 1),
        }
        (workdir / "world.json").write_text(json.dumps(info, indent=1))
        print(json.dumps({k: v for k, v in info.items() if k != "env"}), flush=True)
        while not stop["now"] and all(pid_alive(p.pid) for p in cluster.processes):
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
