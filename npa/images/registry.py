"""A registry client that asks exactly what a Kubernetes node asks before it pulls.

One manifest fetch decides an image: ``HEAD /v2/<name>/manifests/<ref>`` with the Accept list a
container runtime sends (falling back to ``GET``), through the registry's own authentication
(the ``WWW-Authenticate`` Bearer token flow, anonymous or with credentials, or Basic). Listing
tags proves nothing about pull permission, so it is never consulted.

Every answer is classified: ``ok`` (with the digest), ``not_found``, ``forbidden`` or
``unreachable``. Unreachable means "could not verify": it is never read as absent.

Written on ``requests`` rather than an OCI library: the Python OCI clients either hide the HTTP
status and error code this classification needs or are unmaintained.
"""

from __future__ import annotations

import email.utils
import hashlib
import ipaddress
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import requests

from npa.core.text import clipped, plural
from npa.images.credentials import Credential, CredentialStore
from npa.images.reference import ImageReference

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
# The order a runtime prefers; a registry that does not see the index type here answers
# MANIFEST_UNKNOWN for a multi-platform tag, so all four always go.
MANIFEST_ACCEPT = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)

NOT_FOUND_CODES = {"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"}
FORBIDDEN_CODES = {"DENIED", "UNAUTHORIZED"}
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_CONFIG_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 15.0
DEFAULT_PLATFORM = ("linux", "amd64")
# Answers that mean "ask again later": rate limits and a registry (or its proxy) in trouble.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ATTEMPTS = 4
BACKOFF_START = 0.5
BACKOFF_MAX = 8.0
DEFAULT_RETRY_BUDGET = 30.0  # seconds of waiting per request, at most
_ANY_SCOPE = "*"


class Status(StrEnum):
    """What the registry's answer means for a pull."""

    OK = "ok"
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class ManifestAnswer:
    """The classified answer to one manifest fetch."""

    status: Status
    detail: str
    digest: str | None = None
    media_type: str | None = None
    http_status: int | None = None
    error_code: str | None = None
    credential_source: str | None = None  # a source name, never a value


