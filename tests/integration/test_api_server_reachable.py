"""How npa tells a SkyPilot API server that is down from one that is busy, on real sockets:
a refused connection is "down" at once; a server slow to answer is waited for, within a bound,
so a busy server is not reported down."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from npa.adapters.skypilot.api import server_reachable

pytestmark = pytest.mark.integration


def serve(delay: float) -> Iterator[str]:
    """A health endpoint that answers each request after ``delay`` seconds."""

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def slow_server() -> Iterator[str]:
    yield from serve(4.0)


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """Accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_a_server_slower_than_one_try_is_reachable(slow_server: str) -> None:
    started = time.monotonic()
    # Slower than the 3 s npa gave a server before: busy is not down.
    assert server_reachable(slow_server)
    assert time.monotonic() - started < 10


def test_a_refused_port_is_unreachable_at_once() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # bound, never listened: the port refuses
    started = time.monotonic()
    assert not server_reachable(f"http://127.0.0.1:{port}", timeout=30)
    assert time.monotonic() - started < 2


def test_a_server_that_never_answers_is_unreachable_once_patience_runs_out(
    silent_listener: str,
) -> None:
    started = time.monotonic()
    assert not server_reachable(silent_listener, timeout=2)
    spent = time.monotonic() - started
    assert 2 <= spent < 6, spent
