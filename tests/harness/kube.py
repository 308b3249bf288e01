"""A real Kubernetes API: etcd + kube-apiserver on loopback, envtest style.

There is no scheduler, controller-manager or kubelet: tests play those parts by writing Node
and Pod status through the API, exactly as those components would.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import secrets
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.procs import ManagedProcess, free_port, http_status, running

ADMIN_USER = "npa-test-admin"


def _write_pki(pki: Path) -> dict[str, Path]:
    """A CA, a serving certificate for 127.0.0.1/localhost, and a service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def pem_key(key: Any) -> bytes:
        return bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "npa-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    files = {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "server.crt": srv_cert.public_bytes(serialization.Encoding.PEM),
        "server.key": pem_key(srv_key),
        "sa.key": pem_key(sa_key),
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


@dataclass
class KubeCluster:
    """A running API server and what a client needs to reach it."""

    server: str
    kubeconfig: Path
    context: str
    ca_file: Path
    token: str
    etcd: ManagedProcess
    apiserver: ManagedProcess

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig), context=self.context)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def readyz(self) -> int:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        import urllib.request

        req = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    # --- playing the kubelet / node controller ---------------------------------------------
    def create_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        gpus: int = 0,
        gpu_resource: str = "nvidia.com/gpu",
        cpu: str = "8",
        memory: str = "32Gi",
        ready: bool = True,
    ) -> Any:
        """Create a Node and set its status (capacity, allocatable, Ready) as a kubelet would."""
        from kubernetes import client

        core = self.core()
        core.create_node(
            client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels or {}))
        )
        resources = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            resources[gpu_resource] = str(gpus)
        status = {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "KubeletReady" if ready else "KubeletNotReady",
                        "message": "set by the npa test harness",
                    }
                ],
            }
        }
        return core.patch_node_status(name, status)

    def set_pod_status(
        self,
        namespace: str,
        name: str,
        *,
        phase: str = "Pending",
        waiting_reason: str | None = None,
        waiting_message: str = "",
        unschedulable_message: str | None = None,
        exit_code: int | None = None,
    ) -> Any:
        """Write a Pod's status as the scheduler (Unschedulable) or a kubelet would."""
        core = self.core()
        pod = core.read_namespaced_pod(name, namespace)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status: dict[str, Any] = {"phase": phase}
        if unschedulable_message is not None:
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": unschedulable_message,
                    "lastTransitionTime": now,
                }
            ]
        containers = []
        for c in pod.spec.containers:
            entry: dict[str, Any] = {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
            }
            if waiting_reason:
                entry["state"] = {"waiting": {"reason": waiting_reason, "message": waiting_message}}
            elif exit_code is not None:
                entry["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if exit_code == 0 else "Error",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                }
            containers.append(entry)
        if waiting_reason or exit_code is not None:
            status["containerStatuses"] = containers
        return core.patch_namespaced_pod_status(name, namespace, {"status": status})


@contextlib.contextmanager
def kube_cluster(etcd_bin: Path, apiserver_bin: Path, workdir: Path) -> Iterator[KubeCluster]:
    workdir.mkdir(parents=True, exist_ok=True)
    pki = _write_pki(workdir / "pki")
    token = secrets.token_hex(24)
    tokens = workdir / "tokens.csv"
    # token,user,uid,"group1,group2": system:masters passes every RBAC check.
    tokens.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    tokens.chmod(0o600)

    etcd_client, etcd_peer, api_port = free_port(), free_port(), free_port()
    etcd = ManagedProcess(
        name="etcd",
        argv=[
            str(etcd_bin),
            "--name=npa-test",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=npa-test=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync",
            "--quota-backend-bytes=2147483648",
        ],
        log_path=workdir / "etcd.log",
        ports=[etcd_client, etcd_peer],
        # Debian's etcd 3.4 refuses to start on unsupported arches without this; harmless elsewhere.
        env={"ETCD_UNSUPPORTED_ARCH": "amd64", "PATH": "/usr/bin:/bin"},
    )
    server = f"https://127.0.0.1:{api_port}"
    apiserver = ManagedProcess(
        name="kube-apiserver",
        argv=[
            str(apiserver_bin),
            f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={workdir / 'certs'}",
            f"--tls-cert-file={pki['server.crt']}",
            f"--tls-private-key-file={pki['server.key']}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={server}",
            f"--service-account-key-file={pki['sa.pub']}",
            f"--service-account-signing-key-file={pki['sa.key']}",
            "--service-cluster-ip-range=10.0.0.0/24",
            # No controller-manager creates the default ServiceAccount; admit pods without it.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--v=1",
        ],
        log_path=workdir / "kube-apiserver.log",
        ports=[api_port],
    )
    kubeconfig = workdir / "kubeconfig"
    context = "npa-test"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": context,
                        "cluster": {"server": server, "certificate-authority": str(pki["ca.crt"])},
                    }
                ],
                "users": [{"name": ADMIN_USER, "user": {"token": token}}],
                "contexts": [
                    {"name": context, "context": {"cluster": context, "user": ADMIN_USER}}
                ],
                "current-context": context,
            }
        )
    )
    kubeconfig.chmod(0o600)
    with running(etcd):
        etcd.wait_until(
            lambda: http_status(f"http://127.0.0.1:{etcd_client}/health") == 200, 30, "healthy"
        )
        with running(apiserver):
            cluster = KubeCluster(
                server=server,
                kubeconfig=kubeconfig,
                context=context,
                ca_file=pki["ca.crt"],
                token=token,
                etcd=etcd,
                apiserver=apiserver,
            )
            apiserver.wait_until(lambda: cluster.readyz() == 200, 90, "ready (/readyz)")
            # The default namespace is created by a post-start hook shortly after readyz.
            apiserver.wait_until(
                lambda: cluster.core().read_namespace("default") is not None,
                30,
                "serving namespaces",
            )
            yield cluster