class RegistryProblem(Exception):
    """Reading past the manifest (index, config blob) failed; carries the classification."""

    def __init__(self, status: Status, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class _Challenge:
    scheme: str  # "bearer" | "basic" | other, lowercased
    params: dict[str, str]


@dataclass(frozen=True)
class _Exchange:
    response: requests.Response
    credential: Credential | None
    authenticated: bool  # a credential or token was presented on the final request
    token_refused: str | None = None  # why the token service said no


_CHALLENGE_PARAM = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


def parse_challenge(header: str) -> _Challenge | None:
    """Read ``Bearer realm="...",service="...",scope="..."`` (or ``Basic realm=...``)."""
    text = header.strip()
    if not text:
        return None
    scheme, _, rest = text.partition(" ")
    params = {
        m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3) or "").replace(
            '\\"', '"'
        )
        for m in _CHALLENGE_PARAM.finditer(rest)
    }
    return _Challenge(scheme.lower(), params)


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class RegistryClient:
    """Asks registries about manifests; safe to share between threads."""

    def __init__(
        self,
        credentials: CredentialStore,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        platform: tuple[str, str] = DEFAULT_PLATFORM,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        sleep: Callable[[float], None] = time.sleep,
        clock_wall: Callable[[], float] = time.time,
    ) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.platform = platform
        self.retry_budget = retry_budget
        self.sleep = sleep
        self.clock_wall = clock_wall
        self._local = threading.local()
        self._lock = threading.Lock()
        # (api host, scope) -> (Authorization header, credential in it, expiry (monotonic))
        self._auth: dict[tuple[str, str], tuple[str, Credential | None, float]] = {}

    # --- public --------------------------------------------------------------------------
    def check_manifest(self, ref: ImageReference) -> ManifestAnswer:
        """HEAD (then GET when HEAD cannot decide) the manifest, and classify the answer."""
        try:
            head = self._exchange("HEAD", ref, f"manifests/{ref.reference}", MANIFEST_ACCEPT)
        except RegistryProblem as problem:
            return ManifestAnswer(problem.status, problem.detail)
        resp = head.response
        if resp.status_code == 200 and _digest_header(resp):
            return self._ok(ref, head, _digest_header(resp), _media_type(resp))
        if getattr(resp, "npa_retries", None):
            # Asked again and again already; a GET would only wait as long a second time.
            return classify_failure(ref, head)
        # No digest header, an error without a body to read, or a method the registry does
        # not serve: ask again with GET, as a runtime does, and decide on that answer.
        try:
            got = self._exchange("GET", ref, f"manifests/{ref.reference}", MANIFEST_ACCEPT)
        except RegistryProblem as problem:
            return ManifestAnswer(problem.status, problem.detail)
        resp = got.response
        if resp.status_code == 200:
            body = _read_limited(resp, MAX_MANIFEST_BYTES)
            if body is None:
                return ManifestAnswer(
                    Status.UNREACHABLE,
                    f"{ref.api_host} sent a manifest larger than {MAX_MANIFEST_BYTES} bytes",
                    credential_source=_source(got),
                )
            digest = _digest_header(resp) or sha256_digest(body)
            if digest.startswith("sha256:") and sha256_digest(body) != digest:
                return ManifestAnswer(
                    Status.UNREACHABLE,
                    f"{ref.api_host} sent manifest bytes that do not hash to {digest}",
                    credential_source=_source(got),
                )
            return self._ok(ref, got, digest, _media_type(resp))
        answer = classify_failure(ref, got)
        hint = self.credentials.why_none(ref.credential_host)
        if answer.status is Status.FORBIDDEN and answer.credential_source is None and hint:
            answer = ManifestAnswer(**{**answer.__dict__, "detail": f"{answer.detail}; {hint}"})
        return answer

    def image_config(self, ref: ImageReference, digest: str) -> dict[str, Any]:
        """The OCI config of the image ``digest`` names (through an index for our platform)."""
        manifest, media_type = self._manifest_json(ref, digest)
        if media_type in INDEX_TYPES or "manifests" in manifest:
            chosen = self._choose_platform(ref, manifest)
            manifest, media_type = self._manifest_json(ref, chosen)
        config = manifest.get("config")
        if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
            raise RegistryProblem(Status.UNREACHABLE, f"the manifest of {ref} names no config blob")
        blob_digest = config["digest"]
        got = self._exchange("GET", ref, f"blobs/{blob_digest}", ("*/*",))
        if got.response.status_code != 200:
            answer = classify_failure(ref, got)
            raise RegistryProblem(answer.status, f"config blob {blob_digest}: {answer.detail}")
        body = _read_limited(got.response, MAX_CONFIG_BYTES)
        if body is None or sha256_digest(body) != blob_digest:
            raise RegistryProblem(
                Status.UNREACHABLE, f"config blob of {ref} does not hash to {blob_digest}"
            )
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RegistryProblem(Status.UNREACHABLE, f"config blob of {ref} is not JSON") from None
        if not isinstance(parsed, dict):
            raise RegistryProblem(Status.UNREACHABLE, f"config blob of {ref} is not an object")
        return parsed

    # --- manifests past the first answer -------------------------------------------------
    def _manifest_json(self, ref: ImageReference, digest: str) -> tuple[dict[str, Any], str]:
        got = self._exchange("GET", ref, f"manifests/{digest}", MANIFEST_ACCEPT)
        if got.response.status_code != 200:
            answer = classify_failure(ref, got)
            raise RegistryProblem(answer.status, f"manifest {digest}: {answer.detail}")
        body = _read_limited(got.response, MAX_MANIFEST_BYTES)
        if body is None or sha256_digest(body) != digest:
            raise RegistryProblem(
                Status.UNREACHABLE, f"manifest of {ref} does not hash to {digest}"
            )
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RegistryProblem(Status.UNREACHABLE, f"manifest {digest} is not JSON") from None
        if not isinstance(parsed, dict):
            raise RegistryProblem(Status.UNREACHABLE, f"manifest {digest} is not an object")
        media_type = parsed.get("mediaType") or _media_type(got.response) or ""
        return parsed, str(media_type)

    def _choose_platform(self, ref: ImageReference, index: dict[str, Any]) -> str:
        want_os, want_arch = self.platform
        candidates = [
            m
            for m in index.get("manifests") or []
            if isinstance(m, dict)
            and isinstance(m.get("digest"), str)
            and (m.get("platform") or {}).get("os") == want_os
            and (m.get("platform") or {}).get("architecture") == want_arch
        ]
        if not candidates:
            raise RegistryProblem(
                Status.NOT_FOUND,
                f"{ref} has no {want_os}/{want_arch} image in its index",
            )
        return str(candidates[0]["digest"])

    # --- HTTP and authentication ---------------------------------------------------------
    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Never let requests pick up ~/.netrc or proxies' credentials on its own.
            session.trust_env = False
            self._local.session = session
        return session

    def _url(self, host: str, path: str) -> str:
        scheme = "http" if is_loopback(host) else "https"
        return f"{scheme}://{host}{path}"

    def _send(
        self, method: str, url: str, headers: dict[str, str], what: str, **kwargs: Any
    ) -> requests.Response:
        """One request, retried while the server says "later" (429, 502, 503, 504, 500):
        after its ``Retry-After`` when it sends one, else with exponential backoff, and never
        past ``retry_budget`` seconds of waiting in all. The last answer is returned as is."""
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            resp = self._send_once(method, url, headers, what, **kwargs)
            if resp.status_code not in RETRY_STATUSES:
                return resp
            pause = retry_after(resp.headers.get("Retry-After"), self.clock_wall())
            if pause is None:
                pause = min(BACKOFF_START * 2 ** (attempt - 1), BACKOFF_MAX)
            if attempt >= MAX_ATTEMPTS or waited + pause > self.retry_budget:
                resp.npa_retries = (attempt, waited)  # type: ignore[attr-defined]
                return resp
            resp.close()
            self.sleep(pause)
            waited += pause

    def _send_once(
        self, method: str, url: str, headers: dict[str, str], what: str, **kwargs: Any
    ) -> requests.Response:
        try:
            return self._session().request(
                method,
                url,
                headers=headers,
                timeout=self.timeout,
                allow_redirects=True,
                stream=True,
                **kwargs,
            )
        except requests.Timeout:
            raise RegistryProblem(
                Status.UNREACHABLE, f"{what} did not answer within {self.timeout:g}s"
            ) from None
        except requests.ConnectionError as exc:
            raise RegistryProblem(
                Status.UNREACHABLE, f"cannot connect to {what}: {_reason(exc)}"
            ) from None
        except requests.RequestException as exc:
            raise RegistryProblem(Status.UNREACHABLE, f"{what}: {_reason(exc)}") from None

    def _exchange(
        self, method: str, ref: ImageReference, tail: str, accept: tuple[str, ...]
    ) -> _Exchange:
        host = ref.api_host
        scope = f"repository:{ref.path}:pull"
        url = self._url(host, f"/v2/{ref.path}/{tail}")
        credential = self.credentials.lookup(ref.credential_host)
        headers = {"Accept": ", ".join(accept)}
        cached = self._cached_auth(host, scope)
        if cached:
            headers["Authorization"] = cached[0]
        resp = self._send(method, url, headers, f"registry {host}")
        if resp.status_code != 401:
            return _Exchange(resp, cached[1] if cached else None, bool(cached))
        resp.close()
        challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        authorization, refused, used = self._authorize(host, scope, challenge, credential)
        if authorization is None:
            return _Exchange(resp, used, False, refused)
        self._remember(host, scope, authorization, used)
        headers["Authorization"] = authorization
        resp = self._send(method, url, headers, f"registry {host}")
        return _Exchange(resp, used, True)

    def _authorize(
        self,
        host: str,
        scope: str,
        challenge: _Challenge | None,
        credential: Credential | None,
    ) -> tuple[str | None, str | None, Credential | None]:
        """The Authorization header the challenge asks for and the credential it carries, or
        (None, why not, None)."""
        if challenge is None:
            return None, f"{host} answered 401 without saying how to authenticate", None
        if challenge.scheme == "basic":
            return _basic_answer(host, credential)
        if challenge.scheme != "bearer":
            why = f"{host} asks for {challenge.scheme!r} authentication, which npa lacks"
            return None, why, None
        return self._bearer(host, scope, challenge, credential)

    def _bearer(
        self, host: str, scope: str, challenge: _Challenge, credential: Credential | None
    ) -> tuple[str | None, str | None, Credential | None]:
        """A Bearer challenge: ask its token service (with the credential, where it may go)."""
        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            return None, f"{host} names no usable token service (realm {realm!r})", None
        realm_host = realm.split("://", 1)[1].split("/", 1)[0]
        if realm.startswith("http://") and not is_loopback(realm_host):
            # Credentials never travel in clear text to a host off this machine.
            credential = None
        params: dict[str, str] = {"scope": challenge.params.get("scope") or scope}
        if challenge.params.get("service"):
            params["service"] = challenge.params["service"]
        headers = {"Accept": "application/json"}
        what = f"token service {realm_host}"
        if credential is not None and credential.identity_token:
            # An identity token is an OAuth2 refresh token: exchanged with a POST, as docker does.
            form = {**params, "grant_type": "refresh_token", "refresh_token": credential.secret}
            resp = self._send("POST", realm, headers, what, data={**form, "client_id": "npa"})
        else:
            if credential is not None:
                headers["Authorization"] = _basic(credential)
            resp = self._send("GET", realm, headers, what, params=params)
        if resp.status_code in (401, 403):
            resp.close()
            who = f"the credentials from {credential.source}" if credential else "anonymous access"
            why = f"the token service {realm_host} refused {who} (HTTP {resp.status_code})"
            return None, why, credential
        return f"Bearer {_token_of(resp, realm_host)}", None, credential

    def _cached_auth(self, host: str, scope: str) -> tuple[str, Credential | None] | None:
        with self._lock:
            # A Basic credential is good for every repository of its host.
            entry = self._auth.get((host, scope)) or self._auth.get((host, _ANY_SCOPE))
            if entry is None or entry[2] <= time.monotonic():
                return None
            return entry[0], entry[1]

    def _remember(
        self, host: str, scope: str, authorization: str, credential: Credential | None
    ) -> None:
        # Tokens last at least 60 s by the token spec; renew well before that.
        if authorization.startswith("Basic "):
            scope = _ANY_SCOPE
        with self._lock:
            self._auth[(host, scope)] = (authorization, credential, time.monotonic() + 45)

    def _ok(
        self, ref: ImageReference, exchange: _Exchange, digest: str, media_type: str | None
    ) -> ManifestAnswer:
        exchange.response.close()
        if ref.digest and digest != ref.digest:
            return ManifestAnswer(
                Status.UNREACHABLE,
                f"{ref.api_host} answered digest {digest} for a reference pinned to {ref.digest}",
                credential_source=_source(exchange),
            )
        return ManifestAnswer(
            Status.OK,
            f"{ref.api_host} serves {ref.path}@{digest}",
            digest=digest,
            media_type=media_type,
            http_status=200,
            credential_source=_source(exchange),
        )


