"""Accelerator names as the cluster spells them.

Kubernetes schedulers see GPUs by node-label values, and those values differ from the names in
a spec (``H100`` against ``nvidia-h100-80gb-hbm3`` or ``H100-80GB``) and can change while the
GPU operator is still labelling nodes. Submit asks the backend for the names its cluster's
nodes carry (:class:`npa.backends.base.ResolvesAccelerators`) and renames each spec accelerator
to the one name it matches.
"""

from __future__ import annotations

import re

from pydantic import BaseModel


class AcceleratorRemap(BaseModel):
    requested: str
    resolved: str | None
    candidates: list[str]
    detail: str


def _norm(name: str) -> str:
    text = name.lower()
    for noise in ("nvidia-", "nvidia_", "tesla-", "nvidia"):
        text = text.removeprefix(noise)
    return re.sub(r"[^a-z0-9]", "", text)


def resolve(requested: str, names: list[str]) -> AcceleratorRemap:
    """The cluster name for ``requested``: an exact (case-insensitive) match, else the one name
    whose normalised form starts with the requested one. Ambiguity keeps the spec's name."""
    exact = [n for n in names if n.lower() == requested.lower()]
    if exact:
        return AcceleratorRemap(
            requested=requested, resolved=exact[0], candidates=exact, detail="exact"
        )
    want = _norm(requested)
    matches = [n for n in names if want and _norm(n).startswith(want)]
    if len(matches) == 1:
        return AcceleratorRemap(
            requested=requested, resolved=matches[0], candidates=matches, detail="node label"
        )
    why = "no node label matches" if not matches else "several node labels match"
    return AcceleratorRemap(requested=requested, resolved=None, candidates=matches, detail=why)
