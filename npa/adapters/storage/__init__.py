"""Object storage: one interface (:class:`ObjectStore`), an ``s3://`` and a ``file://`` backend.

``open_store`` turns a store URI from the project configuration into a store. ``local`` names
the embedded store under NPA_HOME, the default when nothing is configured.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from npa.adapters.storage.base import ListPage, ObjectInfo, ObjectStore
from npa.core.commands import aws_command
from npa.core.errors import BucketAbsent, InvalidStoreUri, ObjectAbsent, StoreUnavailable
from npa.core.paths import NpaPaths

if TYPE_CHECKING:
    from npa.adapters.storage.s3 import S3Store
    from npa.adapters.storage.s3_obstore import ObstoreS3Store

LOCAL = "local"
# The longest one store operation may take when the store does not answer, retries included:
# a store that hangs fails within it, at every step of every command.
STORE_TIMEOUT = 20.0
STORE_TIMEOUT_ENV = "NPA_STORE_TIMEOUT_SECONDS"
# The S3 client: obstore by default; botocore where a store needs what only it does.
S3_CLIENT_ENV = "NPA_S3_CLIENT"
S3_CLIENTS = ("obstore", "botocore")

__all__ = [
    "LOCAL",
    "BucketAbsent",
    "InvalidStoreUri",
    "ListPage",
    "ObjectAbsent",
    "ObjectInfo",
    "ObjectStore",
    "StoreUnavailable",
    "inspect_command",
    "normalize_store_uri",
    "open_store",
]


def store_timeout() -> float:
    """:data:`STORE_TIMEOUT`, or what ``NPA_STORE_TIMEOUT_SECONDS`` says."""
    value = os.environ.get(STORE_TIMEOUT_ENV)
    try:
        seconds = float(value) if value else STORE_TIMEOUT
    except ValueError:
        raise InvalidStoreUri(
            f"{STORE_TIMEOUT_ENV}={value!r} is not a number of seconds",
            fix=f"export {STORE_TIMEOUT_ENV}={STORE_TIMEOUT:g}",
        ) from None
    return max(1.0, seconds)


def configured_store_uri(
    value: str | None, paths: NpaPaths | None = None, project: str = "default"
) -> str:
    """The canonical store a project's ``store`` setting names (:func:`normalize_store_uri`);
    the local store when the setting names none."""
    return normalize_store_uri(value or LOCAL, paths, project)


def normalize_store_uri(uri: str, paths: NpaPaths | None = None, project: str = "default") -> str:
    """Check a store URI and return its canonical form (``local`` becomes a ``file://`` URI).

    A URI that is refused comes with the command that records the URI it most likely meant
    for ``project`` (credentials taken out, a path made absolute, a bare ``bucket/prefix``
    given its scheme)."""
    if uri == LOCAL:
        return (paths or NpaPaths.from_env()).local_store.as_uri()

    def refuse(message: str, meant: str | None) -> InvalidStoreUri:
        fix = (
            shlex.join(["npa", "configure", "--project", project, "--store", meant])
            if meant
            else "aws s3 ls  # the buckets these credentials can use"
        )
        return InvalidStoreUri(message, fix=fix)

    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc or parsed.username or parsed.password:
            bucket = parsed.hostname or ""
            meant = f"s3://{bucket}/{parsed.path.strip('/')}".rstrip("/") if bucket else None
            raise refuse(
                f"store {uri!r} is not s3://BUCKET[/PREFIX] (credentials never go in the URI)",
                meant,
            )
        return f"s3://{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            meant = Path(unquote(parsed.netloc + parsed.path)).expanduser().absolute().as_uri()
            raise refuse(f"store {uri!r} is not file:///ABSOLUTE/PATH", meant)
        return Path(unquote(parsed.path)).as_uri()
    if not parsed.scheme and uri.startswith(("/", "~", ".")):
        meant = Path(uri).expanduser().absolute().as_uri()
    elif not parsed.scheme and "/" in uri.strip("/"):
        meant = f"s3://{uri.strip('/')}"
    else:
        meant = LOCAL
    raise refuse(f"store {uri!r} is neither s3://BUCKET/PREFIX, file:///PATH nor 'local'", meant)


def inspect_command(store: ObjectStore, key: str, *, listing: bool = False) -> str:
    """The shell command that shows one object (``listing``: the objects under a prefix) of
    ``store`` as it is: ``cat``/``ls -l`` for a file store, ``aws s3`` for S3."""
    where = f"{store.uri}/{key}".rstrip("/")
    if where.startswith("file://"):
        path = unquote(urlparse(where).path)
        return shlex.join(["ls", "-lR", path] if listing else ["cat", path])
    argv = ["s3", "ls", where + "/", "--recursive"] if listing else ["s3", "cp", where, "-"]
    return aws_command(
        *argv,
        endpoint_url=getattr(store, "endpoint_url", None),
        profile=getattr(store, "profile", None),
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
        client = os.environ.get(S3_CLIENT_ENV) or S3_CLIENTS[0]
        if client not in S3_CLIENTS:
            raise InvalidStoreUri(
                f"{S3_CLIENT_ENV}={client!r} names no S3 client npa has",
                fix=f"export {S3_CLIENT_ENV}={S3_CLIENTS[0]}  # or {S3_CLIENTS[1]}",
            )
        store_class: type[ObstoreS3Store] | type[S3Store]
        if client == "obstore":
            from npa.adapters.storage.s3_obstore import ObstoreS3Store as store_class
        else:
            from npa.adapters.storage.s3 import S3Store as store_class

        return store_class(
            parsed.netloc,
            parsed.path,
            endpoint_url=endpoint_url,
            region=region,
            profile=profile,
            max_connections=max_connections,
            max_attempts=max_attempts,
            fix_hint=fix_hint,
            timeout=store_timeout() if timeout is None else timeout,
        )
    from npa.adapters.storage.file import FileStore

    return FileStore(Path(unquote(parsed.path)))
