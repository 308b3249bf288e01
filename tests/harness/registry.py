"""A real OCI registry (CNCF distribution, Debian's ``docker-registry``) on loopback.

htpasswd auth is on, so every request needs Basic credentials; images are pushed over the
registry HTTP API (no Docker engine): a config blob carrying labels, one gzipped layer, an OCI
manifest, and optionally an OCI index around it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import secrets
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.harness.procs import ManagedProcess, free_port, http_status, running

USER = "npa-pusher"
PASSWORD = "registry-test-password-not-for-files"

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _htpasswd_line(user: str, password: str) -> str:
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}"


@dataclass
class PushedImage:
    repository: str
    tag: str
    digest: str  # what the registry answers for the tag (index digest when an index was pushed)
    manifest_digest: str  # the single-platform manifest
    config_digest: str


@dataclass
class Registry:
    host: str  # host:port, as it appears in an image reference
    url: str
    process: ManagedProcess

    @property
    def auth(self) -> tuple[str, str]:
        return (USER, PASSWORD)

    def _put_blob(self, session: requests.Session, repository: str, data: bytes) -> str:
        digest = sha256_digest(data)
        start = session.post(f"{self.url}/v2/{repository}/blobs/uploads/", timeout=30)
        start.raise_for_status()
        location = start.headers["Location"]
        if location.startswith("/"):
            location = self.url + location
        sep = "&" if "?" in location else "?"
        done = session.put(
            f"{location}{sep}digest={digest}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=30,
        )
        done.raise_for_status()
        return digest

    def _put_manifest(
        self, session: requests.Session, repository: str, ref: str, body: bytes, media_type: str
    ) -> str:
        resp = session.put(
            f"{self.url}/v2/{repository}/manifests/{ref}",
            data=body,
            headers={"Content-Type": media_type},
            timeout=30,
        )
        resp.raise_for_status()
        digest = resp.headers["Docker-Content-Digest"]
        assert digest == sha256_digest(body), "registry changed the manifest bytes"
        return digest

    def push_image(
        self,
        repository: str,
        tag: str = "latest",
        *,
        labels: dict[str, str] | None = None,
        user: str | None = None,
        index: bool = False,
        payload: bytes = b"npa test layer\n",
        layer: bytes | None = None,
    ) -> PushedImage:
        """Push a small real image and return the digests the registry reports.

        ``layer`` is the image's one layer as an uncompressed tar (a runnable root file system,
        see tests/harness/images.py); without it the layer holds one file with ``payload``.
        """
        session = requests.Session()
        session.auth = self.auth

        if layer is None:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                info = tarfile.TarInfo("npa/hello.txt")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            layer = buffer.getvalue()
        diff_id = sha256_digest(layer)
        layer = gzip.compress(layer, mtime=0)

        config: dict[str, Any] = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": labels or {}, **({"User": user} if user else {})},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest = self._put_blob(session, repository, config_bytes)
        layer_digest = self._put_blob(session, repository, layer)

        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config_bytes)},
            "layers": [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": len(layer)}],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        if not index:
            digest = self._put_manifest(session, repository, tag, manifest_bytes, OCI_MANIFEST)
            return PushedImage(repository, tag, digest, digest, config_digest)

        manifest_digest = self._put_manifest(
            session, repository, sha256_digest(manifest_bytes), manifest_bytes, OCI_MANIFEST
        )
        idx = {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
        idx_bytes = json.dumps(idx, sort_keys=True).encode()
        digest = self._put_manifest(session, repository, tag, idx_bytes, OCI_INDEX)
        return PushedImage(repository, tag, digest, manifest_digest, config_digest)


@contextlib.contextmanager
def distribution_registry(binary: Path, workdir: Path) -> Iterator[Registry]:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    htpasswd = workdir / "htpasswd"
    htpasswd.write_text(_htpasswd_line(USER, PASSWORD) + "\n")
    config = workdir / "config.yml"
    # JSON is YAML: the registry reads this as its configuration file.
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "info", "accesslog": {"disabled": True}},
                "storage": {
                    "filesystem": {"rootdirectory": str(workdir / "data")},
                    "delete": {"enabled": True},
                },
                "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16)},
                "auth": {"htpasswd": {"realm": "npa-test-registry", "path": str(htpasswd)}},
            }
        )
    )
    proc = ManagedProcess(
        name="registry",
        argv=[str(binary), "serve", str(config)],
        log_path=workdir / "registry.log",
        ports=[port],
    )
    url = f"http://127.0.0.1:{port}"
    with running(proc):
        # An unauthenticated /v2/ answers 401 once the registry is serving.
        proc.wait_until(lambda: http_status(f"{url}/v2/") == 401, 30, "serving /v2/")
        yield Registry(host=f"127.0.0.1:{port}", url=url, process=proc)
