"""Shell completion of npa's values: project aliases, kube contexts, targets and --infra.

Completion runs on every <TAB>, so these read small local files only (the config file, the
kubeconfig) and never a store, a cluster or a registry.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from npa.core.targets import TARGETS


def _home() -> Path:
    override = os.environ.get("NPA_HOME")
    return Path(override).expanduser() if override else Path.home() / ".npa"


def _matching(values: list[str] | tuple[str, ...], incomplete: str) -> list[str]:
    return sorted({v for v in values if v.startswith(incomplete)})


def projects(incomplete: str) -> list[str]:
    """Configured aliases and those with runs recorded on this machine."""
    home = _home()
    names: list[str] = []
    try:
        config = json.loads((home / "config.json").read_text("utf-8"))
        names += list(config.get("projects") or {})
    except (OSError, ValueError, AttributeError):
        pass
    for folder in ("workflow-submissions", "runs"):
        if (home / folder).is_dir():
            names += [p.name for p in (home / folder).iterdir() if p.is_dir()]
    return _matching(names, incomplete)


def contexts(incomplete: str) -> list[str]:
    """Contexts of the kubeconfig kubectl reads, and those npa placed a kubeconfig for."""
    from npa.adapters.kube import kubeconfig
    from npa.core.paths import context_from_folder

    names: list[str] = []
    with contextlib.suppress(kubeconfig.KubeconfigError):
        names += list(kubeconfig.merge(kubeconfig.source_files()).contexts)
    clusters = _home() / "clusters"
    if clusters.is_dir():
        names += [n for p in clusters.iterdir() if (n := context_from_folder(p.name)) is not None]
    return _matching(names, incomplete)


def targets(incomplete: str) -> list[str]:
    return _matching(TARGETS, incomplete)


def infra(incomplete: str) -> list[str]:
    """``local`` and ``k8s/<context>`` for every known context."""
    return _matching(["local", *(f"k8s/{c}" for c in contexts(""))], incomplete)
