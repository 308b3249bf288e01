"""Where quota evidence comes from: a reviewed file, the local store's disk, the Nebius API.

Each source answers only for the quotas it knows; anything it cannot answer is left to the
arithmetic in :mod:`npa.plan.quota`, which treats silence and failure as unknown.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from npa import __version__
from npa.core.commands import edit_command
from npa.core.errors import InvalidInput, Unavailable
from npa.core.userfiles import read_user_text
from npa.plan.evidence import DiskFacts
from npa.plan.infra import LOCAL_STORE_SIZE, known_quotas
from npa.plan.quota import ExistingDisk, QuotaReading, QuotaSource
from npa.spec.loader import load_text
from npa.spec.validate import format_path


def _read_yaml(path: Path, what: str) -> Any:
    doc, problems = load_text(read_user_text(path, what, encodings="yaml"))
    if doc is None:
        p = problems[0]
        where = f" at {p.line}:{p.column}" if p.line else ""
        raise InvalidInput(f"{what} {path} is not valid YAML{where}: {p.message}")
    return doc.data


def _figure(value: Any, where: str, path: Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(
            f"{path}: {where} must be a whole number of bytes or units, got {value!r}",
            fix=edit_command(path),
        )
    return value


def _label(value: Any, where: str, path: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{path}: {where} must be a non-empty string, got {value!r}")
    return value


class FileQuotaSource:
    """Quota figures written down for offline review (``--quota-file``).

    Format::

        source: console export 2026-11-29     # optional label
        region: eu-north1                     # what the figures were read for
        project: project-e00example           # optional; checked when the plan names one
        quotas:
          compute.disk.size.network-ssd: {limit: 1374389534720, usage: 1351840423936}
          compute.disk.count: {limit: 32, usage: 3}

    Every quota name must be one npa knows (a misspelt name is an input error, never silently
    ignored); ``region`` and ``project`` may also be given per line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        data = _read_yaml(path, "quota file")
        if not isinstance(data, dict) or not isinstance(data.get("quotas"), dict):
            raise InvalidInput(
                f"quota file {path} must be a mapping with a 'quotas' mapping",
                fix=f"cat {shlex.quote(str(path))}  # quotas: {{NAME: {{limit: N, usage: N}}}}",
            )
        unknown = set(data) - {"source", "quotas", "region", "project"}
        if unknown:
            raise InvalidInput(
                f"quota file {path}: unknown keys {sorted(map(str, unknown))} "
                "(allowed: source, region, project, quotas)",
                fix=edit_command(path),
            )
        self.label = _label(data.get("source"), "source", path) or path.name
        region = _label(data.get("region"), "region", path)
        project = _label(data.get("project"), "project", path)
        known = known_quotas()
        misspelt = [str(n) for n in data["quotas"] if str(n) not in known]
        if misspelt:
            raise InvalidInput(
                f"quota file {path}: unknown quota name(s) "
                + "; ".join(f"{n!r}{_did_you_mean(n, known)}" for n in misspelt)
                + f" (npa knows: {', '.join(known)})",
                fix=edit_command(path),
                details={"unknown": misspelt, "known": known},
            )
        self.readings: dict[str, QuotaReading] = {}
        for name, entry in data["quotas"].items():
            where = format_path(("quotas", str(name)))
            if not isinstance(entry, dict) or set(entry) - {
                "limit",
                "usage",
                "unlimited",
                "region",
                "project",
            }:
                raise InvalidInput(
                    f"{path}: {where} must be a mapping of limit, usage (or unlimited: true), "
                    "and optionally region and project",
                    fix=edit_command(path),
                )
            unlimited = entry.get("unlimited", False)
            if not isinstance(unlimited, bool):
                raise InvalidInput(
                    f"{path}: {where}.unlimited must be true or false", fix=edit_command(path)
                )
            self.readings[str(name)] = QuotaReading(
                source=self.name,
                name=str(name),
                limit=_figure(entry.get("limit"), f"{where}.limit", path),
                usage=_figure(entry.get("usage"), f"{where}.usage", path),
                unlimited=unlimited,
                region=_label(entry.get("region"), f"{where}.region", path) or region,
                project=_label(entry.get("project"), f"{where}.project", path) or project,
            )

    @property
    def name(self) -> str:
        return f"file:{self.path.name}"

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        return [self.readings[n] for n in names if n in self.readings]


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _filesystem(path: Path) -> tuple[Path, os.statvfs_result, int]:
    """The nearest existing parent of ``path`` (it may not exist yet), its statvfs and device."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe, os.statvfs(probe), os.stat(probe).st_dev


class LocalStoreSource:
    """The local target: its only allowance is the free space where its data goes: the
    filesystem of the configured ``file://`` store, and the one the local executor works in
    (``work``), the tighter of the two when they differ. An ``s3://`` store has no disk here,
    so only ``work`` counts. Nothing is created or written.
    """

    def __init__(self, store: Path | None, work: Path | None = None) -> None:
        self.store = store
        self.work = work

    @property
    def name(self) -> str:
        return "local"

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        if LOCAL_STORE_SIZE not in names:
            return []
        seen: dict[int, tuple[int, int]] = {}
        for path in (self.store, self.work):
            if path is None:
                continue
            _, stats, device = _filesystem(path)
            used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
            free = stats.f_bavail * stats.f_frsize
            seen[device] = (used, free)
        if not seen:
            return []
        # limit - usage is exactly the space an unprivileged writer can still use.
        used, free = min(seen.values(), key=lambda figures: figures[1])
        return [
            QuotaReading(source=self.name, name=LOCAL_STORE_SIZE, limit=used + free, usage=used)
        ]


def local_store_source(store_uri: str, work: Path) -> LocalStoreSource:
    """The local quota source for a project's store URI (``file://`` or ``s3://``)."""
    parsed = urlparse(store_uri)
    store = Path(unquote(parsed.path)) if parsed.scheme == "file" else None
    return LocalStoreSource(store, work)


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _status(error: Exception) -> str:
    """The gRPC status name of a Nebius SDK RequestError (``NOT_FOUND``...)."""
    code = getattr(getattr(error, "status", None), "code", None)
    return str(getattr(code, "name", code))


