"""S3 over real HTTP: moto's server on 127.0.0.1, reached through boto3 like any S3 endpoint."""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.harness.procs import free_port, port_is_open

# Fixed fake credentials: moto accepts any, and tests scan npa's files for these exact values.
ACCESS_KEY = "AKIANPATESTACCESSKEY"
SECRET_KEY = "npa-test-secret-key-do-not-write-anywhere"
REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint_url: str
    port: int

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def reset(self) -> None:
        """Forget every bucket and object (moto's own reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    @property
    def env(self) -> dict[str, str]:
        """The environment a subprocess (e.g. the npa CLI) needs to reach this store."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }


@contextlib.contextmanager
def moto_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        if not port_is_open(port):
            raise RuntimeError(f"moto server did not listen on 127.0.0.1:{port}")
        yield S3Server(endpoint_url=f"http://127.0.0.1:{port}", port=port)
    finally:
        server.stop()
