"""The object-store interface every backend implements, and its typed errors.

Callers must be able to tell three answers apart: the object is there, the store answered
authoritatively that it is not (:class:`ObjectAbsent`), or the store could not be asked
(:class:`StoreUnavailable`). The last one is never read as "absent".
"""

from __future__ import annotations

import abc
import builtins
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from npa.core.errors import (
    InvalidInput,
    ObjectAbsent,
)


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or a head says about one object.

    ``etag`` is the store's entity tag without quotes; for a single-part S3 upload it is the MD5
    of the content, which is what lets staging check blobs without downloading them. The file
    backend has no etag (its writes are atomic renames, so a partial object cannot exist).
    """

    key: str
    size: int
    etag: str | None = None


@dataclass(frozen=True)
class ListPage:
    """One page of a listing; ``next_token`` is None on the last page."""

    objects: tuple[ObjectInfo, ...]
    next_token: str | None


class ObjectStore(abc.ABC):
    """A flat key space of immutable-by-convention objects under one root URI.

    Keys are relative to the store's root (``s3://bucket/prefix`` or the file root) and use
    ``/`` separators. Every method raises :class:`StoreUnavailable` when the store cannot answer.
    """

    #: The URI this store was opened from, without any credential.
    uri: str
    #: The endpoint an S3 store talks to when it is not AWS's own; None otherwise.
    endpoint_url: str | None = None
    #: How many reads a reader runs at once: a network store overlaps their round trips; a
    #: store on a local disk says 1, since it answers a read in microseconds, sooner than a
    #: pool of threads starts (and ``list`` then never imports one).
    read_concurrency: int = 16

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, content_md5: str | None = None) -> ObjectInfo:
        """Store ``data`` at ``key`` atomically: readers see the old object or the new one.

        ``content_md5`` (base64) lets a store that checks it refuse bytes damaged in transit.
        """

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; :class:`ObjectAbsent` when the store says it does not exist."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and etag of ``key``; :class:`ObjectAbsent` when it does not exist."""

    @abc.abstractmethod
    def list_page(
        self, prefix: str, *, token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        """One page of the keys under ``prefix``, in key order; pass ``next_token`` back."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; deleting an absent key is not an error."""

    @abc.abstractmethod
    def create_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if nothing is there: True if this call created it, else False.

        Of several concurrent callers exactly one gets True where the store supports an atomic
        conditional write (S3 ``If-None-Match: *``, ``link(2)`` on files); see
        docs/storage-layout.md for the fallback on stores that do not.
        """

    def list(self, prefix: str, *, page_size: int = 1000) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, following pagination to the end."""
        token: str | None = None
        while True:
            page = self.list_page(prefix, token=token, page_size=page_size)
            yield from page.objects
            if page.next_token is None:
                return
            token = page.next_token

    def children(self, prefix: str) -> builtins.list[str]:
        """The names of the "folders" directly under ``prefix`` (which ends with ``/`` or is
        empty), sorted. One request per 1,000 names on S3 (a delimiter listing): the cost grows
        with the number of children, never with the objects beneath them."""
        names: set[str] = set()
        for obj in self.list(prefix):
            rest = obj.key[len(prefix) :]
            if "/" in rest:
                names.add(rest.split("/", 1)[0])
        return sorted(names)

    def exists(self, key: str) -> bool:
        """True/False only on an authoritative answer; StoreUnavailable otherwise."""
        try:
            self.head(key)
        except ObjectAbsent:
            return False
        return True


T = TypeVar("T")


class WrappingStore(ObjectStore):
    """``inner`` with every operation passed through :meth:`_call` (a deadline, a retry), which
    gets a phrase for messages ("a write of KEY") and the call itself."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.endpoint_url = getattr(inner, "endpoint_url", None)  # duck-typed stores have none
        self.profile = getattr(inner, "profile", None)
        self.read_concurrency = getattr(inner, "read_concurrency", ObjectStore.read_concurrency)

    @abc.abstractmethod
    def _call(self, what: str, fn: Callable[[], T]) -> T: ...

    def put(self, key: str, data: bytes, *, content_md5: str | None = None) -> ObjectInfo:
        return self._call(
            f"a write of {key}", lambda: self.inner.put(key, data, content_md5=content_md5)
        )

    def get(self, key: str) -> bytes:
        return self._call(f"a read of {key}", lambda: self.inner.get(key))

    def head(self, key: str) -> ObjectInfo:
        return self._call(f"a lookup of {key}", lambda: self.inner.head(key))

    def list_page(
        self, prefix: str, *, token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        return self._call(
            f"a listing of {prefix or '/'}",
            lambda: self.inner.list_page(prefix, token=token, page_size=page_size),
        )

    def children(self, prefix: str) -> builtins.list[str]:
        return self._call(f"a listing of {prefix or '/'}", lambda: self.inner.children(prefix))

    def delete(self, key: str) -> None:
        self._call(f"a delete of {key}", lambda: self.inner.delete(key))

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return self._call(f"a write of {key}", lambda: self.inner.create_if_absent(key, data))


def check_key(key: str) -> str:
    """Refuse keys that could escape a prefix or mean different things on different stores."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(f"object key {key!r} is not a clean relative path")
    return key


def read_map(store: ObjectStore, stack: contextlib.ExitStack) -> Callable[..., Iterator[Any]]:
    """``map`` for a batch of reads from ``store``: in turn on a store that answers locally,
    else on a pool of the store's ``read_concurrency`` threads, shut down with ``stack``."""
    if store.read_concurrency <= 1:
        return map
    from concurrent.futures import ThreadPoolExecutor

    return stack.enter_context(ThreadPoolExecutor(max_workers=store.read_concurrency)).map