def classify_failure(ref: ImageReference, exchange: _Exchange) -> ManifestAnswer:
    """Turn a non-200 answer into not_found / forbidden / unreachable with a reason."""
    resp = exchange.response
    code, message = _error_code(resp)
    status_code = resp.status_code
    resp.close()
    source = _source(exchange)
    where = f"{ref.api_host}/{ref.path}:{ref.reference}" if not ref.digest else str(ref)
    said = f" ({code}{': ' + message if message else ''})" if code else ""
    if status_code == 401 or status_code == 403 or code in FORBIDDEN_CODES:
        if exchange.token_refused:
            why = exchange.token_refused
        elif exchange.authenticated and exchange.credential is not None:
            why = f"the credentials from {exchange.credential.source} do not allow pulling it"
        elif exchange.authenticated:
            why = "anonymous pulls are refused"
        else:
            why = "it needs credentials and none were found for this host"
        return ManifestAnswer(
            Status.FORBIDDEN,
            f"{ref.credential_host} refused {where}: {why} (HTTP {status_code}){said}",
            http_status=status_code,
            error_code=code,
            credential_source=source,
        )
    if status_code == 404 or code in NOT_FOUND_CODES:
        what = "repository" if code == "NAME_UNKNOWN" else "tag or digest"
        return ManifestAnswer(
            Status.NOT_FOUND,
            f"{ref.api_host} has no such {what}: {where} (HTTP {status_code}){said}",
            http_status=status_code,
            error_code=code,
            credential_source=source,
        )
    return ManifestAnswer(
        Status.UNREACHABLE,
        f"{ref.api_host} could not answer for {where} (HTTP {status_code}){said}{_retries(resp)}",
        http_status=status_code,
        error_code=code,
        credential_source=source,
    )


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date), or None
    when there is none or it cannot be read."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _retries(resp: requests.Response) -> str:
    """How a request was retried before this answer, for the reader."""
    done = getattr(resp, "npa_retries", None)
    if not done:
        return ""
    attempts, waited = done
    return f"; still so after {plural(attempts, 'attempt')} and {waited:.1f}s of backoff"


