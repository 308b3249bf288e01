"""The test cluster's DNS (tests/harness/clusterdns.py), over real UDP: queries are built here
byte by byte as RFC 1035 lays them out, not with the server's own helpers."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness import clusterdns

LISTING = {
    "items": [
        {"kind": "Service", "metadata": {"name": "job-head", "namespace": "npa-e2e"},
         "spec": {"clusterIP": "None"}},
        {"kind": "EndpointSlice", "addressType": "IPv4",
         "metadata": {"namespace": "npa-e2e", "labels": {"kubernetes.io/service-name": "job-head"}},
         "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": True}},
                       {"addresses": ["10.1.0.9"], "conditions": {"ready": False}}]},
        {"kind": "Service", "metadata": {"name": "job-head-ssh", "namespace": "npa-e2e"},
         "spec": {"clusterIP": "10.96.0.7"}},
        {"kind": "Service", "metadata": {"name": "lonely", "namespace": "npa-e2e"},
         "spec": {"clusterIP": "None"}},
    ]
}  # fmt: skip


def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def addresses(reply: bytes) -> tuple[int, int, list[str]]:
    """(id, rcode, the A records' addresses) of a reply to one question."""
    ident, flags, _qd, count = struct.unpack("!HHHH", reply[:8])
    at = 12
    while reply[at]:
        at += 1 + reply[at]
    at += 5
    found = []
    for _ in range(count):
        _name, rtype, _cls, _ttl, size = struct.unpack("!HHHIH", reply[at : at + 12])
        assert rtype == 1 and size == 4
        found.append(socket.inet_ntoa(reply[at + 12 : at + 16]))
        at += 12 + size
    return ident, flags & 0xF, found


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    kubectl = tmp_path / "kubectl"
    (tmp_path / "listing.json").write_text(json.dumps(LISTING))
    kubectl.write_text(f"#!/bin/sh\ncat {tmp_path / 'listing.json'}\n")
    kubectl.chmod(0o755)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    names = clusterdns.Names(str(kubectl), "unused")
    threading.Thread(target=clusterdns.serve, args=("127.0.0.1", port, names), daemon=True).start()
    yield "127.0.0.1", port


def ask(server: tuple[str, int], packet: bytes) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        for _ in range(50):  # the server thread may not be bound yet
            s.sendto(packet, server)
            try:
                return s.recvfrom(4096)[0]
            except TimeoutError:
                continue
    raise AssertionError("no answer")


def test_a_headless_service_resolves_to_its_ready_endpoints(server: tuple[str, int]) -> None:
    reply = ask(server, query("job-head.npa-e2e.svc.cluster.local", ident=77))
    assert addresses(reply) == (77, 0, ["10.1.0.5"])
    assert reply[2] & 0x80 and reply[2] & 0x04  # a response, authoritative


def test_a_cluster_ip_service_resolves_to_its_address(server: tuple[str, int]) -> None:
    assert addresses(ask(server, query("Job-Head-SSH.npa-e2e.svc.cluster.local")))[1:] == (
        0,
        ["10.96.0.7"],
    )


def test_unknown_names_are_nxdomain_and_other_types_have_no_data(
    server: tuple[str, int],
) -> None:
    assert addresses(ask(server, query("nope.npa-e2e.svc.cluster.local")))[1:] == (3, [])
    assert addresses(ask(server, query("job-head.npa-e2e.svc.cluster.local", 28)))[1:] == (0, [])
    assert addresses(ask(server, query("lonely.npa-e2e.svc.cluster.local")))[1:] == (0, [])


def test_other_names_go_to_the_upstream_resolver_as_they_came() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
        upstream.bind(("127.0.0.1", 0))
        seen: list[bytes] = []

        def echo() -> None:
            packet, client = upstream.recvfrom(4096)
            seen.append(packet)
            upstream.sendto(b"upstream:" + packet, client)

        threading.Thread(target=echo, daemon=True).start()
        packet = query("example.org")
        out = clusterdns.respond(packet, clusterdns.Names("false", "x"), upstream.getsockname())
    assert seen == [packet] and out == b"upstream:" + packet


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_datagram_gets_a_reply_or_is_dropped_never_an_exception(packet: bytes) -> None:
    names = clusterdns.Names("false", "x")  # kubectl that fails: no names known
    question = clusterdns.parse_question(packet)
    if question is not None and not question[0].endswith("cluster.local"):
        return  # would be forwarded: covered above
    out = clusterdns.respond(packet, names, ("127.0.0.1", 9))
    if len(packet) < 12:
        assert out is None
    else:
        assert out is not None and out[:2] == packet[:2] and out[2] & 0x80
