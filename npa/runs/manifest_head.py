"""A stored manifest's head: the fields ``list`` prints and the identity fields, read without
the full manifest model (which imports the plan and spec models ``list`` never shows).

The bytes are refused in the words :func:`npa.runs.manifest.parse_manifest` uses when they are
not JSON or these fields do not have their types, so ``list`` and ``status`` name a corrupt
manifest alike; whose record it is goes through :func:`npa.runs.identity_rule.check_run_identity`,
as everywhere else.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from npa.adapters.storage import ObjectAbsent, ObjectStore, inspect_command
from npa.core.errors import StateCorrupt
from npa.core.layout import manifest_key


class ManifestHead(BaseModel):
    """The fields of a run manifest that ``list`` reads; the rest are ignored, not checked."""

    project: str
    workflow: str
    run_id: str
    prefix: str
    backend: str
    state: str
    submitted_at: str
    updated_at: str
    job_id: int | None = None


def read_manifest_head(store: ObjectStore, prefix: str) -> ManifestHead | None:
    """The manifest's head, or None when the store says it does not exist (errors propagate)."""
    key = manifest_key(prefix)
    try:
        raw = store.get(key)
    except ObjectAbsent:
        return None
    try:
        return ManifestHead.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise StateCorrupt(
            f"{store.uri}/{key} is not an npa run manifest: {exc}",
            fix=inspect_command(store, key) + "  # inspect before resubmitting",
        ) from None
