"""Answers SkyPilot's network check from inside a test cluster's pods.

SkyPilot decides the network is up when ``HEAD https://8.8.8.8`` (or 1.1.1.1) succeeds. This
machine's egress answers those addresses with a certificate that does not match them, so the
jobs controller would wait forever for a network it has. The cluster DNATs its pods' traffic to
those two addresses here; the certificate names both and is signed by a CA only the cluster's
runtime image trusts.

``python -m tests.harness.netcheck HOST PORT CERT KEY``
"""

from __future__ import annotations

import http.server
import ssl
import sys


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str]) -> int:
    host, port, cert, key = argv
    server = http.server.ThreadingHTTPServer((host, int(port)), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
