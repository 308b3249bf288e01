"""A real Kubernetes cluster of two nodes that runs pods, for SkyPilot managed jobs end to end.

containerd + runc + the CNI bridge plugin run the pods; etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and the kubelet are the upstream components, built by
``scripts/bootstrap-tools`` at one pinned release. The images come from the same script (an OCI
layout built once per set of inputs) and are served by a registry of the cluster's own, which
the node (containerd on this host) pulls from over loopback.

Pods live on a bridge of the cluster's own (``npabr<id>``); each node has its own /24 of a free
block and its own address on the bridge, and the host routes between the nodes' ranges. Pods
cannot reach the host's 127.0.0.1, so everything a pod must reach listens on the first node's
address, the cluster's gateway, never
on an external interface: the API server (pods reach it through the ``kubernetes`` Service
address, which a DNAT rule of the cluster's own chain maps to the gateway), the moto S3 server
of the run store, and the endpoint that answers SkyPilot's network check. There is no
kube-proxy: its iptables chains have fixed names that a second cluster on the same machine would
overwrite, and the ``kubernetes`` Service is the only one anything here uses.

Every host change is recorded and undone by :mod:`tests.harness.cluster_host`, whose guardian
process also undoes them when the test run is killed.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from tests.harness.cluster_host import CGROUP_FS, SHARED, HostRecord, postrouting_chain, run
from tests.harness.procs import ManagedProcess, http_status, pid_alive

ROOT = Path(__file__).resolve().parents[2]
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
# SkyPilot's network check from a pod (sky.backends.backend_utils._TEST_IP_LIST).
NETCHECK_IPS = ("8.8.8.8", "1.1.1.1")
# The images scripts/cluster-images builds, as the cluster's registry serves them.
IMAGE_TAGS = ("pause", "busybox", "sky-runtime")
READY_TIMEOUT = 120.0
# The cgroup weight of the cluster's pods together: eight busy processes' worth (a node's pods
# get the weight of the node's CPUs; here they share two cores with everything else).
POD_CPU_SHARES = 8192
STOP_GRACE = 3.0
# An upper bound for containerd's tmpfs (images, unpacked layers, the pods' writable layers);
# memory is used only as it fills (about 2 GiB with the runtime image and a few pods).
CONTAINERD_TMPFS = "8g"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class ClusterTools:
    """The binaries a cluster runs, as ``scripts/bootstrap-tools`` exports them."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kubectl: Path
    containerd: Path
    registry: Path
    skopeo: Path
    cni_dir: Path
    images: Path  # scripts/cluster-images output: oci/, netcheck/, images.txt


@dataclass
class Cluster:
    """A running cluster and what a test needs to use it."""

    cluster_id: str
    context: str
    node: str
    kubeconfig: Path  # admin (system:masters), server on the gateway address
    gateway: str
    subnet: str  # the pods' range: every node's range in one block
    registry: str  # host:port in image references; the node pulls from it
    images: dict[str, str]  # tag -> reference pinned by digest
    workdir: Path
    tools: ClusterTools
    processes: list[ManagedProcess] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # every node's name, ``node`` first
    pod_cidrs: dict[str, str] = field(default_factory=dict)  # node -> its own pods' range
    record: HostRecord | None = None  # where a restarted process's pid is recorded for undo
    keeper: Keeper | None = None  # what starts the scheduler and controller-manager again

    @contextlib.contextmanager
    def down(self, name: str) -> Iterator[None]:
        """The cluster's process ``name`` (``kube-apiserver``, ``kubelet``, ...) stopped for the
        body of the ``with``, as a crash or a restart of that component does; then started again
        with the same command line, and the ``with`` ends when it answers again (the API
        server's ``/readyz``; for a kubelet, its node Ready and its own health endpoint)."""
        [proc] = [p for p in self.processes if p.name == name]
        proc.stop(STOP_GRACE)
        try:
            yield
        finally:
            proc.start()
            if self.record is not None:
                self.record.started(proc.pid)

        kubelets = {self.kubelet_of(node): node for node in self.nodes}

        def answers() -> bool:
            asked = self.kubectl("get", "--raw", "/readyz", timeout=10)
            if asked.returncode != 0 or name not in kubelets:
                return asked.returncode == 0
            node = self.kubectl("get", "node", kubelets[name], "-o", "json", timeout=10)
            conditions = json.loads(node.stdout)["status"]["conditions"]
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            # A node stays Ready in the API for a while after its kubelet stops: the kubelet's
            # own health endpoint says it is serving again.
            return ready and http_status(f"http://127.0.0.1:{proc.ports[1]}/healthz") == 200

        proc.wait_until(answers, 180, "answering again after it was stopped")

    def kubelet_of(self, node: str) -> str:
        """The name of ``node``'s kubelet among :attr:`processes` (for :meth:`down`)."""
        return f"kubelet{NodePlace.suffix_of(self.nodes.index(node))}"

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig), context=self.context)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.tools.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pod_pids(self) -> list[int]:
        """Every process running in the cluster's pods (from its cgroups)."""
        from tests.harness.cluster_host import _cgroup_pids

        return sorted(_cgroup_pids(f"/npa-{self.cluster_id}"))


# --- small helpers ----------------------------------------------------------------------------


