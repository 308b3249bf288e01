"""Object storage: one interface (:class:`ObjectStore`), an ``s3://`` and a ``file://`` backend.

``open_store`` turns a store URI from the project configuration into a store. ``local`` names
the embedded store under NPA_HOME, the default when nothing is configured.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from npa.adapters.storage.base import (
    BucketAbsent,
    InvalidStoreUri,
    ListPage,
    ObjectAbsent,
    ObjectInfo,
    ObjectStore,
    StoreUnavailable,
)
from npa.core.paths import NpaPaths

LOCAL = "local"

__all__ = [
    "LOCAL",
    "BucketAbsent",
    "InvalidStoreUri",
    "ListPage",
    "ObjectAbsent",
    "ObjectInfo",
    "ObjectStore",
    "StoreUnavailable",
    "normalize_store_uri",
    "open_store",
]


def normalize_store_uri(uri: str, paths: NpaPaths | None = None) -> str:
    """Check a store URI and return its canonical form (``local`` becomes a ``file://`` URI)."""
    if uri == LOCAL:
        return (paths or NpaPaths.from_env()).local_store.as_uri()
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc or parsed.username or parsed.password:
            raise InvalidStoreUri(
                f"store {uri!r} is not s3://BUCKET[/PREFIX] (credentials never go in the URI)",
                fix="npa configure --project PROJECT --store s3://BUCKET/PREFIX",
            )
        return f"s3://{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidStoreUri(
                f"store {uri!r} is not file:///ABSOLUTE/PATH",
                fix="npa configure --project PROJECT --store file:///ABSOLUTE/PATH",
            )
        return Path(unquote(parsed.path)).as_uri()
    raise InvalidStoreUri(
        f"store {uri!r} is neither s3://BUCKET/PREFIX, file:///PATH nor 'local'",
        fix="npa configure --project PROJECT --store s3://BUCKET/PREFIX",
    )


def open_store(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    max_connections: int = 32,
    max_attempts: int = 4,
    fix_hint: str | None = None,
    paths: NpaPaths | None = None,
    timeout: float | None = None,
) -> ObjectStore:
    """Open the store ``uri`` names; S3 settings are ignored for ``file://`` stores.
    ``timeout`` bounds each network wait of an ``s3://`` store (see also BoundedStore)."""
    canonical = normalize_store_uri(uri, paths)
    parsed = urlparse(canonical)
    if parsed.scheme == "s3":
        from npa.adapters.storage.s3 import S3Store

        return S3Store(
            parsed.netloc,
            parsed.path,
            endpoint_url=endpoint_url,
            region=region,
            profile=profile,
            max_connections=max_connections,
            max_attempts=max_attempts,
            fix_hint=fix_hint,
            timeout=timeout,
        )
    from npa.adapters.storage.file import FileStore

    return FileStore(Path(unquote(parsed.path)))
