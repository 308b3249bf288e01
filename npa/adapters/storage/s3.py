"""The ``s3://`` backend: any S3-compatible store (AWS S3, Nebius Object Storage, MinIO) via
boto3's botocore, with the same credential chain (environment, profile, instance roles).

botocore is imported when a store is opened, never at CLI import time.
"""

from __future__ import annotations

import builtins
import os
import shlex
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npa.adapters.storage.base import ListPage, ObjectInfo, ObjectStore, check_key
from npa.core.commands import aws_command
from npa.core.errors import BucketAbsent, InvalidInput, ObjectAbsent, StoreUnavailable

# Error codes that mean "the thing is not there", as opposed to "you may not look".
_ABSENT_KEY = {"NoSuchKey", "404", "NotFound"}
_ABSENT_BUCKET = {"NoSuchBucket"}
_REFUSED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
# A store that does not understand the conditional header answers one of these.
_NO_CONDITIONAL = {"NotImplemented", "501"}


# When none of these is set and no shared config file exists, botocore would read the endpoint,
# region and credentials from the environment alone, so its session need not be loaded.
_PROFILE_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE")


@dataclass
class S3Settings:
    """Where an S3 client goes and as whom, resolved once for both clients (botocore's and
    obstore's) with botocore's own precedence, so one configuration never reaches two stores.

    - endpoint: the given one, else what botocore configures for S3 (``AWS_ENDPOINT_URL_S3``,
      ``AWS_ENDPOINT_URL``, the profile's ``services`` section, the profile's
      ``endpoint_url``), unless ``ignore_configured_endpoint_urls`` says not to;
    - region: the given one (``npa configure`` also reads ``AWS_REGION``), else botocore's
      (``AWS_DEFAULT_REGION``, then the profile's ``region``);
    - credentials: botocore's chain for the profile (a named profile skips the environment's
      keys, as botocore does).

    ``session`` is botocore's session, or None when the environment alone decided (no profile,
    keys in the environment, no shared config file): botocore is then not even imported."""

    endpoint_url: str | None
    region: str | None
    credential_source: str
    credentials: Any = None  # botocore's credentials (None: the environment's keys, or none)
    env_keys: dict[str, str] | None = None
    session: Any = None


def s3_settings(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    fix_hint: str | None = None,
    env: Mapping[str, str] | None = None,
    credentials: bool = True,
) -> S3Settings:
    """The one resolution of an S3 configuration (:class:`S3Settings`). Without
    ``credentials`` the chain is not asked (it may ask the instance metadata service over the
    network) and ``credential_source`` is ``not-resolved``."""
    env = os.environ if env is None else env
    keys = _env_keys(env)
    if profile is None and keys is not None and not _shared_config(env):
        return S3Settings(
            endpoint_url=endpoint_url or _env_endpoint(env),
            region=region or env.get("AWS_DEFAULT_REGION") or None,  # botocore's only variable
            credential_source="env",
            env_keys=keys,
        )
    import botocore.session
    from botocore.configprovider import ConfiguredEndpointProvider
    from botocore.exceptions import ProfileNotFound

    session = botocore.session.Session(profile=profile)
    try:
        if endpoint_url is None and not session.get_config_variable(
            "ignore_configured_endpoint_urls"
        ):
            endpoint_url = ConfiguredEndpointProvider(
                full_config=session.full_config,
                scoped_config=session.get_scoped_config(),
                client_name="s3",
            ).provide()
        region = region or session.get_config_variable("region")
        creds = session.get_credentials() if credentials else None
    except ProfileNotFound:
        raise InvalidInput(
            f"AWS profile {profile!r} is not defined in the shared config or credentials file",
            fix=fix_hint or f"aws configure --profile {shlex.quote(profile or 'default')}",
        ) from None
    return S3Settings(
        endpoint_url=endpoint_url or None,
        region=region or None,
        # The *method* names where credentials came from (env, shared-credentials-file, ...);
        # it is safe to print, unlike the credentials themselves.
        credential_source=(
            "not-resolved" if not credentials else str(creds.method) if creds else "none"
        ),
        credentials=creds,
        session=session,
    )


def _env_keys(env: Mapping[str, str]) -> dict[str, str] | None:
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    keys = {"access_key_id": key, "secret_access_key": secret}
    if env.get("AWS_SESSION_TOKEN"):
        keys["token"] = env["AWS_SESSION_TOKEN"]
    return keys


def _shared_config(env: Mapping[str, str]) -> bool:
    """Whether botocore could read anything beyond the environment: a profile named there, or
    a shared config file (which may set an endpoint or a region for the default profile)."""
    if any(env.get(name) for name in _PROFILE_VARIABLES):
        return True
    path = env.get("AWS_CONFIG_FILE") or os.path.join(env.get("HOME") or "~", ".aws", "config")
    return os.path.exists(os.path.expanduser(path))


