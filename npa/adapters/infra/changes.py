"""Per-resource changes read from the Pulumi engine's events.

The engine reports each step (create, update, replace, delete, same) with the old inputs and
outputs, the new inputs, the top-level keys that differ and, from most providers, a detailed
diff by property path. This module reads them the way ``pulumi preview --diff`` does and turns
them into one record per changed leaf (path, kind, old, new) that npa prints in Pulumi's style
and dumps as JSON. Secret values are shown masked, and properties the engine or a dynamic
provider keeps for itself (``__provider``) are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

# Operations that change something, in the order a reviewer reads them.
MUTATING = ("create", "update", "replace", "delete")
# Engine step kinds folded into the four a reviewer cares about.
OP_NAMES = {
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
# The engine marks a secret value with this key (its "special signature"); npa shows it masked.
_SECRET_SIG = "4dabf18193072939515e22adb298388d"
SECRET = "[secret]"


class PropertyChange(BaseModel):
    """One property that differs, at a path as Pulumi writes it (``metadata.labels["a/b"]``,
    ``rules[0].verbs``): ``kind`` is add, delete or update, with ``-replace`` when the change
    forces a replacement. ``old`` and ``new`` are the values as the engine reported them
    (secrets masked)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    kind: str
    old: Any = None
    new: Any = None

    def text(self) -> str:
        """One line in the style of ``pulumi preview --diff``: ``~ path: old => new``."""
        base = self.kind.removesuffix("-replace")
        if base == "add":
            line = f"+ {self.path}: {show(self.new)}"
        elif base == "delete":
            line = f"- {self.path}: {show(self.old)}"
        else:
            line = f"~ {self.path}: {show(self.old)} => {show(self.new)}"
        return line + ("  (forces replacement)" if self.kind.endswith("-replace") else "")


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


