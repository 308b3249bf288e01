"""An API server that is ready and cannot serve: a plain-HTTP front for the harness's
kube-apiserver that passes the health endpoints through to it (``/readyz``, ``/livez``,
``/healthz``, over TLS with the caller's token) and answers every other request 503 with a
Kubernetes ``Status``, the way an API server whose storage or aggregated APIs are failing does."""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.harness.kube import KubeCluster

HEALTH = ("/readyz", "/livez", "/healthz")


def _status_503() -> bytes:
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
        "reason": "ServiceUnavailable",
        "message": "the server is currently unable to handle the request",
    }).encode()  # fmt: skip


@contextlib.contextmanager
def ready_but_failing(kube: KubeCluster, kubeconfig: Path, context: str) -> Iterator[list[str]]:
    """Write ``kubeconfig`` (one context, ``context``) pointing at the front; yields the paths
    requested of it, in order."""
    tls = ssl.create_default_context(cafile=str(kube.ca_file))
    seen: list[str] = []

    class Front(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            seen.append(self.path)
            if self.path.split("?")[0] in HEALTH:
                headers = {"Authorization": self.headers.get("Authorization", "")}
                request = urllib.request.Request(kube.server + self.path, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=10, context=tls) as answer:
                        code, body = answer.status, answer.read()
                except urllib.error.HTTPError as exc:
                    code, body = exc.code, exc.read()
                self._send(code, body, "text/plain")
                return
            self._send(503, _status_503(), "application/json")

        do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "front", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
            "users": [{"name": "u", "user": {"token": kube.token}}],
            "contexts": [{"name": context, "context": {"cluster": "front", "user": "u"}}],
        }))  # fmt: skip
        kubeconfig.chmod(0o600)
        yield seen
    finally:
        server.shutdown()
        server.server_close()