def _env_endpoint(env: Mapping[str, str]) -> str | None:
    if (env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").lower() == "true":
        return None
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


class S3Base(ObjectStore):
    """What both S3 clients share: naming, the bucket check's answer, and the fallback for
    stores without conditional writes."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint_url: str | None,
        fix_hint: str | None,
        profile: str | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.endpoint_url = endpoint_url
        self.profile = profile
        self.region: str | None = None
        self._fix_hint = fix_hint
        self._bucket_checked = False
        self._bucket_lock = threading.Lock()
        # None until a conditional write tells us whether this store honours If-None-Match.
        self.conditional_writes: bool | None = None

    def _where(self, key: str | None = None) -> str:
        # Not a full key: a listing prefix ends with "/" and must still be nameable.
        full = f"{self.prefix}/{key}" if self.prefix and key else key
        where = f"s3://{self.bucket}/{full}" if key else self.uri
        if self.endpoint_url:
            where += f" (endpoint {self.endpoint_url})"
        return where

    def _bucket_absent(self) -> BucketAbsent:
        # Outside us-east-1, S3 creates a bucket only where the request says it goes.
        region = self.region if self.region not in (None, "us-east-1") else None
        located = ["--region", region, "--create-bucket-configuration",
                   f"LocationConstraint={region}"] if region else []  # fmt: skip
        return BucketAbsent(
            f"bucket {self.bucket!r} does not exist at {self._where()}",
            fix=self.aws_command("s3api", "create-bucket", "--bucket", self.bucket, *located),
        )

    def aws_command(self, *argv: str) -> str:
        """The aws CLI line that does ``argv`` to this store, as npa reaches it."""
        return aws_command(*argv, endpoint_url=self.endpoint_url, profile=self.profile)

    def _absent(self, key: str) -> ObjectAbsent:
        return ObjectAbsent(f"{self._where(key)} does not exist")

    def _create_if_absent_fallback(self, key: str, data: bytes) -> bool:
        """Stores without conditional writes: look, then write. Not atomic across machines;
        npa's own writers of one run serialise on a local lock (docs/storage-layout.md)."""
        if self.exists(key):
            return False
        self.put(key, data)
        return True

    def _probe(self, key: str | None) -> str:
        """What shows whether the store answers now, for the object (or prefix) that failed: a
        store that errs or does not answer needs looking at, not npa's settings."""
        from npa.adapters.storage import inspect_command

        return inspect_command(self, key or "", listing=key is None or key.endswith("/"))

    def _conflicts_exhausted(self, key: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"could not create {self._where(key)}: concurrent conditional writes kept "
            "conflicting; run the same command again once the other writers are done",
            fix=self._fix_hint,
        )


class S3Store(S3Base):
    """Objects under ``s3://bucket/prefix`` on one endpoint, through botocore."""

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
        # botocore directly: boto3's resource layer costs start-up time and is not needed.
        from botocore.config import Config

        settings = s3_settings(
            endpoint_url=endpoint_url, region=region, profile=profile, fix_hint=fix_hint
        )
        super().__init__(bucket, prefix, settings.endpoint_url, fix_hint, profile)
        self.region = settings.region
        session = settings.session
        if session is None:  # decided by the environment alone; botocore's client reads it too
            import botocore.session

            session = botocore.session.Session()
        self.client: Any = session.create_client(
            "s3",
            region_name=settings.region,
            endpoint_url=settings.endpoint_url,
            # A store that stops answering fails within about ``timeout`` seconds, all
            # attempts together: each waits at most a third of it.
            config=Config(
                retries={"mode": "standard", "max_attempts": min(max_attempts, 3)},
                max_pool_connections=max_connections,
                connect_timeout=min(5.0, timeout / 4),
                read_timeout=timeout / 3,
            ),
        )
        # The *method* names where credentials came from (env, shared-credentials-file, ...);
        # it is safe to print, unlike the credentials themselves.
        self.credential_source = settings.credential_source

    # --- helpers ------------------------------------------------------------------------
    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _unavailable(self, exc: Exception, what: str, key: str | None = None) -> StoreUnavailable:
        code, status = _error_code(exc)
        if code in _REFUSED:
            reason = (
                f"the store refused the credentials from {self.credential_source!r} ({code}); "
                "npa cannot tell whether the object exists"
            )
        elif code:
            reason = f"the store answered {code} (HTTP {status})"
        else:
            reason = f"{type(exc).__name__}: {exc}"
        refused = code in _REFUSED or type(exc).__name__ == "NoCredentialsError"
        return StoreUnavailable(
            f"could not {what} {self._where(key)}: {reason}",
            fix=(self._fix_hint or "npa configure --show") if refused else self._probe(key),
            details={"store": self.uri, "code": code, "http_status": status, "refused": refused},
        )

    def _check_bucket(self) -> None:
        """A HEAD 404 does not say whether the key or the bucket is missing: ask once."""
        with self._bucket_lock:
            if self._bucket_checked:
                return
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except Exception as exc:
                code, _ = _error_code(exc)
                if code in _ABSENT_KEY | _ABSENT_BUCKET:
                    raise self._bucket_absent() from None
                raise self._unavailable(exc, "check bucket of") from None
            self._bucket_checked = True

    # --- operations ---------------------------------------------------------------------
    def put(self, key: str, data: bytes, *, content_md5: str | None = None) -> ObjectInfo:
        extra: dict[str, Any] = {"ContentMD5": content_md5} if content_md5 else {}
        full = self._key(key)
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **extra)
        except Exception as exc:
            if _error_code(exc)[0] in _ABSENT_BUCKET:
                raise self._bucket_absent() from None
            raise self._unavailable(exc, "write", key) from None
        return ObjectInfo(key, len(data), _etag(resp.get("ETag")))

    def get(self, key: str) -> bytes:
        full = self._key(key)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=full)
            data: bytes = resp["Body"].read()
        except Exception as exc:
            code, _ = _error_code(exc)
            if code in _ABSENT_BUCKET:
                raise self._bucket_absent() from None
            if code in _ABSENT_KEY:
                raise self._absent(key) from None
            raise self._unavailable(exc, "read", key) from None
        return data

    def head(self, key: str) -> ObjectInfo:
        full = self._key(key)
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            code, _ = _error_code(exc)
            if code in _ABSENT_KEY | _ABSENT_BUCKET:
                self._check_bucket()
                raise self._absent(key) from None
            raise self._unavailable(exc, "look up", key) from None
        return ObjectInfo(key, int(resp["ContentLength"]), _etag(resp.get("ETag")))

    def list_page(
        self, prefix: str, *, token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": page_size}
        if token:
            args["ContinuationToken"] = token
        try:
            resp = self.client.list_objects_v2(**args)
        except Exception as exc:
            if _error_code(exc)[0] in _ABSENT_BUCKET:
                raise self._bucket_absent() from None
            raise self._unavailable(exc, "list", prefix or None) from None
        objects = tuple(
            ObjectInfo(self._rel(o["Key"]), int(o["Size"]), _etag(o.get("ETag")))
            for o in resp.get("Contents", [])
        )
        next_token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        return ListPage(objects, next_token)

    def children(self, prefix: str) -> builtins.list[str]:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "Delimiter": "/"}
        names: list[str] = []
        while True:
            try:
                resp = self.client.list_objects_v2(**args)
            except Exception as exc:
                if _error_code(exc)[0] in _ABSENT_BUCKET:
                    raise self._bucket_absent() from None
                raise self._unavailable(exc, "list", prefix or None) from None
            for entry in resp.get("CommonPrefixes", []):
                names.append(entry["Prefix"][len(full) :].rstrip("/"))
            if not resp.get("IsTruncated"):
                return sorted(n for n in names if n)
            args["ContinuationToken"] = resp["NextContinuationToken"]

    def delete(self, key: str) -> None:
        full = self._key(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            code, _ = _error_code(exc)
            if code in _ABSENT_KEY:
                return
            if code in _ABSENT_BUCKET:
                raise self._bucket_absent() from None
            raise self._unavailable(exc, "delete", key) from None

    def create_if_absent(self, key: str, data: bytes) -> bool:
        if self.conditional_writes is False:
            return self._create_if_absent_fallback(key, data)
        full = self._key(key)
        for attempt in range(5):
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
            except Exception as exc:
                code, status = _error_code(exc)
                if code == "PreconditionFailed" or status == 412:
                    self.conditional_writes = True
                    return False
                if code == "ConditionalRequestConflict" or status == 409:
                    # Another conditional write to the key is in flight: wait, then ask again.
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if code in _NO_CONDITIONAL:
                    self.conditional_writes = False
                    return self._create_if_absent_fallback(key, data)
                if code in _ABSENT_BUCKET:
                    raise self._bucket_absent() from None
                raise self._unavailable(exc, "create", key) from None
            return True
        raise self._conflicts_exhausted(key)


def _etag(value: str | None) -> str | None:
    return value.strip('"') if value else None


def _error_code(exc: Exception) -> tuple[str, int | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, int(status) if status is not None else None
