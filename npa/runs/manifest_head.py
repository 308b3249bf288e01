"""A stored manifest's head: the fields ``list`` prints and the identity fields, read without
the full manifest model (which imports the plan and spec models ``list`` never shows).

The bytes are refused in the words :func:`npa.runs.manifest.parse_manifest` uses when they are
not JSON or these fields do not have their types, so ``list`` and ``status`` name a corrupt
manifest alike; whose record it is goes through :func:`npa.runs.identity_rule.check_run_identity`,
as everywhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Any

from npa.adapters.storage import ObjectAbsent, ObjectStore, inspect_command
from npa.core.errors import StateCorrupt
from npa.core.layout import manifest_key


@dataclasses.dataclass
class ManifestHead:
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
        return _head(json.loads(raw))
    except ValueError as exc:  # not JSON, or pydantic's ValidationError
        raise StateCorrupt(
            f"{store.uri}/{key} is not an npa run manifest: {exc}",
            fix=inspect_command(store, key) + "  # inspect before resubmitting",
        ) from None


def _head(data: Any) -> ManifestHead:
    """The head of a parsed manifest. A manifest npa wrote has every field with exactly its
    type and is taken as it is; anything else goes through pydantic (imported only then), which
    converts what it converts and words the refusal as it does for every other model."""
    if isinstance(data, dict) and all(
        name in data and exact(data[name]) for name, exact in _FIELDS
    ):
        return ManifestHead(**{name: data[name] for name, _ in _FIELDS})
    return ManifestHead(**_validator().model_validate(data).model_dump())


# Each field's annotation and the values taken as they are for it (a bool is no int here).
_EXACT: dict[str, typing.Callable[[Any], bool]] = {
    "str": lambda v: type(v) is str,
    "int | None": lambda v: v is None or type(v) is int,
}
_FIELDS = [(f.name, _EXACT[str(f.type)]) for f in dataclasses.fields(ManifestHead)]


@functools.cache
def _validator() -> Any:
    """A pydantic model of :class:`ManifestHead`'s fields, named alike (so its messages are)."""
    from pydantic import create_model

    hints = typing.get_type_hints(ManifestHead)
    fields: dict[str, Any] = {
        f.name: (hints[f.name], f.default if f.default is not dataclasses.MISSING else ...)
        for f in dataclasses.fields(ManifestHead)
    }
    return create_model("ManifestHead", **fields)
