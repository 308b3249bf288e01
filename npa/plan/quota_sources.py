"""Where quota evidence comes from: a reviewed file, the local store's disk, the Nebius API.

Each source answers only for the quotas it knows; anything it cannot answer is left to the
arithmetic in :mod:`npa.plan.quota`, which treats silence and failure as unknown.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npa import __version__
from npa.core.errors import InvalidInput, Unavailable
from npa.plan.infra import LOCAL_STORE_SIZE
from npa.plan.quota import ExistingDisk, QuotaReading, QuotaSource
from npa.spec.loader import load_text
from npa.spec.validate import format_path


def _read_yaml(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc}", fix=f"ls -l {path}") from None
    doc, problems = load_text(text)
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
            fix=f"edit {path}",
        )
    return value


class FileQuotaSource:
    """Quota figures written down for offline review (``--quota-file``).

    Format::

        source: console export 2026-11-29     # optional label
        quotas:
          compute.disk.size.network-ssd: {limit: 1374389534720, usage: 1351840423936}
          compute.disk.count: {limit: 32, usage: 3}
          local.store.size: {unlimited: true}
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        data = _read_yaml(path, "quota file")
        if not isinstance(data, dict) or not isinstance(data.get("quotas"), dict):
            raise InvalidInput(
                f"quota file {path} must be a mapping with a 'quotas' mapping",
                fix=f"cat {shlex.quote(str(path))}  # quotas: {{NAME: {{limit: N, usage: N}}}}",
            )
        unknown = set(data) - {"source", "quotas", "region"}
        if unknown:
            raise InvalidInput(f"quota file {path}: unknown keys {sorted(unknown)}")
        self.label = str(data.get("source") or path.name)
        self.readings: dict[str, QuotaReading] = {}
        for name, entry in data["quotas"].items():
            where = format_path(("quotas", str(name)))
            if not isinstance(entry, dict) or set(entry) - {
                "limit",
                "usage",
                "unlimited",
                "region",
            }:
                raise InvalidInput(
                    f"{path}: {where} must be a mapping of limit, usage (or unlimited: true)"
                )
            unlimited = entry.get("unlimited", False)
            if not isinstance(unlimited, bool):
                raise InvalidInput(f"{path}: {where}.unlimited must be true or false")
            self.readings[str(name)] = QuotaReading(
                source=self.name,
                name=str(name),
                limit=_figure(entry.get("limit"), f"{where}.limit", path),
                usage=_figure(entry.get("usage"), f"{where}.usage", path),
                unlimited=unlimited,
                region=entry.get("region") or data.get("region"),
            )

    @property
    def name(self) -> str:
        return f"file:{self.path.name}"

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        return [self.readings[n] for n in names if n in self.readings]


class LocalStoreSource:
    """The local target: its only allowance is the free space of the store's filesystem.

    The store directory may not exist yet (nothing has run); its nearest existing parent is on
    the filesystem it will be created on. Nothing is created or written.
    """

    def __init__(self, store: Path) -> None:
        self.store = store

    @property
    def name(self) -> str:
        return "local"

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        if LOCAL_STORE_SIZE not in names:
            return []
        probe = self.store
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        stats = os.statvfs(probe)
        used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
        free = stats.f_bavail * stats.f_frsize
        # limit - usage is exactly the space an unprivileged writer can still use.
        return [
            QuotaReading(source=self.name, name=LOCAL_STORE_SIZE, limit=used + free, usage=used)
        ]


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
        try:
            from nebius.sdk import SDK
        except ImportError as exc:  # pragma: no cover - nebius is a declared dependency
            raise Unavailable(
                f"the nebius SDK cannot be imported ({exc})", fix="pip install 'nebius==0.6.29'"
            ) from None
        kwargs: dict[str, Any] = {"user_agent_prefix": f"npa/{__version__}"}
        if self.credentials is not None:
            kwargs["credentials"] = self.credentials
        if self.endpoint:
            from nebius.base.resolver import Constant

            kwargs["resolver"] = Constant(self.endpoint)
            kwargs["domain"] = self.endpoint
            if _is_loopback(self.endpoint):
                kwargs["options"] = [("nebius.insecure", True)]
        try:
            return SDK(**kwargs)
        except Exception as exc:  # the SDK raises its own errors for missing credentials
            raise Unavailable(
                f"cannot start the Nebius SDK: {exc}",
                fix="export NEBIUS_IAM_TOKEN=$(nebius iam get-access-token)",
            ) from None

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
                    code = getattr(getattr(exc, "status", None), "code", None)
                    code_name = getattr(code, "name", str(code))
                    readings.append(self._failed(name, f"quota API answered {code_name}"))
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
        return QuotaReading(source=self.name, name=name, region=self.region, error=why)

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
        )


def load_existing(path: Path) -> list[ExistingDisk]:
    """Existing-disk evidence (``--existing``): a list of {role, size_gib, disk_type, evidence}."""
    from pydantic import ValidationError

    data = _read_yaml(path, "existing-resources file")
    if isinstance(data, dict) and set(data) == {"existing"}:
        data = data["existing"]
    if not isinstance(data, list):
        raise InvalidInput(f"{path} must be a list of existing disks (or existing: [...])")
    disks = []
    for i, item in enumerate(data):
        try:
            disks.append(ExistingDisk.model_validate(item))
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = format_path(
                ("existing", i, *[p for p in first["loc"] if isinstance(p, str | int)])
            )
            raise InvalidInput(f"{path}: {where}: {first['msg']}", fix=f"edit {path}") from None
    return disks


def quota_sources(
    files: Sequence[Path] = (),
    *,
    nebius: tuple[str, str, str | None] | None = None,
    local_store: Path | None = None,
    extra: Sequence[QuotaSource] = (),
) -> list[QuotaSource]:
    """Every source a quota check asks, in one order: reviewed files, the Nebius API
    (``nebius``: parent id, region, endpoint), the local store's disk, then any given."""
    sources: list[QuotaSource] = [FileQuotaSource(f) for f in files]
    if nebius is not None:
        parent, region, endpoint = nebius
        sources.append(NebiusQuotaSource(parent, region, endpoint=endpoint))
    if local_store is not None:
        sources.append(LocalStoreSource(local_store))
    sources.extend(extra)
    return sources