def nebius_sdk(endpoint: str | None, credentials: str | None) -> Any:
    """A Nebius SDK client. Credentials are found the way the SDK finds them unless given;
    ``endpoint`` overrides the API address (a loopback test server is reached without TLS)."""
    try:
        from nebius.sdk import SDK
    except ImportError as exc:  # pragma: no cover - nebius is a declared dependency
        raise Unavailable(
            f"the nebius SDK cannot be imported ({exc})", fix="pip install 'nebius==0.6.29'"
        ) from None
    kwargs: dict[str, Any] = {"user_agent_prefix": f"npa/{__version__}"}
    if credentials is not None:
        kwargs["credentials"] = credentials
    if endpoint:
        from nebius.base.resolver import Constant

        kwargs["resolver"] = Constant(endpoint)
        kwargs["domain"] = endpoint
        if _is_loopback(endpoint):
            kwargs["options"] = [("nebius.insecure", True)]
    try:
        return SDK(**kwargs)
    except Exception as exc:  # the SDK raises its own errors for missing credentials
        raise Unavailable(
            f"cannot start the Nebius SDK: {exc}",
            fix="export NEBIUS_IAM_TOKEN=$(nebius iam get-access-token)",
        ) from None


class NebiusQuotaSource:
    """The Nebius quota-allowance API (``nebius.quotas.v1.QuotaAllowanceService.GetByName``).

    Credentials are found the way the Nebius SDK finds them (``NEBIUS_IAM_TOKEN`` or the
    nebius CLI profile); npa never stores them. ``endpoint`` overrides the API address (a
    private endpoint, or a loopback test server, which is reached without TLS).
    """

    def __init__(
        self,
        parent_id: str,
        region: str,
        *,
        endpoint: str | None = None,
        credentials: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        self.parent_id = parent_id
        self.region = region
        self.endpoint = endpoint
        self.credentials = credentials
        self.timeout = timeout

    @property
    def name(self) -> str:
        return f"nebius:{self.region}"

    def _sdk(self) -> Any:
        return nebius_sdk(self.endpoint, self.credentials)

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        from nebius.aio.service_error import RequestError
        from nebius.api.nebius.quotas.v1 import (
            GetByNameRequest,
            QuotaAllowanceServiceClient,
            QuotaAllowanceStatus,
        )

        sdk = self._sdk()
        readings = []
        try:
            client = QuotaAllowanceServiceClient(sdk)
            for name in names:
                request = GetByNameRequest(parent_id=self.parent_id, name=name, region=self.region)
                try:
                    allowance = client.get_by_name(
                        request, timeout=self.timeout, per_retry_timeout=self.timeout / 3
                    ).wait()
                except RequestError as exc:
                    readings.append(self._failed(name, f"quota API answered {_status(exc)}"))
                    continue
                except Exception as exc:
                    readings.append(self._failed(name, f"quota API call failed: {exc}"))
                    continue
                readings.append(self._reading(name, allowance, QuotaAllowanceStatus))
        finally:
            # Closing must not hide the answer we already have.
            with contextlib.suppress(Exception):
                sdk.sync_close(timeout=5)
        return readings

    def _failed(self, name: str, why: str) -> QuotaReading:
        return QuotaReading(
            source=self.name, name=name, region=self.region, project=self.parent_id, error=why
        )

    def _reading(self, name: str, allowance: Any, status_type: Any) -> QuotaReading:
        status = allowance.status
        if status.state != status_type.State.STATE_ACTIVE:
            return self._failed(name, f"allowance state is {status.state.name}, not ACTIVE")
        if status.usage_state == status_type.UsageState.USAGE_STATE_UNKNOWN:
            return self._failed(name, "the API says current usage is unknown")
        unit = (status.unit or "").lower()
        if name.startswith("compute.disk.size.") and unit not in {"", "byte", "bytes"}:
            return self._failed(name, f"unexpected unit {status.unit!r} for a byte allowance")
        limit = allowance.spec.limit
        if limit is None:
            return self._failed(name, "the allowance has no limit set")
        return QuotaReading(
            source=self.name,
            name=name,
            limit=int(limit),
            usage=int(status.usage),
            region=self.region,
            project=self.parent_id,
        )


class NebiusDiskLookup:
    """Asks the Nebius compute API (``DiskService.Get``) about one disk: the provider lookup
    that proves an existing disk (see :mod:`npa.plan.evidence`)."""

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        credentials: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        self.endpoint = endpoint
        self.credentials = credentials
        self.timeout = timeout

    def get(self, disk_id: str) -> DiskFacts | None:
        """The disk's facts, None when the API answers NOT_FOUND; Unavailable otherwise."""
        from nebius.aio.service_error import RequestError
        from nebius.api.nebius.compute.v1 import DiskServiceClient, GetDiskRequest

        sdk = nebius_sdk(self.endpoint, self.credentials)
        try:
            request = GetDiskRequest(id=disk_id)
            disk = (
                DiskServiceClient(sdk)
                .get(request, timeout=self.timeout, per_retry_timeout=self.timeout / 3)
                .wait()
            )
        except RequestError as exc:
            code_name = _status(exc)
            if code_name == "NOT_FOUND":
                return None
            raise Unavailable(f"the compute API answered {code_name} for disk {disk_id}") from None
        except Exception as exc:
            raise Unavailable(f"the compute API call for disk {disk_id} failed: {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                sdk.sync_close(timeout=5)
        return DiskFacts(
            id=disk_id,
            project=str(disk.metadata.parent_id),
            size_bytes=int(disk.status.size_bytes),
            disk_type=str(disk.spec.type.name),
            state=str(disk.status.state.name),
        )


def load_existing(path: Path) -> list[ExistingDisk]:
    """Existing-disk evidence (``--existing``): a list of {role, size_gib, disk_type, evidence}."""
    from pydantic import ValidationError

    data = _read_yaml(path, "existing-resources file")
    if isinstance(data, dict) and set(data) == {"existing"}:
        data = data["existing"]
    if not isinstance(data, list):
        raise InvalidInput(
            f"{path} must be a list of existing disks (or existing: [...])",
            fix=edit_command(path) + "  # see docs/spec.md#existing-resources",
        )
    disks = []
    problems: list[str] = []
    for i, item in enumerate(data):
        try:
            disks.append(ExistingDisk.model_validate(item))
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                parts: list[str | int] = ["existing", i]
                for part in error["loc"]:  # a union's tag repeats the key that chose it
                    if isinstance(part, str | int) and part != parts[-1]:
                        parts.append(part)
                where = format_path(parts)
                problems.append(f"{where}: {error['msg']}")
    if problems:
        raise InvalidInput(
            f"{path} is not a valid existing-resources file: " + "; ".join(problems),
            fix=edit_command(path) + "  # see docs/spec.md#existing-resources",
            details={"problems": problems},
        )
    return disks


def quota_sources(
    files: Sequence[Path] = (),
    *,
    api: QuotaSource | None = None,
    local: LocalStoreSource | None = None,
    extra: Sequence[QuotaSource] = (),
) -> list[QuotaSource]:
    """Every source a quota check asks, in one order: reviewed files, the target's cloud quota
    API (``api``, e.g. a :class:`NebiusQuotaSource`), the local target's disks, then any
    given."""
    sources: list[QuotaSource] = [FileQuotaSource(f) for f in files]
    if api is not None:
        sources.append(api)
    if local is not None:
        sources.append(local)
    sources.extend(extra)
    return sources