def free_port_on(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _routes() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in run("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        head = line.split()[0] if line.split() else ""
        if head in ("default", "broadcast", "local", "unreachable"):
            head = line.split()[1] if len(line.split()) > 1 else ""
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(head, strict=False))
    return nets


def pick_pod_network(nodes: int = 1) -> ipaddress.IPv4Network:
    """The cluster's pod range: a /24 for each of ``nodes`` nodes, in one aligned block of
    10.100.0.0-10.199.255.255 that no route on this host overlaps (nor the Service range)."""
    prefix = 24 - (nodes - 1).bit_length()
    used = [*_routes(), ipaddress.ip_network(SERVICE_CIDR)]
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.{random.randint(100, 199)}.{random.randint(0, 255)}.0/24"
        ).supernet(new_prefix=prefix)
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise RuntimeError(f"no free /{prefix} in 10.100.0.0-10.199.255.0 for the test cluster's pods")


def node_pod_cidrs(network: ipaddress.IPv4Network, nodes: int) -> list[ipaddress.IPv4Network]:
    """Each node's own /24 of the cluster's pod range, in node order."""
    return list(network.subnets(new_prefix=24))[:nodes]


# --- PKI --------------------------------------------------------------------------------------


def _write_pki(
    pki: Path, *, gateway: str, nodes: list[str], addresses: list[str]
) -> dict[str, Path]:
    """A CA, the API server's serving certificate (loopback, gateway and Service addresses), the
    kubelets' serving certificate (every node's name and address), the API server's client
    certificate for the kubelets, and the service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def key_pem(key: Any) -> bytes:
        return bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "npa-test-cluster-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(cn: str, org: str | None, sans: list[Any]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    ip = ipaddress.ip_address
    server_crt, server_key = issue(
        "kube-apiserver",
        None,
        [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
            x509.IPAddress(ip("127.0.0.1")),
            x509.IPAddress(ip(gateway)),
            x509.IPAddress(ip(KUBERNETES_SERVICE_IP)),
        ],
    )
    kubelet_crt, kubelet_key = issue(
        nodes[0],
        None,
        [*(x509.DNSName(n) for n in nodes), *(x509.IPAddress(ip(a)) for a in addresses)],
    )
    client_crt, client_key = issue("kube-apiserver-kubelet-client", "system:masters", [])
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "server.crt": server_crt,
        "server.key": server_key,
        "kubelet.crt": kubelet_crt,
        "kubelet.key": kubelet_key,
        "apiserver-kubelet-client.crt": client_crt,
        "apiserver-kubelet-client.key": client_key,
        "sa.key": key_pem(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    out = {}
    for name, data in files.items():
        path = pki / name
        path.write_bytes(data)
        path.chmod(0o600)
        out[name] = path
    return out


def _netcheck_cert(images: Path, pki: Path) -> tuple[Path, Path]:
    """A serving certificate for 8.8.8.8 and 1.1.1.1, signed by the netcheck CA the runtime
    image trusts (made with the images, so images need not be rebuilt per cluster)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca = x509.load_pem_x509_certificate((images / "netcheck" / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key(
        (images / "netcheck" / "ca.key").read_bytes(), password=None
    )
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netcheck")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(a)) for a in NETCHECK_IPS]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    crt, keyfile = pki / "netcheck.crt", pki / "netcheck.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    keyfile.chmod(0o600)
    return crt, keyfile


def _kubeconfig(path: Path, *, server: str, ca: Path, context: str, user: str, token: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": context,
                        "cluster": {"server": server, "certificate-authority": str(ca)},
                    }
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": context, "context": {"cluster": context, "user": user}}],
                "current-context": context,
            }
        )
    )
    path.chmod(0o600)


# --- configuration files ----------------------------------------------------------------------


def _containerd_config(
    work: Path, tools: ClusterTools, network_dir: Path, pause: str, socket: Path
) -> Path:
    base = work / "containerd"
    text = f"""version = 2
root = "{base}/root"
state = "{base}/state"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # No CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj, which the kubelet asks for.
  restrict_oom_score_adj = true
  # Network namespaces under our state directory, so that teardown finds every one of them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{base}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{tools.cni_dir}"
    conf_dir = "{network_dir}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{base}/certs.d"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"
"""
    path = base / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _registry_hosts(work: Path, registry: str) -> None:
    """containerd pulls from the cluster's registry over plain HTTP (it is on loopback)."""
    hosts = work / "containerd" / "certs.d" / registry / "hosts.toml"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(
        f'server = "http://{registry}"\n\n'
        f'[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n'
    )


def _cni_config(
    network_dir: Path, work: Path, name: str, bridge: str, subnet: str, gw: str
) -> None:
    """One node's CNI network: the cluster's bridge, the node's own pod range and address
    allocator, and the node's address on the bridge as the pods' gateway. The harness puts
    every node's address on the bridge itself (the bridge plugin refuses a second IPv4 address
    on a bridge it manages), so the plugin is told not to be the gateway; the pods' default
    route still goes through ``gw``, and the host routes between the nodes' ranges."""
    network_dir.mkdir(parents=True, exist_ok=True)
    conf = {
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": False,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet, "gateway": gw}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(work / "cni-ipam"),
                },
            }
        ],
    }
    (network_dir / f"10-{name}.conflist").write_text(json.dumps(conf, indent=1))


