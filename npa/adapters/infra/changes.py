"""Per-resource changes read from the Pulumi engine's events.

The engine reports each step (create, update, replace, delete, same) with the old and new
inputs and the list of properties that differ. This module turns those events into plain
records npa can print and dump as JSON. It never shows secret values: the engine masks them,
and properties a dynamic provider keeps for itself (``__provider``) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

# Operations that change something, in the order a reviewer reads them.
MUTATING = ("create", "update", "replace", "delete")
# Engine step kinds folded into the four a reviewer cares about.
_OP_NAMES = {
    "create": "create",
    "update": "update",
    "replace": "replace",
    "create-replacement": "replace",
    "delete-replaced": "replace",
    "delete": "delete",
    "discard": "delete",
    "same": "same",
    "read": "read",
    "refresh": "refresh",
    "import": "import",
    "import-replacement": "replace",
}
_MAX_VALUE = 200


class PropertyChange(BaseModel):
    """One property that differs: ``kind`` is add, delete or update (``-replace`` forces a
    replacement)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    kind: str
    old: Any = None
    new: Any = None


class ResourceChange(BaseModel):
    """What the engine will do (preview) or did (up/destroy) to one resource."""

    model_config = ConfigDict(extra="forbid")

    urn: str
    type: str
    name: str
    op: str
    properties: list[PropertyChange] = []

    def text(self) -> str:
        return f"{self.op} {self.type} {self.name}"


def _short(value: Any) -> Any:
    text = repr(value)
    if len(text) > _MAX_VALUE:
        return text[: _MAX_VALUE - 3] + "..."
    return value


def _lookup(props: Mapping[str, Any] | None, path: str) -> Any:
    """The value at a diff path such as ``metadata.labels["a"]`` or ``rules[0].verbs``."""
    current: Any = props or {}
    for part in _split_path(path):
        if isinstance(current, Mapping) and isinstance(part, str):
            current = current.get(part)
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            return None
    return current


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    token = ""
    i = 0
    while i < len(path):
        ch = path[i]
        if ch == ".":
            if token:
                parts.append(token)
            token = ""
        elif ch == "[":
            if token:
                parts.append(token)
            token = ""
            end = path.index("]", i)
            inner = path[i + 1 : end]
            parts.append(int(inner) if inner.isdigit() else inner.strip("\"'"))
            i = end
        else:
            token += ch
        i += 1
    if token:
        parts.append(token)
    return parts


def _visible(path: str) -> bool:
    return not path.startswith("__")


def property_changes(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    diffs: Iterable[str] | None,
    detailed: Mapping[str, Any] | None,
) -> list[PropertyChange]:
    """The property diff of one step: the provider's detailed diff when it gave one, else the
    top-level keys the engine reports as different."""
    out: list[PropertyChange] = []
    if detailed:
        for path, diff in sorted(detailed.items()):
            if not _visible(path):
                continue
            kind = getattr(getattr(diff, "diff_kind", None), "value", None) or str(
                getattr(diff, "diff_kind", "update")
            )
            use_inputs = bool(getattr(diff, "input_diff", True))
            before = _lookup(old, path) if use_inputs or old else None
            after = _lookup(new, path)
            out.append(PropertyChange(path=path, kind=kind, old=_short(before), new=_short(after)))
        return out
    for key in sorted(diffs or ()):
        if not _visible(key):
            continue
        before = (old or {}).get(key)
        after = (new or {}).get(key)
        kind = "add" if before is None else "delete" if after is None else "update"
        out.append(PropertyChange(path=key, kind=kind, old=_short(before), new=_short(after)))
    return out


def created_properties(new: Mapping[str, Any] | None) -> list[PropertyChange]:
    """A created resource shows every input it will be created with."""
    return [
        PropertyChange(path=k, kind="add", new=_short(v))
        for k, v in sorted((new or {}).items())
        if _visible(k)
    ]


def change_from_event(event: Any) -> ResourceChange | None:
    """A ResourceChange from one engine event, or None for events that are not resource steps
    (or steps on the stack/provider bookkeeping that a reviewer need not see)."""
    pre = getattr(event, "resource_pre_event", None)
    if pre is None:
        return None
    meta = pre.metadata
    op_value = getattr(meta.op, "value", str(meta.op))
    op = _OP_NAMES.get(op_value, op_value)
    if meta.type == "pulumi:pulumi:Stack" or meta.type.startswith("pulumi:providers:"):
        return None
    old_inputs = meta.old.inputs if meta.old is not None else None
    new_inputs = meta.new.inputs if meta.new is not None else None
    if op == "create":
        props = created_properties(new_inputs)
    elif op == "delete":
        props = []
    else:
        props = property_changes(old_inputs, new_inputs, meta.diffs, meta.detailed_diff)
    return ResourceChange(
        urn=meta.urn,
        type=meta.type,
        name=meta.urn.rsplit("::", 1)[-1],
        op=op,
        properties=props if op != "same" else [],
    )


def merge(changes: Iterable[ResourceChange]) -> list[ResourceChange]:
    """One entry per resource, in engine order: what happens to it wins over a read-back
    (``refresh``) of it, and of a replace's two steps the one with the property diff is kept."""
    seen: dict[str, ResourceChange] = {}
    for change in changes:
        prior = seen.get(change.urn)
        fuller = prior is not None and change.op == prior.op == "replace" and not prior.properties
        if prior is None or _rank(change) > _rank(prior) or fuller:
            seen[change.urn] = change
    return list(seen.values())


def _rank(change: ResourceChange) -> int:
    if change.op in ("refresh", "read"):
        return 0
    return 1 if change.op == "same" else 2


def count(changes: Iterable[ResourceChange]) -> dict[str, int]:
    """How many resources each operation touches (``same`` included)."""
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.op] = counts.get(change.op, 0) + 1
    return counts
