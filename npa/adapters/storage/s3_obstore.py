"""The ``s3://`` backend on ``obstore`` (Python bindings of Rust's ``object_store``): the
default S3 client. It imports and starts in about 20 ms where a botocore client takes about
300 ms, and its requests cost less client CPU (docs/storage-layout.md has the figures).

Endpoint, region and credentials come from :class:`npa.adapters.storage.s3.S3Settings`, the
one resolution both S3 clients use (botocore's session and precedence, no botocore client).
Payloads are signed (SigV4 ``x-amz-content-sha256``), so the store rejects bytes damaged in
transit without a ``Content-MD5`` header.

obstore is imported when a store is opened, never at CLI import time.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from npa.adapters.storage.base import ListPage, ObjectInfo, check_key
from npa.adapters.storage.s3 import S3Base
from npa.core.errors import StoreUnavailable
from npa.core.text import clipped

T = TypeVar("T")
# How long npa lets obstore keep credentials from botocore's chain before asking again.
CREDENTIAL_REFRESH = timedelta(minutes=5)


class ObstoreS3Store(S3Base):
    """Objects under ``s3://bucket/prefix`` on one endpoint, through obstore."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        max_connections: int = 32,
        max_attempts: int = 4,
        fix_hint: str | None = None,
        timeout: float = 20.0,
    ) -> None:
        import obstore
        from obstore.store import S3Store

        from npa.adapters.storage.s3 import s3_settings

        # One resolution for both clients: this one reaches the store botocore's would.
        settings = s3_settings(
            endpoint_url=endpoint_url, region=region, profile=profile, fix_hint=fix_hint
        )
        endpoint_url = settings.endpoint_url
        super().__init__(bucket, prefix, endpoint_url, fix_hint, profile)
        self._ob = obstore
        self.credential_source = settings.credential_source
        self._no_credentials = settings.credentials is None and settings.env_keys is None
        config: dict[str, Any] = dict(settings.env_keys or {})
        provider = _credential_provider(settings.credentials)
        region = settings.region
        self.region = region
        config["region"] = region or "us-east-1"
        if endpoint_url:
            # Both names: obstore lets AWS_ENDPOINT_URL_S3 win over a plain endpoint.
            config["endpoint"] = endpoint_url
            config["aws_endpoint_url_s3"] = endpoint_url
        else:
            config["virtual_hosted_style_request"] = True
        self.store = S3Store(
            bucket,
            prefix=self.prefix or None,
            config=config,  # type: ignore[arg-type]
            client_options={
                "allow_http": bool(endpoint_url and endpoint_url.startswith("http://")),
                "connect_timeout": timedelta(seconds=min(5.0, timeout / 4)),
                "read_timeout": timedelta(seconds=timeout / 2),
                # No cap on a whole request: a 1 GiB blob on a slow link takes a while;
                # read_timeout catches a store that stops answering.
                "timeout": timedelta(hours=1),
                "pool_max_idle_per_host": str(max_connections),
            },
            # No retry starts after half the budget: a store that does not answer fails
            # within about ``timeout`` seconds in all.
            retry_config={
                "max_retries": max(0, max_attempts - 1),
                "retry_timeout": timedelta(seconds=timeout / 2),
            },
            credential_provider=provider,  # type: ignore[arg-type]
        )

    # --- helpers ------------------------------------------------------------------------

    def _unavailable(self, exc: Exception, what: str, key: str | None = None) -> StoreUnavailable:
        from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

        text = _first_line(exc)
        if isinstance(exc, PermissionDeniedError | UnauthenticatedError) or _code(exc) in (
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
        ):
            reason = (
                f"the store refused the credentials from {self.credential_source!r} "
                f"({text}); npa cannot tell whether the object exists"
            )
            fix, refused = self._fix_hint or "npa configure --show", True
        else:
            reason, fix, refused = text, self._probe(key), False
        return StoreUnavailable(
            f"could not {what} {self._where(key)}: {reason}",
            fix=fix,
            details={
                "store": self.uri,
                "code": _code(exc),
                "client": "obstore",
                "refused": refused,
            },
        )

    def _call(self, what: str, key: str | None, fn: Callable[[], T]) -> T:
        """Run one obstore call, turning its errors into npa's (absent keys are the caller's
        to handle: they come back as FileNotFoundError)."""
        if self._no_credentials:
            raise StoreUnavailable(
                f"could not {what} {self._where(key)}: no AWS credentials were found "
                f"({self.credential_source})",
                fix=self._fix_hint or "npa configure --show",
                details={"store": self.uri, "refused": True},
            )
        from obstore.exceptions import AlreadyExistsError

        try:
            return fn()
        except (FileNotFoundError, AlreadyExistsError):
            raise
        except Exception as exc:
            if _code(exc) == "NoSuchBucket":
                raise self._bucket_absent() from None
            raise self._unavailable(exc, what, key) from None

    def _check_bucket(self, key: str) -> None:
        """A HEAD 404 does not say whether the key or the bucket is missing: ask once, with a
        listing under the missing key (empty and cheap, whatever the bucket holds)."""
        with self._bucket_lock:
            if self._bucket_checked:
                return

            def probe() -> None:
                for _ in self._ob.list(self.store, key, chunk_size=1):
                    break

            try:
                self._call("check bucket of", None, probe)
            except FileNotFoundError:
                raise self._bucket_absent() from None
            self._bucket_checked = True

    # --- operations ---------------------------------------------------------------------
    def put(self, key: str, data: bytes, *, content_md5: str | None = None) -> ObjectInfo:
        check_key(key)
        # content_md5 is not sent: the signed payload hash already makes the store refuse
        # damaged bytes. One PUT, never multipart, so the etag stays the content MD5.
        result = self._call(
            "write", key, lambda: self._ob.put(self.store, key, data, use_multipart=False)
        )
        return ObjectInfo(key, len(data), _etag(result.get("e_tag")))

    def get(self, key: str) -> bytes:
        check_key(key)
        try:
            return self._call("read", key, lambda: bytes(self._ob.get(self.store, key).bytes()))
        except FileNotFoundError as exc:
            if _code(exc) == "NoSuchBucket":
                raise self._bucket_absent() from None
            raise self._absent(key) from None

    def head(self, key: str) -> ObjectInfo:
        check_key(key)
        try:
            meta = self._call("look up", key, lambda: self._ob.head(self.store, key))
        except FileNotFoundError:
            self._check_bucket(key)
            raise self._absent(key) from None
        return ObjectInfo(key, int(meta["size"]), _etag(meta.get("e_tag")))

    def list_page(
        self, prefix: str, *, token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        # obstore lists by whole path segments; a prefix that ends inside a name is listed
        # from its folder and filtered, so any prefix means what it means on S3.
        folder, _, name = prefix.rpartition("/")
        # Start the listing just before the prefix (S3's start-after), and stop at the first
        # key past it: a prefix inside a large folder costs its own keys, not the folder's.
        offset = token or (_just_before(prefix) if name else None)

        def page() -> tuple[list[ObjectInfo], bool]:
            out: list[ObjectInfo] = []
            stream = self._ob.list(self.store, folder or None, offset=offset, chunk_size=page_size)
            for batch in stream:
                for meta in batch:
                    path = str(meta["path"])
                    if not path.startswith(prefix):
                        if path.encode() > prefix.encode():
                            return out, False
                        continue
                    if len(out) == page_size:
                        return out, True
                    out.append(ObjectInfo(path, int(meta["size"]), _etag(meta.get("e_tag"))))
            return out, False

        try:
            objects, more = self._call("list", prefix or None, page)
        except FileNotFoundError:
            raise self._bucket_absent() from None
        return ListPage(tuple(objects), objects[-1].key if more else None)

    def children(self, prefix: str) -> builtins.list[str]:
        try:
            listing = self._call(
                "list",
                prefix or None,
                lambda: self._ob.list_with_delimiter(self.store, prefix.rstrip("/") or None),
            )
        except FileNotFoundError:
            raise self._bucket_absent() from None
        base = prefix.rstrip("/")
        names = [p[len(base) + 1 :] if base else p for p in listing["common_prefixes"]]
        return sorted((n.rstrip("/") for n in names if n), key=str.encode)

    def delete(self, key: str) -> None:
        check_key(key)
        try:
            self._call("delete", key, lambda: self._ob.delete(self.store, key))
        except FileNotFoundError:
            return

    def create_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        if self.conditional_writes is False:
            return self._create_if_absent_fallback(key, data)
        from obstore.exceptions import AlreadyExistsError

        for attempt in range(5):
            try:
                self._call(
                    "create",
                    key,
                    lambda: self._ob.put(self.store, key, data, mode="create", use_multipart=False),
                )
            except AlreadyExistsError:
                self.conditional_writes = True
                return False
            except StoreUnavailable as error:
                code = error.details.get("code")
                if code == "ConditionalRequestConflict" or "409 Conflict" in error.message:
                    # Another conditional write to the key is in flight: wait, ask again.
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if code == "NotImplemented" or "501 Not Implemented" in error.message:
                    self.conditional_writes = False
                    return self._create_if_absent_fallback(key, data)
                raise
            return True
        raise self._conflicts_exhausted(key)


def _credential_provider(creds: Any) -> Callable[[], dict[str, Any]] | None:
    """botocore's credentials (the environment's, a profile's, SSO, a role, instance metadata)
    as an obstore credential provider, refreshed as botocore refreshes them."""
    if creds is None:
        return None

    def provide() -> dict[str, Any]:
        frozen = creds.get_frozen_credentials()
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + CREDENTIAL_REFRESH,
        }

    return provide


def _just_before(prefix: str) -> str:
    """A key that sorts before every key starting with ``prefix`` and after every key before
    them that does not (its last character one lower: keys between it and ``prefix`` start
    with it, and are filtered out)."""
    last = prefix[-1]
    return prefix[:-1] + chr(ord(last) - 1) if ord(last) > 1 else prefix[:-1]


def _etag(value: object) -> str | None:
    return str(value).strip('"') if value else None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().split("\n", 1)[0]
    return clipped(text, 400) or type(exc).__name__


def _code(exc: Exception) -> str:
    """The S3 error code in an obstore error's text (``<Code>NoSuchKey</Code>``), if any."""
    text = str(exc)
    start = text.find("<Code>")
    if start < 0:
        return ""
    end = text.find("</Code>", start)
    return text[start + 6 : end] if end > 0 else ""
