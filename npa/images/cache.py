"""What preflight proved about an image, kept by digest plus contract version.

A digest names immutable content, so a verification of it stays true, except that a new
bootstrap contract version asks new questions: an entry written under another version is a
miss. A probe result also depends on the user the probe ran as, which is part of its key.

Files live under ``$NPA_HOME/cache/images/`` (0700 directory, 0600 files) and hold no
credential and no registry answer beyond the digest and what was verified.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from npa.core.errors import LocalStateUnavailable, StateCorrupt
from npa.core.fsio import atomic_write_json, read_json
from npa.core.paths import NpaPaths
from npa.images.contract import CONTRACT_VERSION

VerifiedBy = Literal["contract", "probe"]


class CacheEntry(BaseModel):
    digest: str
    contract_version: int
    verified_by: VerifiedBy
    user: int  # declared (contract) or observed (probe) UID
    probe_run_as_user: int | None = None  # the UID a probe ran as; None for contract
    checked_at: str


class VerificationCache:
    """Owner-only cache of verified digests.

    With ``defer``, verifications are kept in memory until :meth:`commit`: a check whose
    caller may still refuse (submit's gates) writes nothing unless the caller goes on."""

    def __init__(self, paths: NpaPaths, *, defer: bool = False) -> None:
        self.dir = paths.cache("images")
        self.defer = defer
        self.pending: dict[Path, CacheEntry] = {}

    def _file(self, digest: str) -> Path:
        algorithm, _, hexpart = digest.partition(":")
        return self.dir / f"{algorithm}-{hexpart}.json"

    def lookup(self, digest: str, run_as_user: int) -> CacheEntry | None:
        """The entry for ``digest`` when it holds for this contract version and user."""
        path = self._file(digest)
        entry = self.pending.get(path)
        if entry is None:
            if not path.is_file():
                return None
            try:
                entry = CacheEntry.model_validate(read_json(path))
            except (StateCorrupt, ValidationError, OSError):
                return None  # rewritten by the next verification
        if entry.digest != digest or entry.contract_version != CONTRACT_VERSION:
            return None
        if entry.verified_by == "probe" and entry.probe_run_as_user != run_as_user:
            return None
        return entry

    def store(
        self, digest: str, verified_by: VerifiedBy, user: int, probe_run_as_user: int | None
    ) -> bool:
        """Record a verification; False when the state directory cannot be written."""
        entry = CacheEntry(
            digest=digest,
            contract_version=CONTRACT_VERSION,
            verified_by=verified_by,
            user=user,
            probe_run_as_user=probe_run_as_user,
            checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        if self.defer:
            self.pending[self._file(digest)] = entry
            return True
        return self._write(self._file(digest), entry)

    def commit(self) -> None:
        """Write the verifications a deferring cache kept back."""
        for path, entry in self.pending.items():
            self._write(path, entry)
        self.pending.clear()

    @staticmethod
    def _write(path: Path, entry: CacheEntry) -> bool:
        with contextlib.suppress(OSError, LocalStateUnavailable):
            atomic_write_json(path, entry.model_dump(mode="json"))
            return True
        return False
