"""Opening a run's store for reading: one definition for every reader (``status``, ``list``,
``logs``, ...), light enough for ``list``'s read path."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from npa.adapters.storage import ObjectStore, open_store
from npa.adapters.storage.bounded import BoundedStore, read_timeout
from npa.core.paths import NpaPaths

if TYPE_CHECKING:
    from npa.runs.receipts import Receipt
    from npa.services.configure import ProjectSettings


def open_run_store(
    store_uri: str, settings: ProjectSettings, receipt: Receipt | None, paths: NpaPaths
) -> ObjectStore:
    """The run's store, with the S3 settings the submit used (its receipt) or the project's,
    every operation bounded by the read timeout (a silent store is unavailable, not slow)."""
    recorded = receipt if receipt is not None and receipt.store == store_uri else None
    seconds = read_timeout()
    store = open_store(
        store_uri,
        endpoint_url=(recorded and recorded.endpoint_url) or settings.value("endpoint_url"),
        region=(recorded and recorded.region) or settings.value("region"),
        profile=(recorded and recorded.profile) or settings.value("profile"),
        max_connections=16,
        max_attempts=2,
        fix_hint=shlex.join(["npa", "configure", "--show", "--project", settings.project]),
        paths=paths,
        # The store spends its own budget in parts (a third per socket read for botocore, half
        # for obstore); three times the bound keeps every part longer than the bound, so the
        # BoundedStore answers first, naming the store and the time it was given.
        timeout=3 * seconds,
    )
    return BoundedStore(store, seconds)
