"""The provisioning targets' registry: every ``--target`` name has one class that says it is
that target, and what the services ask of a target is a declared capability."""

from __future__ import annotations

import pytest

from npa.core.errors import InvalidInput
from npa.core.targets import TARGETS
from npa.targets import TARGET_CLASSES, target_for
from npa.targets.base import (
    ChecksReachability,
    CopiesKubeconfig,
    ExistingCluster,
    MeasuresLocalDisk,
    ProvesExistingDisks,
)

pytestmark = pytest.mark.unit


def test_every_target_name_has_its_class() -> None:
    assert sorted(TARGET_CLASSES) == sorted(TARGETS)
    for name in TARGETS:
        assert target_for(name).name == name


def test_an_unknown_target_is_refused_with_the_nearest_one() -> None:
    with pytest.raises(InvalidInput) as refused:
        target_for("nebuis", project="p")
    assert refused.value.fix is not None and "--target nebius" in refused.value.fix


@pytest.mark.parametrize(
    ("capability", "having"),
    [
        (MeasuresLocalDisk, {"local"}),
        (ExistingCluster, {"kubernetes"}),
        (CopiesKubeconfig, {"kubernetes"}),
        (ChecksReachability, {"kubernetes"}),
        (ProvesExistingDisks, {"nebius"}),
    ],
)
def test_capabilities_are_declared_as_docs_development_lists_them(
    capability: type, having: set[str]
) -> None:
    assert {n for n in TARGETS if isinstance(target_for(n), capability)} == having