def _kubelet_config(
    work: Path,
    pki: dict[str, Path],
    *,
    address: str,
    gateway: str,
    port: int,
    healthz: int,
    cgroup_root: str,
    socket: Path,
) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "tlsCertFile": str(pki["kubelet.crt"]),
        "tlsPrivateKeyFile": str(pki["kubelet.key"]),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki["ca.crt"])},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # cgroup v1 (hybrid) without systemd; kubelet 1.35 refuses v1 unless told otherwise.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        # The pods' cgroups under a root of this cluster's own, so two clusters never share one.
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        # No iptables chains of the kubelet's own: their names are global to the host.
        "makeIPTablesUtilChains": False,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "imageServiceEndpoint": f"unix://{socket}",
        "podLogsDir": str(work / "pod-logs"),
        "resolvConf": "/etc/resolv.conf",
        "failSwapOn": False,
        "clusterDomain": "cluster.local",
        # tests.harness.clusterdns answers there: a multi-node task's workers find its head
        # by the name of the head's Service.
        "clusterDNS": [gateway],
        "evictionHard": {
            "memory.available": "200Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
        },
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False,
        "maxPods": 30,
        "registerNode": True,
    }
    path = work / "kubelet" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


# The ConfigMap holding SkyPilot's accelerator catalog (tests.harness.skypilot_cluster creates
# it in the project's namespace), and where SkyPilot, running as root in its pods, looks for it.
CATALOG_CONFIGMAP = "npa-test-sky-catalog"
POD_CATALOG = "/root/.sky/catalogs/{version}/common/accelerators.csv"


def sky_config(cluster: Cluster, path: Path, *, cpu_request: str | None = None) -> Path:
    """A SkyPilot configuration for this cluster: Kubernetes only, this context only, and a
    jobs controller that fits the node (SkyPilot's default asks for 4+ CPUs) on the runtime
    image (SkyPilot's default image is on a registry this machine cannot reach).

    Every SkyPilot pod mounts the accelerator catalog from a ConfigMap, as a site without
    internet mirrors it: the jobs controller canonicalizes a task's GPU name against the
    catalog before it launches anything, and would otherwise try to download it from GitHub
    and retry for ever. The volume is optional, so a pod starts before the ConfigMap exists.

    ``cpu_request`` (``make demo-cluster`` only) overcommits the node as a cluster's admin may:
    every SkyPilot pod then asks the scheduler for that much CPU, whatever its task's ``cpus``
    (which SkyPilot still checks against the node), so tiny-local's two-pod wave fits beside the
    jobs controller on one 2-core node. The tests keep the real requests: one of them needs a
    node with no room."""
    from sky.skylet import constants

    mount = POD_CATALOG.format(version=constants.CATALOG_SCHEMA_VERSION)
    catalog_pods = {
        "spec": {
            "volumes": [
                {
                    "name": "npa-sky-catalog",
                    "configMap": {"name": CATALOG_CONFIGMAP, "optional": True},
                }
            ],
            "containers": [
                {
                    "volumeMounts": [
                        {
                            "name": "npa-sky-catalog",
                            "mountPath": mount,
                            "subPath": "accelerators.csv",
                            "readOnly": True,
                        }
                    ]
                }
            ],
        }
    }
    if cpu_request is not None:
        catalog_pods["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu_request}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "allowed_clouds": ["kubernetes"],
                "kubernetes": {"allowed_contexts": [cluster.context], "pod_config": catalog_pods},
                "jobs": {
                    "controller": {
                        "resources": {
                            "cpus": 1,
                            "memory": 2,
                            "image_id": f"docker:{cluster.images['sky-runtime']}",
                        }
                    }
                },
            }
        )
    )
    return path


# --- the cluster ------------------------------------------------------------------------------


def _cgroup(root: str, shares: int | None = None) -> None:
    """``root`` in every cgroup v1 hierarchy (its parents must exist), with ``shares`` of CPU.

    The cluster's pods weigh as one group against every other process of the host: with the
    default weight (one process's) a busy host starves them, and SkyPilot's jobs controller
    gives up on its own API server after 60 s without CPU."""
    for hierarchy in sorted(CGROUP_FS.iterdir()):
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        target = hierarchy / root.lstrip("/")
        target.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":  # a new cpuset starts empty: give it the parent's
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (target / knob).write_text((target.parent / knob).read_text())
        if hierarchy.name == "cpu" and shares is not None:
            (target / "cpu.shares").write_text(f"{shares}\n")


class Keeper:
    """Starts the cluster's controllers again when one exits, as the kubelet does for the
    static pods of a real control plane. The scheduler exits by design when its cache
    contradicts the API server (``Pod updated on a different node than previously added to``),
    which an API server restart can cause; a cluster whose scheduler stays down schedules
    nothing more, which no real cluster does. Every restart is written in the process's own log
    and counted in :attr:`restarts`."""

    def __init__(self, record: HostRecord, procs: list[ManagedProcess]) -> None:
        self.record = record
        self.procs = procs
        self.restarts: dict[str, int] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="cluster-keeper", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stopping.wait(1.0):
            for proc in self.procs:
                code = proc.popen.poll() if proc.popen is not None else None
                if code is None or self._stopping.is_set():
                    continue
                proc.stop(0)  # its log closed and any child of its group ended
                with open(proc.log_path, "a") as log:
                    log.write(f"--- the harness starts {proc.name} again: it exited {code}\n")
                proc.start()
                self.record.started(proc.pid)
                self.restarts[proc.name] = self.restarts.get(proc.name, 0) + 1

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)


