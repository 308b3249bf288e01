"""A token-auth front for the test registry: the Bearer flow, 403 and 500 answers on demand.

The distribution registry fixture only speaks Basic auth. This threaded HTTP server stands in
front of it on a free loopback port and behaves like a registry behind a token service:

- ``/token``: the token service. Basic credentials, when sent, must be the proxy's own; without
  them it hands out an anonymous token.
  ``POST /token`` with ``grant_type=refresh_token`` exchanges :data:`REFRESH_TOKEN` (an
  identity token, as docker and credential helpers hold them) for a user token.
- ``/v2/...``: needs ``Authorization: Bearer <token>``; without it answers 401 with a
  ``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` challenge. Anonymous tokens may
  pull only repositories listed in ``public``. Repositories in ``denied`` answer 403 DENIED,
  in ``broken`` 500. Answers queued in ``later`` (status and headers, e.g. 429 with
  ``Retry-After``) are given first, one per request, as a rate-limited registry would. Every
  other request is forwarded to the real registry with its credentials. ``hits`` records when
  each authorised ``/v2/`` request arrived and what it was answered.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import requests

from tests.harness.registry import Registry

PROXY_USER = "token-user"
PROXY_PASSWORD = "token-proxy-secret-value-7f3a"
REFRESH_TOKEN = "npa-test-identity-token-5c1e"
SERVICE = "npa-test-registry"


@dataclass
class TokenProxy:
    upstream: Registry
    public: set[str] = field(default_factory=set)
    denied: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)
    tokens: dict[str, str] = field(default_factory=dict)  # token -> "user" | "anonymous"
    token_requests: list[dict[str, str]] = field(default_factory=list)
    host: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    delay: float = 0.0  # seconds added to every answer, to stand in for a distant registry
    later: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    hits: list[tuple[float, str, int]] = field(default_factory=list)  # (monotonic, method, code)

    @property
    def realm(self) -> str:
        return f"http://{self.host}/token"


def _refusal(
    proxy: TokenProxy, command: str, name: str, auth: str
) -> tuple[int, str | None, dict[str, str]] | None:
    """What a ``/v2/`` request for repository ``name`` is answered instead of the registry's
    answer (status, error code or None for a bare 500, headers); None to forward it."""
    challenge = f'Bearer realm="{proxy.realm}",service="{SERVICE}",scope="repository:{name}:pull"'
    bearer = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
    who = proxy.tokens.get(bearer)
    if who is None or (who == "anonymous" and name not in proxy.public):
        return 401, "UNAUTHORIZED", {"WWW-Authenticate": challenge}
    if name in proxy.denied:
        return 403, "DENIED", {}
    if name in proxy.broken:
        return 500, None, {}
    with proxy.lock:
        queued = proxy.later.pop(0) if proxy.later else None
        proxy.hits.append((time.monotonic(), command, queued[0] if queued else 200))
    if queued is not None:
        return queued[0], "TOOMANYREQUESTS", queued[1]
    return None


def _exchange(proxy: TokenProxy, form: dict[str, str]) -> tuple[int, str | None]:
    """``POST /token``: a refresh (identity) token for a user token (status, token or None)."""
    with proxy.lock:
        proxy.token_requests.append(form)
    if form.get("grant_type") != "refresh_token":
        return 400, None
    if form.get("refresh_token") != REFRESH_TOKEN:
        return 401, None
    token = secrets.token_hex(16)
    with proxy.lock:
        proxy.tokens[token] = "user"
    return 200, token


def _handler(proxy: TokenProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _reply(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, code: int, err: str, extra: dict[str, str] | None = None) -> None:
            body = json.dumps({"errors": [{"code": err, "message": err.lower()}]}).encode()
            self._reply(code, body, {"Content-Type": "application/json", **(extra or {})})

        def do_GET(self) -> None:
            time.sleep(proxy.delay)
            url = urlparse(self.path)
            if url.path == "/token":
                return self._token(url.query)
            return self._registry(url.path)

        def do_POST(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if url.path != "/token":
                return self._error(400, "UNSUPPORTED")
            code, token = _exchange(proxy, form)
            if token is None:
                return self._error(code, "UNSUPPORTED" if code == 400 else "UNAUTHORIZED")
            body = json.dumps({"access_token": token, "expires_in": 300}).encode()
            self._reply(200, body, {"Content-Type": "application/json"})

        def do_HEAD(self) -> None:
            time.sleep(proxy.delay)
            self._registry(urlparse(self.path).path)

        def _token(self, query: str) -> None:
            params = {k: v[0] for k, v in parse_qs(query).items()}
            with proxy.lock:
                proxy.token_requests.append(params)
            auth = self.headers.get("Authorization", "")
            who = "anonymous"
            if auth:
                expected = base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()
                if auth != f"Basic {expected}":
                    return self._error(401, "UNAUTHORIZED")
                who = "user"
            token = secrets.token_hex(16)
            with proxy.lock:
                proxy.tokens[token] = who
            body = json.dumps({"token": token, "expires_in": 300}).encode()
            self._reply(200, body, {"Content-Type": "application/json"})

        def _registry(self, path: str) -> None:
            match = re.match(r"^/v2/(?P<name>.+?)/(manifests|blobs|tags)/", path)
            name = match.group("name") if match else ""
            refused = _refusal(proxy, self.command, name, self.headers.get("Authorization", ""))
            if refused is not None:
                code, err, extra = refused
                if err is None:
                    return self._reply(code, b"internal error")
                return self._error(code, err, extra)
            headers = {"Accept": self.headers.get("Accept", "*/*")}
            resp = requests.request(
                self.command,
                proxy.upstream.url + path,
                headers=headers,
                auth=proxy.upstream.auth,
                timeout=30,
            )
            keep = ("Content-Type", "Docker-Content-Digest")
            out = {k: resp.headers[k] for k in keep if k in resp.headers}
            if self.command == "HEAD":
                self.send_response(resp.status_code)
                for k, v in out.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", resp.headers.get("Content-Length", "0"))
                self.end_headers()
                return
            self._reply(resp.status_code, resp.content, out)

    return Handler


@contextmanager
def token_proxy(
    upstream: Registry, *, delay: float = 0.0, **sets: set[str]
) -> Iterator[TokenProxy]:
    proxy = TokenProxy(upstream, delay=delay, **sets)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.host = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
