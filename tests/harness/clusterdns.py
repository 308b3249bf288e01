"""The test cluster's DNS: Service names under ``cluster.local`` for its pods.

A pod of a multi-node SkyPilot task reaches its head by the name of the head's headless Service
(``<service>.<namespace>.svc.cluster.local``): Ray on a worker is started with that address.
A cluster without DNS leaves that name unresolved and the task STARTING for ever. This server
is the small part of a cluster DNS the harness needs, run by the kubelet's ``clusterDNS`` on
the cluster's gateway, port 53:

- ``A`` queries for ``<service>.<namespace>.svc.cluster.local``: the addresses of the
  Service's EndpointSlices (a headless Service), else its cluster IP; any other name under
  ``cluster.local`` is NXDOMAIN, and a known name asked for another type has no data;
- every other query is passed, as it came, to the host's own resolver.

The Services and EndpointSlices are read with kubectl (the admin kubeconfig), at most every half
second and only when a cluster name is asked.

``python -m tests.harness.clusterdns ADDRESS PORT KUBECTL KUBECONFIG``
"""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

DOMAIN = "cluster.local"
TTL = 5
_A, _ANY, _IN = 1, 255, 1
_NOERROR, _SERVFAIL, _NXDOMAIN = 0, 2, 3


def parse_question(packet: bytes) -> tuple[str, int, int] | None:
    """(name, type, end of the question) of a query with one question; None otherwise."""
    if len(packet) < 12 or struct.unpack("!H", packet[4:6])[0] != 1:
        return None
    labels, at = [], 12
    while at < len(packet):
        size = packet[at]
        if size == 0:
            at += 1
            break
        if size & 0xC0 or at + 1 + size > len(packet):  # no compression in a question
            return None
        labels.append(packet[at + 1 : at + 1 + size].decode("ascii", "replace"))
        at += 1 + size
    else:
        return None
    if at + 4 > len(packet):
        return None
    qtype = struct.unpack("!H", packet[at : at + 2])[0]
    return ".".join(labels).lower().rstrip("."), qtype, at + 4


def answer(packet: bytes, end: int, rcode: int, addresses: list[str]) -> bytes:
    """The response to ``packet`` (its question ends at ``end``): authoritative, these A
    records (the name as a pointer to the question's)."""
    ident, flags = struct.unpack("!HH", packet[:4])
    flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | rcode  # QR, opcode+RD, AA, RA
    head = struct.pack("!HHHHHH", ident, flags, 1, len(addresses), 0, 0)
    records = b"".join(
        struct.pack("!HHHIH", 0xC00C, _A, _IN, TTL, 4) + ipaddress.IPv4Address(a).packed
        for a in addresses
    )
    return head + packet[12:end] + records


def failure(packet: bytes, rcode: int) -> bytes:
    ident, flags = struct.unpack("!HH", packet[:4])
    return struct.pack("!HHHHHH", ident, 0x8000 | (flags & 0x7900) | 0x0080 | rcode, 0, 0, 0, 0)


def names_of(listing: dict) -> dict[str, list[str]]:  # type: ignore[type-arg]
    """``<service>.<namespace>.svc.cluster.local`` -> its addresses, from a ``kubectl get
    services,endpointslices -A -o json`` listing."""
    endpoints: dict[str, list[str]] = {}
    cluster_ips: dict[str, list[str]] = {}
    for item in listing.get("items", []):
        meta = item.get("metadata", {})
        namespace = meta.get("namespace", "")
        if item.get("kind") == "EndpointSlice" and item.get("addressType") == "IPv4":
            service = meta.get("labels", {}).get("kubernetes.io/service-name")
            if not service:
                continue
            name = f"{service}.{namespace}.svc.{DOMAIN}"
            for endpoint in item.get("endpoints") or []:
                if endpoint.get("conditions", {}).get("ready") is False:
                    continue
                endpoints.setdefault(name, []).extend(endpoint.get("addresses", []))
        elif item.get("kind") == "Service":
            name = f"{meta.get('name')}.{namespace}.svc.{DOMAIN}"
            ip = item.get("spec", {}).get("clusterIP")
            cluster_ips[name] = [] if ip in (None, "", "None") else [ip]
    return {name: sorted(set(endpoints.get(name, []))) or ips for name, ips in cluster_ips.items()}


class Names:
    """The cluster's Service names, read again when asked after the last read is stale."""

    def __init__(self, kubectl: str, kubeconfig: str) -> None:
        self.argv = [kubectl, "--kubeconfig", kubeconfig, "get", "services,endpointslices",
                     "-A", "-o", "json"]  # fmt: skip
        self.known: dict[str, list[str]] = {}
        self.read_at = 0.0
        self.lock = threading.Lock()

    def lookup(self, name: str) -> list[str] | None:
        with self.lock:
            if time.monotonic() - self.read_at > 0.5:
                done = subprocess.run(self.argv, capture_output=True, text=True, timeout=10)
                if done.returncode == 0:
                    self.known = names_of(json.loads(done.stdout))
                    self.read_at = time.monotonic()
            return self.known.get(name)


def upstream() -> tuple[str, int]:
    """The host's first resolver."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            return parts[1], 53
    return "127.0.0.1", 53


def forward(packet: bytes, server: tuple[str, int]) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(packet, server)
        try:
            return s.recvfrom(4096)[0]
        except OSError:
            return failure(packet, _SERVFAIL)


def respond(packet: bytes, names: Names, resolver: tuple[str, int]) -> bytes | None:
    question = parse_question(packet)
    if question is None:
        return failure(packet, _SERVFAIL) if len(packet) >= 12 else None
    name, qtype, end = question
    if not (name == DOMAIN or name.endswith("." + DOMAIN)):
        return forward(packet, resolver)
    addresses = names.lookup(name)
    if addresses is None:
        return answer(packet, end, _NXDOMAIN, [])
    return answer(packet, end, _NOERROR, addresses if qtype in (_A, _ANY) else [])


def serve(address: str, port: int, names: Names) -> None:
    resolver = upstream()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, port))
        print(f"cluster DNS on {address}:{port}, others to {resolver[0]}", flush=True)
        while True:
            packet, client = s.recvfrom(4096)

            def reply(packet: bytes = packet, client: tuple[str, int] = client) -> None:
                try:
                    out = respond(packet, names, resolver)
                except Exception as exc:  # one bad query never stops the server
                    print(f"query from {client}: {type(exc).__name__}: {exc}", flush=True)
                    out = failure(packet, _SERVFAIL) if len(packet) >= 12 else None
                if out is not None:
                    s.sendto(out, client)

            threading.Thread(target=reply, daemon=True).start()


def main(argv: list[str]) -> int:
    address, port, kubectl, kubeconfig = argv
    serve(address, int(port), Names(kubectl, kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
