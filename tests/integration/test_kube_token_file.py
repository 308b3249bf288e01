"""A kubeconfig user's ``tokenFile`` is read as kubectl reads it: client-go trims the
whitespace around the token (``strings.TrimSpace``), so a file that ends in a newline works.
A loopback HTTP server that answers only the exact bearer token shows every request carries the
trimmed token; the real kube-apiserver, beside kubectl, shows the convention is kubectl's."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cli import run_npa
from tests.harness.kube import KubeCluster

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
EMPTY = {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []}


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[str | None]]]:
    """An API server that lists no nodes and no pods to the bearer of TOKEN, and 401 to
    anyone else; yields its URL and the Authorization headers it was sent."""
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            header = self.headers.get("Authorization")
            seen.append(header)
            ok = header == f"Bearer {TOKEN}"
            body = json.dumps(EMPTY if ok else {"kind": "Status", "code": 401}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("written", [f"{TOKEN}\n", f"  {TOKEN}\r\n\n", f"\t{TOKEN} "])
def test_a_token_file_ending_in_a_newline_is_trimmed_as_kubectl_trims_it(
    api_server: tuple[str, list[str | None]], npa_home: Path, tmp_path: Path, written: str
) -> None:
    url, seen = api_server
    (tmp_path / "token").write_text(written)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"tokenFile": "token"}}],  # relative to the file
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    r = run_npa(
        "workbench", "workflow", "gpus", "--context", "ctx", "--json",
        env={"KUBECONFIG": str(kubeconfig)},
    )  # fmt: skip
    # It was "cannot read nodes of ctx: ValueError: Invalid header value b'Bearer ...\n'".
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["nodes"] == []
    # Every request (the client reads the file again before each one) carried the trimmed token.
    assert len(seen) >= 2 and set(seen) == {f"Bearer {TOKEN}"}, seen


def test_the_real_api_server_takes_the_token_file_kubectl_takes(
    kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> None:
    """The same file against kube-apiserver, beside kubectl reading the same kubeconfig."""
    from tests.harness.tools import require_tool

    (tmp_path / "token").write_text(f"{kube.token}\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": kube.server,
                                               "certificate-authority": str(kube.ca_file)}}],
        "users": [{"name": "u", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    kubectl = require_tool("NPA_KUBECTL_BIN", "kubectl")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    argv = [str(kubectl), "--context", "ctx", "get", "--raw", "/readyz"]
    seen = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert seen.returncode == 0, seen.stderr
    r = run_npa("workbench", "workflow", "gpus", "--context", "ctx", "--json",
                env={"KUBECONFIG": str(kubeconfig)})  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert isinstance(r.json()["nodes"], list)