def show(value: Any) -> str:
    """A value as Pulumi prints one: strings quoted, numbers and booleans bare, objects and
    lists as JSON; never a Python repr, never cut short."""
    if value is None:
        return "null"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _masked(value: Any) -> Any:
    if isinstance(value, Mapping):
        if _SECRET_SIG in value:
            return SECRET
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _join(path: str, key: str | int) -> str:
    """Pulumi's property path syntax: ``a.b``, ``a["b/c"]``, ``a[0]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f'{path}["{key}"]'


def _internal(key: str) -> bool:
    # Keys the engine and dynamic providers keep for themselves (``__provider``, ...).
    return key.startswith("__")


def _leaves(value: Any, path: str, kind: str, side: str) -> list[PropertyChange]:
    """Every leaf of ``value`` as an add (``side`` new) or a delete (``side`` old)."""
    if isinstance(value, Mapping) and value and _SECRET_SIG not in value:
        out: list[PropertyChange] = []
        for key in sorted(value):
            if not (path == "" and _internal(key)):
                out += _leaves(value[key], _join(path, key), kind, side)
        return out
    if isinstance(value, list) and value:
        return [c for i, v in enumerate(value) for c in _leaves(v, _join(path, i), kind, side)]
    return [PropertyChange(path=path, kind=kind, **{side: _masked(value)})]


def diff_values(old: Any, new: Any, path: str = "", replace: bool = False) -> list[PropertyChange]:
    """The leaf-by-leaf difference of two property values (objects and lists recursed into)."""
    suffix = "-replace" if replace else ""
    if old == new:
        return []
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        if _SECRET_SIG in old or _SECRET_SIG in new:
            return [PropertyChange(path=path, kind="update" + suffix, old=SECRET, new=SECRET)]
        out: list[PropertyChange] = []
        for key in sorted(set(old) | set(new)):
            if path == "" and _internal(key):
                continue
            sub = _join(path, key)
            if key not in old:
                out += _leaves(new[key], sub, "add" + suffix, "new")
            elif key not in new:
                out += _leaves(old[key], sub, "delete" + suffix, "old")
            else:
                out += diff_values(old[key], new[key], sub, replace)
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = []
        for i in range(max(len(old), len(new))):
            sub = _join(path, i)
            if i >= len(old):
                out += _leaves(new[i], sub, "add" + suffix, "new")
            elif i >= len(new):
                out += _leaves(old[i], sub, "delete" + suffix, "old")
            else:
                out += diff_values(old[i], new[i], sub, replace)
        return out
    if old is None:
        return _leaves(new, path, "add" + suffix, "new")
    if new is None:
        return _leaves(old, path, "delete" + suffix, "old")
    return [PropertyChange(path=path, kind="update" + suffix, old=_masked(old), new=_masked(new))]


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


def _kind(diff: Any) -> str:
    raw = getattr(diff, "diff_kind", None)
    return str(getattr(raw, "value", None) or raw or "update")


def _detailed_change(
    path: str, pdiff: Any, old_in: dict[str, Any], old_out: dict[str, Any], new_in: dict[str, Any]
) -> list[PropertyChange]:
    """One path of a provider's detailed diff: the old value from the recorded outputs (inputs
    when the diff is of inputs), the new from the new inputs; a path whose values compare
    equal still shows as the kind the provider gave."""
    kind = _kind(pdiff)
    before = _lookup(old_in if getattr(pdiff, "input_diff", False) else old_out, path)
    after = _lookup(new_in, path)
    changes = diff_values(before, after, path, kind.endswith("-replace"))
    if changes:
        return changes
    base = kind.removesuffix("-replace")
    side = {"add": {"new": _masked(after)}, "delete": {"old": _masked(before)}}
    values = side.get(base, {"old": _masked(before), "new": _masked(after)})
    return [PropertyChange(path=path, kind=kind, **values)]


def step_properties(meta: Any, op: str) -> list[PropertyChange]:
    """The property diff of one engine step, chosen as ``pulumi preview --diff`` chooses it:

    - the provider's detailed diff when it sent one: per path, the old value from the
      recorded outputs (inputs when the provider says the diff is of inputs) and the new value
      from the new inputs;
    - else the old inputs against the new inputs, limited to the top-level keys the engine
      reports as different;
    - a create shows every new input, a delete every old input.

    An update whose inputs are equal (a dynamic provider that compares what it read back, such
    as a placed file's fingerprint) shows the recorded outputs against the new inputs instead,
    so an update never reads as empty.
    """
    old, new = meta.old, meta.new
    old_in = dict(old.inputs or {}) if old is not None else {}
    old_out = dict(old.outputs or {}) if old is not None else {}
    new_in = dict(new.inputs or {}) if new is not None else {}
    if op == "create":
        return diff_values({}, new_in)
    if op == "delete":
        return diff_values(old_in, {})
    if op == "same":
        return []
    if meta.detailed_diff:
        out: list[PropertyChange] = []
        for path, pdiff in sorted(meta.detailed_diff.items()):
            if not _internal(path):
                out += _detailed_change(path, pdiff, old_in, old_out, new_in)
        return out
    return _input_changes(set(meta.diffs or ()), op, old_in, old_out, new_in)


def _input_changes(
    keys: set[str], op: str, old_in: dict[str, Any], old_out: dict[str, Any], new_in: dict[str, Any]
) -> list[PropertyChange]:
    """Old inputs against new, limited to ``keys`` when the engine named them; an update whose
    inputs are equal shows the recorded outputs against the new inputs instead."""
    if keys:
        changes = diff_values(
            {k: v for k, v in old_in.items() if k in keys},
            {k: v for k, v in new_in.items() if k in keys},
        )
    else:
        changes = diff_values(old_in, new_in)
    if not changes and op in ("update", "replace"):
        changes = diff_values({k: old_out.get(k) for k in new_in}, new_in)
    return changes


def change_from_event(event: Any) -> ResourceChange | None:
    """A ResourceChange from one engine event, or None for events that are not resource steps
    (or steps on the stack/provider bookkeeping that a reviewer need not see)."""
    pre = getattr(event, "resource_pre_event", None)
    if pre is None:
        return None
    meta = pre.metadata
    op_value = getattr(meta.op, "value", str(meta.op))
    op = OP_NAMES.get(op_value, op_value)
    if meta.type == "pulumi:pulumi:Stack" or meta.type.startswith("pulumi:providers:"):
        return None
    props = step_properties(meta, op) if op not in ("refresh", "read") else []
    return ResourceChange(
        urn=meta.urn,
        type=meta.type,
        name=meta.urn.rsplit("::", 1)[-1],
        op=op,
        properties=props,
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