def _source(exchange: _Exchange) -> str | None:
    return exchange.credential.source if exchange.credential else None


def _basic_answer(
    host: str, credential: Credential | None
) -> tuple[str | None, str | None, Credential | None]:
    """A Basic challenge: the credential itself, unless it is an identity token."""
    if credential is None:
        return None, None, None
    if credential.identity_token:
        why = (
            f"{host} asks for Basic authentication and {credential.source} holds an "
            "identity token, which only a token service accepts"
        )
        return None, why, credential
    return _basic(credential), None, credential


def _token_of(resp: Any, realm_host: str) -> str:
    """The token a token service answered with; anything but a 200 with a token is
    UNREACHABLE (the registry's access cannot be judged)."""
    if resp.status_code != 200:
        resp.close()
        raise RegistryProblem(
            Status.UNREACHABLE,
            f"token service {realm_host} answered HTTP {resp.status_code}{_retries(resp)}",
        )
    try:
        body = json.loads(_read_limited(resp, 1024 * 1024) or b"")
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        raise RegistryProblem(Status.UNREACHABLE, f"token service {realm_host} sent no token")
    return token


def _basic(credential: Credential) -> str:
    import base64

    raw = f"{credential.username}:{credential.secret}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def _digest_header(resp: requests.Response) -> str:
    return resp.headers.get("Docker-Content-Digest", "").strip()


def _media_type(resp: requests.Response) -> str | None:
    value = resp.headers.get("Content-Type", "").split(";", 1)[0].strip()
    return value or None


def _error_code(resp: requests.Response) -> tuple[str | None, str | None]:
    """The first ``errors[].code`` of a distribution error body (GET only)."""
    if resp.request is not None and resp.request.method == "HEAD":
        return None, None
    body = _read_limited(resp, 64 * 1024)
    if not body:
        return None, None
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, None
    errors = data.get("errors") if isinstance(data, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        code = errors[0].get("code")
        message = errors[0].get("message")
        return (
            str(code) if code else None,
            clipped(str(message), 200) if message else None,
        )
    return None, None


def _read_limited(resp: requests.Response, limit: int) -> bytes | None:
    """The body, or None when it is larger than ``limit`` (streamed so a huge one is cut)."""
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in resp.iter_content(64 * 1024):
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    except requests.RequestException:
        return None
    finally:
        resp.close()
    return b"".join(chunks)


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "reset"):
        if marker in text:
            return marker.lower()
    return type(exc).__name__
