"""An HTTP proxy in front of moto's S3 server that counts requests, can refuse every write,
can answer every request with a server error, or can refuse conditional writes: a store that
provably receives no write, one that cannot be verified, or one without If-None-Match.

Rules act on chosen requests, so a test can stop a client at an exact point of its work: a
``hold`` rule keeps the matching request unanswered (the client waits in it, never written)
until the test releases it, and sets ``hit`` so the test knows the client got there; a ``fail``
rule answers it 500. ``hang`` leaves every request unanswered: a store that stopped answering."""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

WRITES = frozenset({"PUT", "POST", "DELETE"})


@dataclass
class Rule:
    """Act on the requests of ``method`` whose path holds ``contains``, after letting ``skip``
    of them through."""

    method: str
    contains: str
    action: Literal["hold", "fail"]
    skip: int = 0
    seen: int = 0
    hit: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, path: str) -> bool:
        if method != self.method or self.contains not in path:
            return False
        self.seen += 1
        return self.seen > self.skip


@dataclass
class ProxyState:
    upstream: str
    refuse_writes: bool = False
    fail_everything: bool = False
    drop_connections: bool = False  # hang up without answering, like a stopped server
    refuse_conditional: bool = False  # 501 to If-None-Match PUTs, as some S3-compatibles do
    hang: bool = False  # accept, never answer: a store that stopped answering
    conditional_puts: int = 0
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    writes: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every request: "METHOD /path?query"
    rules: list[Rule] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rule(
        self, method: str, contains: str, action: Literal["hold", "fail"], skip: int = 0
    ) -> Rule:
        """Add a rule (see the module docstring); returns it, so a test can wait on ``hit``."""
        made = Rule(method, contains, action, skip)
        with self.lock:
            self.rules.append(made)
        return made

    def clear(self) -> None:
        """Drop every rule and let every held request go (unanswered: its client is gone)."""
        with self.lock:
            self.rules.clear()
        self.released.set()
        self.released = threading.Event()


def _handler(state: ProxyState) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _error(self, status: int, code: str) -> None:
            body = f"<?xml version='1.0'?><Error><Code>{code}</Code></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self) -> None:
            state.counts[self.command] += 1
            state.requests.append(f"{self.command} {self.path}")
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else None
            with state.lock:
                rule = next((r for r in state.rules if r.matches(self.command, self.path)), None)
            if state.hang or (rule is not None and rule.action == "hold"):
                released = state.released
                if rule is not None:
                    rule.hit.set()
                released.wait()
                self.close_connection = True
                self.connection.close()
                return
            if rule is not None:
                rule.hit.set()
                self._error(500, "InternalError")
                return
            if state.drop_connections:
                self.close_connection = True
                self.connection.close()
                return
            if state.fail_everything:
                self._error(500, "InternalError")
                return
            if (
                state.refuse_conditional
                and self.command == "PUT"
                and ("If-None-Match" in self.headers)
            ):
                state.conditional_puts += 1
                self._error(501, "NotImplemented")
                return
            if self.command in WRITES:
                state.writes.append(f"{self.command} {self.path}")
                if state.refuse_writes:
                    self._error(403, "AccessDenied")
                    return
            up = urlparse(state.upstream)
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request(self.command, self.path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "date",
                                     "server"):  # fmt: skip
                    self.send_header(k, v)
            # A HEAD answer has no body but the object's length, which must pass through.
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            conn.close()

        do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    # socketserver's default backlog is 5: a client opening several connections at once on a
    # busy machine had its SYNs dropped and gave up connecting after 1 s, which no real store
    # does. A real server listens with a backlog in the hundreds.
    request_queue_size = 128
    daemon_threads = True


@contextlib.contextmanager
def store_proxy(upstream: str, host: str = "127.0.0.1") -> Iterator[tuple[str, ProxyState]]:
    """``(endpoint_url, state)`` of a proxy to ``upstream`` listening on ``host`` (a test
    cluster's gateway, for pods), stopped on exit."""
    state = ProxyState(upstream=upstream)
    server = _Server((host, 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", state
    finally:
        state.hang = False
        state.clear()
        server.shutdown()
        server.server_close()
