"""Provisioning targets: ``local`` (this machine), ``kubernetes`` (a cluster that exists) and
``nebius`` (a cluster npa creates on Nebius).

Each target is a folder with ``target.py``: a class implementing :class:`Target`
(``npa/targets/base.py``) and the capabilities it declares. This module is the only place that
knows them by name: ``--target`` is turned into a target here. Heavy libraries are imported
inside the targets' methods, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npa.core.paths import NpaPaths
from npa.core.targets import checked_target
from npa.spec.model import Infrastructure
from npa.targets.base import Layout, LayoutAsk, QuotaApiAsk, Target
from npa.targets.kubernetes.target import KubernetesTarget
from npa.targets.local.target import LocalTarget
from npa.targets.nebius.target import NebiusTarget

TARGET_CLASSES: dict[str, type[Target]] = {
    "local": LocalTarget,
    "kubernetes": KubernetesTarget,
    "nebius": NebiusTarget,
}


def target_for(
    name: str, command: Sequence[str] = ("provision-if-absent",), project: str | None = None
) -> Target:
    """The target ``--target name`` selects, or the error (naming the nearest target) of
    ``command`` run for ``project``."""
    args = ["--project", project] if project is not None else []
    return TARGET_CLASSES[checked_target(name, command, args)]()


def layout(
    paths: NpaPaths,
    project: str,
    target: str,
    *,
    context: str | None,
    kubeconfig: Path | None,
    infra: Infrastructure | None = None,
    quota_api: QuotaApiAsk | None = None,
    need_source: bool = True,
) -> Layout:
    """The stacks a target consists of, and the operation id of provisioning it."""
    ask = LayoutAsk(
        context=context,
        kubeconfig=kubeconfig,
        infra=infra,
        quota_api=quota_api or QuotaApiAsk(),
        need_source=need_source,
    )
    return target_for(target, project=project).layout(paths, project, ask)