def _record_process(record: HostRecord, proc: ManagedProcess) -> None:
    record.started(proc.pid)


def _wait(what: str, ready: Any, timeout: float, procs: list[ManagedProcess]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.check_running()
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.name}:\n{p.log_tail(25)}" for p in procs)
    raise TimeoutError(f"test cluster: {what} not reached after {timeout:.0f}s\n{tails}")


@contextlib.contextmanager
def _guardian(record: HostRecord) -> Iterator[subprocess.Popen[bytes]]:
    """Start the guardian that undoes the host changes; close its stdin at the end and wait
    for it to finish."""
    log = open(Path(record.workdir) / "guardian.log", "ab")  # noqa: SIM115 - closed below
    guard = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.cluster_host", record.workdir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    try:
        assert guard.stdout is not None
        if guard.stdout.readline().strip() != b"joined":
            raise RuntimeError("the test cluster's guardian did not start")
        yield guard
    finally:
        assert guard.stdin is not None
        guard.stdin.close()
        try:
            guard.wait(timeout=120)
        finally:
            log.close()


def _drain(cluster: Cluster, socket: Path, ctr: IO[bytes] | None = None) -> None:
    """Delete every pod while the kubelet still runs, so it tears each sandbox down cleanly
    (network namespace, CNI address and masquerade rules), and wait until none is left."""
    with contextlib.suppress(Exception):
        cluster.kubectl(
            "delete",
            "pods",
            "--all",
            "--all-namespaces",
            "--grace-period=0",
            "--force",
            "--wait=false",
            timeout=30,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = subprocess.run(
            ["ctr", "-a", str(socket), "-n", "k8s.io", "containers", "ls", "-q"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if not left:
            return
        time.sleep(0.5)


@dataclass(frozen=True)
class NodePlace:
    """Where one node of the cluster keeps its things. The first node keeps them where a
    one-node cluster did; every other node in folders of its own, under the cluster's, so that
    undoing the cluster (:func:`tests.harness.cluster_host.undo`) undoes its nodes too."""

    suffix: str  # "" for the first node, "-N" for node N: its process and log names
    work: Path  # containerd's tmpfs, the kubelet's configuration and the pods' logs
    rundir: Path  # containerd's socket and the kubelet's root: short paths
    cgroup_root: str  # the kubelet's cgroup root, under the cluster's

    @property
    def socket(self) -> Path:
        return self.rundir / "containerd.sock"

    @staticmethod
    def suffix_of(index: int) -> str:
        return "" if index == 0 else f"-{index + 1}"

    @classmethod
    def of(cls, index: int, work: Path, rundir: Path, cgroup_root: str) -> NodePlace:
        number = index + 1
        if index == 0:
            return cls("", work, rundir, f"{cgroup_root}/node-{number}")
        return cls(
            cls.suffix_of(index), work / f"node-{number}", rundir / f"n{number}",
            f"{cgroup_root}/node-{number}",
        )  # fmt: skip


def _start_node(
    start: Any,
    record: HostRecord,
    tools: ClusterTools,
    *,
    node: str,
    place: NodePlace,
    pki: dict[str, Path],
    kubeconfig: Path,
    address: str,
    pod_cidr: str,
    gateway: str,
    registry: str,
    images: dict[str, str],
    logs: Path,
) -> list[ManagedProcess]:
    """One node: its containerd (images and the pods' layers in a tmpfs of its own, the images
    pulled in advance) and its kubelet, registered as ``node`` with ``address`` (on the
    cluster's bridge) as its own. Its pods get addresses from ``pod_cidr`` through an address
    allocator of its own, with ``address`` as their gateway; the host routes between the
    nodes' ranges, so pods of different nodes reach each other by their own addresses. The
    cluster's DNS is on ``gateway``. ``start`` starts a process for the cluster's life. Returns
    the node's processes."""
    work = place.work
    network_dir = work / "cni"
    _cni_config(network_dir, work, record.network, record.bridge, pod_cidr, address)
    # containerd's images and the pods' layers live in memory: unpacking the runtime image is
    # then quick, and tearing it down is one unmount instead of deleting tens of thousands of
    # files (minutes on a busy host).
    record.did("containerd")
    (work / "containerd").mkdir(parents=True, exist_ok=True)
    run("mount", "-t", "tmpfs", "-o", f"size={CONTAINERD_TMPFS},mode=0700", "npa-containerd",
        str(work / "containerd"), check=True)  # fmt: skip
    _registry_hosts(work, registry)
    socket = place.socket
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    containerd_conf = _containerd_config(work, tools, network_dir, images["pause"], socket)
    system_path = {**os.environ, "PATH": SYSTEM_PATH}
    containerd = start(
        ManagedProcess(
            name=f"containerd{place.suffix}",
            argv=[str(tools.containerd), "--config", str(containerd_conf)],
            log_path=logs / f"containerd{place.suffix}.log",
            env=system_path,
        )
    )
    containerd.wait_until(socket.exists, 30, "listening")
    pull_images(socket, work / "containerd" / "certs.d", images, logs / f"pull{place.suffix}.log")
    port, healthz = free_port_on(address), free_port_on("127.0.0.1")
    config = _kubelet_config(
        work, pki, address=address, gateway=gateway, port=port, healthz=healthz,
        cgroup_root=place.cgroup_root, socket=socket,
    )  # fmt: skip
    record.did("kubelet")
    kubelet = start(
        ManagedProcess(
            name=f"kubelet{place.suffix}",
            argv=[
                str(tools.kubelet),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={place.rundir / 'kubelet'}",
                f"--hostname-override={node}",
                f"--node-ip={address}",
                "--v=1",
            ],
            log_path=logs / f"kubelet{place.suffix}.log",
            ports=[port, healthz],
            env=system_path,
        )
    )
    return [containerd, kubelet]


@contextlib.contextmanager
def pod_cluster(tools: ClusterTools, workdir: Path, nodes: int = 2) -> Iterator[Cluster]:
    """Start a cluster of ``nodes`` nodes in ``workdir`` (root only); stop it and undo every host
    change after. The first node advertises GPUs (:data:`NODE_GPUS`), the others none."""
    if os.geteuid() != 0:
        raise PermissionError("the test cluster needs root (network namespaces, cgroups, mounts)")
    cluster_id = secrets.token_hex(3)
    network = pick_pod_network(nodes)
    pod_cidrs = node_pod_cidrs(network, nodes)
    # Each node's address on the bridge is the first of its range, its pods' gateway; the
    # first node's is the cluster's gateway, where everything a pod must reach listens.
    addresses = [str(next(cidr.hosts())) for cidr in pod_cidrs]
    gateway = addresses[0]
    work = workdir
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o700)
    # Unix socket paths are short (108 bytes), and containerd and the kubelet make sockets in
    # their state folders: those live in a short folder of the machine-wide one.
    rundir = SHARED / cluster_id
    socket = rundir / "containerd.sock"
    record = HostRecord(
        cluster_id=cluster_id,
        workdir=str(work),
        bridge=f"npabr{cluster_id}",
        subnet=str(network),
        gateway=gateway,
        network=f"npa-{cluster_id}",
        chain=f"NPA-{cluster_id.upper()}",
        cgroup_root=f"/npa-{cluster_id}",
        containerd_socket=str(socket),
    )
    record.save()
    context = f"npa-{cluster_id}"
    node = f"npa-node-{cluster_id}"
    names = [node] + [f"{node}-{n}" for n in range(2, nodes + 1)]
    logs = work / "logs"
    procs: list[ManagedProcess] = []

    def teardown_mark(what: str) -> None:
        with open(logs / "teardown.log", "a") as out:
            out.write(f"{time.time():.1f} {what}\n")

    def start(proc: ManagedProcess, stack: contextlib.ExitStack) -> ManagedProcess:
        # A short grace: once the pods are gone nothing of the cluster has state worth a
        # graceful shutdown (the API server alone would take its time).
        stack.callback(teardown_mark, f"stopped {proc.name}")
        stack.callback(proc.stop, STOP_GRACE)
        proc.start()
        _record_process(record, proc)
        procs.append(proc)
        return proc

    with contextlib.ExitStack() as stack:
        stack.enter_context(_guardian(record))
        # --- host network and cgroups ----------------------------------------------------
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        record.did("bridge")
        run("ip", "link", "add", record.bridge, "type", "bridge", check=True)
        for address, cidr in zip(addresses, pod_cidrs, strict=True):
            run("ip", "addr", "add", f"{address}/{cidr.prefixlen}", "dev", record.bridge,
                check=True)  # fmt: skip
        run("ip", "link", "set", record.bridge, "up", check=True)
        record.did("cgroups")
        _cgroup(record.cgroup_root, shares=POD_CPU_SHARES)

        pki = _write_pki(work / "pki", gateway=gateway, nodes=names, addresses=addresses)
        users = {
            "admin": ("npa-cluster-admin", "system:masters"),
            "scheduler": ("system:kube-scheduler", ""),
            **{f"kubelet-{name}": (f"system:node:{name}", "system:nodes") for name in names},
        }
        tokens = {name: secrets.token_hex(24) for name in users}
        token_file = work / "pki" / "tokens.csv"
        token_file.write_text(
            "".join(f'{tokens[k]},{user},{user},"{group}"\n' for k, (user, group) in users.items())
        )
        token_file.chmod(0o600)

        # --- netcheck: what SkyPilot's network check from a pod reaches -----------------
        netcheck_port = free_port_on(gateway)
        crt, key = _netcheck_cert(tools.images, work / "pki")
        start(
            ManagedProcess(
                name="netcheck",
                argv=[
                    sys.executable,
                    "-m",
                    "tests.harness.netcheck",
                    gateway,
                    str(netcheck_port),
                    str(crt),
                    str(key),
                ],
                log_path=logs / "netcheck.log",
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                ports=[netcheck_port],
            ),
            stack,
        )

        # --- etcd and the API server ----------------------------------------------------
        etcd_client, etcd_peer = free_port_on("127.0.0.1"), free_port_on("127.0.0.1")
        etcd = start(
            ManagedProcess(
                name="etcd",
                argv=[
                    str(tools.etcd),
                    "--name=npa-cluster",
                    f"--data-dir={work / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                    f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                    f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                    f"--initial-cluster=npa-cluster=http://127.0.0.1:{etcd_peer}",
                    "--unsafe-no-fsync",
                    "--quota-backend-bytes=2147483648",
                ],
                log_path=logs / "etcd.log",
                ports=[etcd_client, etcd_peer],
                env={"ETCD_UNSUPPORTED_ARCH": "amd64", "PATH": "/usr/bin:/bin"},
            ),
            stack,
        )
        etcd.wait_until(
            lambda: http_status(f"http://127.0.0.1:{etcd_client}/health") == 200, 30, "healthy"
        )
        api_port = free_port_on(gateway)
        server = f"https://{gateway}:{api_port}"
        apiserver = start(
            ManagedProcess(
                name="kube-apiserver",
                argv=[
                    str(tools.kube_apiserver),
                    f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                    f"--bind-address={gateway}",
                    f"--advertise-address={gateway}",
                    f"--secure-port={api_port}",
                    f"--cert-dir={work / 'apiserver-certs'}",
                    f"--tls-cert-file={pki['server.crt']}",
                    f"--tls-private-key-file={pki['server.key']}",
                    f"--client-ca-file={pki['ca.crt']}",
                    f"--token-auth-file={token_file}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    f"--kubelet-client-certificate={pki['apiserver-kubelet-client.crt']}",
                    f"--kubelet-client-key={pki['apiserver-kubelet-client.key']}",
                    f"--kubelet-certificate-authority={pki['ca.crt']}",
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    f"--service-account-issuer={server}",
                    f"--service-account-key-file={pki['sa.pub']}",
                    f"--service-account-signing-key-file={pki['sa.key']}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--allow-privileged=true",
                    "--v=1",
                ],
                log_path=logs / "kube-apiserver.log",
                ports=[api_port],
            ),
            stack,
        )
        kubeconfigs = work / "kubeconfigs"
        kubeconfigs.mkdir()
        admin = kubeconfigs / "admin"
        for name, (user, _) in users.items():
            _kubeconfig(
                kubeconfigs / name,
                server=server,
                ca=pki["ca.crt"],
                context=context,
                user=user,
                token=tokens[name],
            )
        ca_context = ssl.create_default_context(cafile=str(pki["ca.crt"]))

        def readyz() -> bool:
            req = urllib.request.Request(
                f"{server}/readyz", headers={"Authorization": f"Bearer {tokens['admin']}"}
            )
            with urllib.request.urlopen(req, timeout=5, context=ca_context) as resp:
                return int(resp.status) == 200

        _wait("API server /readyz", readyz, 120, [apiserver])

        # --- the cluster's DNS (Service names; the rest goes to the host's resolver) -------
        dns = start(
            ManagedProcess(
                name="cluster-dns",
                argv=[
                    sys.executable, "-m", "tests.harness.clusterdns", gateway, "53",
                    str(tools.kubectl), str(admin),
                ],
                log_path=logs / "cluster-dns.log",
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            ),
            stack,
        )  # fmt: skip
        dns.wait_until(lambda: "cluster DNS on" in dns.log_tail(5), 30, "listening")

        # --- controllers -----------------------------------------------------------------
        controllers = [start(
            ManagedProcess(
                name="kube-controller-manager",
                argv=[
                    str(tools.kube_controller_manager),
                    f"--kubeconfig={admin}",
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--use-service-account-credentials=false",
                    f"--service-account-private-key-file={pki['sa.key']}",
                    f"--root-ca-file={pki['ca.crt']}",
                    # Each node's pod range is the harness's choice (its CNI configuration
                    # is written before the node registers); it is set in the node's spec.
                    "--allocate-node-cidrs=false",
                    "--v=1",
                ],
                log_path=logs / "kube-controller-manager.log",
            ),
            stack,
        ), start(
            ManagedProcess(
                name="kube-scheduler",
                argv=[
                    str(tools.kube_scheduler),
                    f"--kubeconfig={kubeconfigs / 'scheduler'}",
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--v=1",
                ],
                log_path=logs / "kube-scheduler.log",
            ),
            stack,
        )]  # fmt: skip
        keeper = Keeper(record, controllers)
        stack.callback(keeper.stop)  # before the controllers are stopped at teardown

        # --- the registry and its images -------------------------------------------------
        reg_port = free_port_on("127.0.0.1")
        registry = f"127.0.0.1:{reg_port}"
        reg_config = work / "registry" / "config.yml"
        reg_config.parent.mkdir(parents=True)
        reg_config.write_text(
            json.dumps(
                {
                    "version": 0.1,
                    "log": {"level": "warn", "accesslog": {"disabled": True}},
                    "storage": {
                        "filesystem": {"rootdirectory": str(work / "registry" / "data")},
                        "delete": {"enabled": True},
                    },
                    "http": {"addr": registry, "secret": secrets.token_hex(16)},
                }
            )
        )
        reg = start(
            ManagedProcess(
                name="cluster-registry",
                argv=[str(tools.registry), "serve", str(reg_config)],
                log_path=logs / "registry.log",
                ports=[reg_port],
            ),
            stack,
        )
        reg.wait_until(lambda: http_status(f"http://{registry}/v2/") == 200, 30, "serving /v2/")
        images = push_images(tools, registry, logs / "skopeo.log")

        # --- the nodes: a containerd and a kubelet each ------------------------------------
        cluster = Cluster(
            cluster_id=cluster_id,
            context=context,
            node=names[0],
            nodes=names,
            kubeconfig=admin,
            gateway=gateway,
            subnet=str(network),
            pod_cidrs={name: str(cidr) for name, cidr in zip(names, pod_cidrs, strict=True)},
            registry=registry,
            images=images,
            workdir=work,
            tools=tools,
            processes=procs,
            record=record,
            keeper=keeper,
        )
        node_procs: list[ManagedProcess] = []
        for index, name in enumerate(names):
            place = NodePlace.of(index, work, rundir, record.cgroup_root)
            _cgroup(place.cgroup_root)
            socket = place.socket
            node_procs += _start_node(
                lambda proc: start(proc, stack), record, tools, node=name, place=place, pki=pki,
                kubeconfig=kubeconfigs / f"kubelet-{name}", address=addresses[index],
                pod_cidr=str(pod_cidrs[index]), gateway=gateway, registry=registry,
                images=images, logs=logs,
            )  # fmt: skip
            # Pods go away first at teardown, while the kubelets can still tear them down cleanly.
            stack.callback(teardown_mark, f"drained {name}")
            stack.callback(_drain, cluster, socket)

        # --- our own NAT: the kubernetes Service and SkyPilot's network check ------------
        record.did("iptables")
        nat = ("iptables", "-w", "-t", "nat")
        run(*nat, "-N", record.chain, check=True)
        run(
            *nat,
            "-A",
            record.chain,
            "-d",
            KUBERNETES_SERVICE_IP,
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            f"{gateway}:{api_port}",
            check=True,
        )
        for ip in NETCHECK_IPS:
            run(
                *nat,
                "-A",
                record.chain,
                "-d",
                ip,
                "-p",
                "tcp",
                "--dport",
                "443",
                "-j",
                "DNAT",
                "--to-destination",
                f"{gateway}:{netcheck_port}",
                check=True,
            )
        run(*nat, "-I", "PREROUTING", "-s", str(network), "-j", record.chain, check=True)
        # Pods reach pods of every node by their own addresses: the CNI plugin masquerades what
        # leaves a pod's own range, so traffic between the nodes' ranges is exempted first.
        unmasked = postrouting_chain(record)
        run(*nat, "-N", unmasked, check=True)
        run(*nat, "-A", unmasked, "-d", str(network), "-j", "ACCEPT", check=True)
        run(*nat, "-I", "POSTROUTING", "-s", str(network), "-j", unmasked, check=True)

        def node_ready(name: str) -> bool:
            got = cluster.kubectl("get", "node", name, "-o", "json", timeout=10)
            if got.returncode != 0:
                return False
            data = json.loads(got.stdout)
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in data["status"].get("conditions", [])
            )
            return ready and not data["spec"].get("taints")

        _wait("every node Ready and untainted", lambda: all(node_ready(n) for n in names),
              READY_TIMEOUT, node_procs)  # fmt: skip
        for name in names:  # what each node's CNI configuration allocates from, as its spec says
            own = cluster.pod_cidrs[name]
            spec = {"spec": {"podCIDR": own, "podCIDRs": [own]}}
            patched = cluster.kubectl("patch", "node", name, "--type=merge", "-p",
                                      json.dumps(spec), timeout=30)  # fmt: skip
            if patched.returncode != 0:
                raise RuntimeError(f"node {name}'s pod range not set: {patched.stderr}")
        advertise_gpus(cluster, cluster.node, NODE_GPUS[1])
        _wait("the first node's GPUs allocatable",
              lambda: node_gpus(cluster, cluster.node) == NODE_GPUS[1], READY_TIMEOUT,
              node_procs)  # fmt: skip
        yield cluster


# The GPUs the node advertises: no GPU is there, but the scheduler and the kubelet count these
# as they count a device plugin's (an extended resource in the node's status capacity, which the
# kubelet keeps and derives allocatable from), and SkyPilot and npa find them by the labels the
# NVIDIA GPU operator and SkyPilot write. Stage commands stay CPU commands.
NODE_GPUS = ("H100", 8)
GPU_RESOURCE = "nvidia.com/gpu"


def gpu_labels(count: int) -> dict[str, str]:
    """The labels of a node with ``count`` of :data:`NODE_GPUS`' GPUs, as the GPU operator's
    feature discovery and SkyPilot's labeller write them."""
    return {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": str(count),
        "skypilot.co/accelerator": NODE_GPUS[0].lower(),
    }


def advertise_gpus(cluster: Cluster, node: str, count: int) -> None:
    """``node`` advertises ``count`` GPUs, labelled; with 0, no GPU resource and no GPU label."""
    capacity = {GPU_RESOURCE: str(count) if count else None}  # null: merge patch removes it
    patch = json.dumps({"status": {"capacity": capacity}})
    done = cluster.kubectl("patch", "node", node, "--subresource=status",
                           "--type=merge", "-p", patch)  # fmt: skip
    assert done.returncode == 0, done.stderr
    labels = gpu_labels(count)
    changes = [f"{k}={v}" for k, v in labels.items()] if count else [f"{k}-" for k in labels]
    done = cluster.kubectl("label", "node", node, "--overwrite", *changes)
    assert done.returncode == 0, done.stderr


def node_gpus(cluster: Cluster, node: str) -> int | None:
    """The node's allocatable GPUs as the API server has them (None: no answer)."""
    got = cluster.kubectl("get", "node", node, "-o", "json", timeout=10)
    if got.returncode != 0:
        return None
    allocatable = json.loads(got.stdout)["status"].get("allocatable", {})
    return int(allocatable.get(GPU_RESOURCE, "0"))


@contextlib.contextmanager
def gpus_per_node(cluster: Cluster, counts: dict[str, int]) -> Iterator[None]:
    """Inside the block each node in ``counts`` advertises that many GPUs (allocatable before
    the block starts); after it, the cluster's usual GPUs: the first node's, no other's."""
    usual = {name: NODE_GPUS[1] if name == cluster.node else 0 for name in cluster.nodes}

    def apply(wanted: dict[str, int]) -> None:
        for name, count in wanted.items():
            advertise_gpus(cluster, name, count)
        deadline = time.monotonic() + READY_TIMEOUT
        while any(node_gpus(cluster, n) != c for n, c in wanted.items()):
            assert time.monotonic() < deadline, f"GPUs not allocatable as asked: {wanted}"
            time.sleep(0.5)

    apply(counts)
    try:
        yield
    finally:
        apply(usual)


def push_images(tools: ClusterTools, registry: str, log: Path) -> dict[str, str]:
    """Copy the built images into the registry, digests unchanged; tag -> pinned reference."""
    layout = tools.images / "oci"
    digests = dict(
        line.split() for line in (tools.images / "images.txt").read_text().splitlines() if line
    )
    refs = {}
    with open(log, "ab") as out:
        for tag in IMAGE_TAGS:
            subprocess.run(
                [
                    str(tools.skopeo),
                    "copy",
                    "--quiet",
                    "--preserve-digests",
                    "--dest-tls-verify=false",
                    f"oci:{layout}:{tag}",
                    f"docker://{registry}/npa/{tag}:1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
            )
            refs[tag] = f"{registry}/npa/{tag}@{digests[tag]}"
    return refs


def pull_images(socket: Path, hosts: Path, images: dict[str, str], log: Path) -> None:
    """Put every image into the node's image store now, as a node's usual images are: a cold
    pull of the runtime image takes minutes on a busy host, longer than a capability probe (or
    a test) should wait for a pod to start. Pods still ask the registry for each image's
    manifest (SkyPilot's pods pull Always); the layers are there."""
    with open(log, "ab") as out:
        for ref in images.values():
            subprocess.run(
                ["ctr", "-a", str(socket), "-n", "k8s.io", "images", "pull", "--plain-http",
                 "--hosts-dir", str(hosts), ref],
                stdout=out, stderr=subprocess.STDOUT, check=True, timeout=900,
            )  # fmt: skip


def tools_from_env() -> ClusterTools | str:
    """The binaries named by the tools environment; a message naming what is missing."""
    from tests.harness.tools import find_tool

    wanted = {
        "etcd": ("NPA_ETCD_BIN", "etcd"),
        "kube_apiserver": ("NPA_KUBE_APISERVER_BIN", "kube-apiserver"),
        "kube_controller_manager": ("NPA_KUBE_CONTROLLER_MANAGER_BIN", "kube-controller-manager"),
        "kube_scheduler": ("NPA_KUBE_SCHEDULER_BIN", "kube-scheduler"),
        "kubelet": ("NPA_KUBELET_BIN", "kubelet"),
        "kubectl": ("NPA_KUBECTL_BIN", "kubectl"),
        "containerd": ("NPA_CONTAINERD_BIN", "containerd"),
        "registry": ("NPA_REGISTRY_BIN", "docker-registry"),
        "skopeo": ("NPA_SKOPEO_BIN", "skopeo"),
    }
    found: dict[str, Any] = {}
    missing = []
    for attr, (env, name) in wanted.items():
        tool = find_tool(env, name)
        if tool is None:
            missing.append(name)
        found[attr] = tool
    cni = Path(os.environ.get("NPA_CNI_BIN_DIR", "/usr/lib/cni"))
    if not (cni / "bridge").exists():
        missing.append(f"the CNI plugins ({cni})")
    images = os.environ.get("NPA_CLUSTER_IMAGES")
    if not images or not (Path(images) / "images.txt").exists():
        missing.append("the cluster images (NPA_CLUSTER_IMAGES)")
    for needed in ("ctr", "runc", "iptables", "ip"):
        if shutil.which(needed) is None:
            missing.append(needed)
    if missing:
        return ", ".join(missing)
    return ClusterTools(cni_dir=cni, images=Path(str(images)), **found)


def main(argv: list[str]) -> int:
    """``python -m tests.harness.cluster up WORKDIR``: run a cluster until interrupted, printing
    what a shell needs to use it (for ``make demo-cluster`` and for debugging)."""
    if len(argv) != 2 or argv[0] != "up":
        sys.stderr.write("usage: python -m tests.harness.cluster up WORKDIR\n")
        return 2
    tools = tools_from_env()
    if isinstance(tools, str):
        sys.stderr.write(f"missing: {tools}; run scripts/bootstrap-tools, then source env.sh\n")
        return 6
    started = time.monotonic()
    stop = {"now": False}

    def request_stop(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with pod_cluster(tools, Path(argv[1])) as cluster:
        info = {
            "context": cluster.context,
            "kubeconfig": str(cluster.kubeconfig),
            "gateway": cluster.gateway,
            "registry": cluster.registry,
            "images": cluster.images,
            "started_seconds": round(time.monotonic() - started, 1),
        }
        (Path(argv[1]) / "cluster.json").write_text(json.dumps(info, indent=1))
        print(json.dumps(info), flush=True)
        while not stop["now"] and all(pid_alive(p.pid) for p in cluster.processes):
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
