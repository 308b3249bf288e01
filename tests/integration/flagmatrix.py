"""The flag matrix of issue 33, point 3, one definition for the managed-jobs double
(test_task_flag_matrix.py) and the real cluster (test_cluster_skypilot.py): which cells of
image choice x image preflight x --digests run, the flags each cell passes, and which image the
rules choose."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Moved:
    """A repository whose tag v1 pointed at ``old`` and points at ``current`` now."""

    name: str  # host/repository
    old: str
    current: str

    @property
    def tag(self) -> str:
        return f"{self.name}:v1"


CHOICES = ("spec", "image", "override", "both")
PREFLIGHT = ("preflight", "no-preflight")
DIGESTS = ("no-digests", "digests")


def cells() -> list[tuple[str, str, str]]:
    """All 16 combinations with ``NPA_FLAG_MATRIX=full``; by default the 8 in which every pair
    of the three flags' values meets (digests = (choice + preflight) mod 2), half the time on
    CI's busy worker."""
    if os.environ.get("NPA_FLAG_MATRIX") == "full":
        return list(itertools.product(CHOICES, PREFLIGHT, DIGESTS))
    return [
        (c, f, DIGESTS[(i + j) % 2]) for i, c in enumerate(CHOICES) for j, f in enumerate(PREFLIGHT)
    ]


def image_flags(choice: str, moved: dict[str, Moved], tool: str = "shell") -> tuple[str, ...]:
    """The image flags of ``choice``; the override names ``tool``, the spec's one tool."""
    image = ("--image", moved["image"].tag)
    override = ("--image-override", f"{tool}={moved['override'].tag}")
    return {"spec": (), "image": image, "override": override, "both": image + override}[choice]


def chosen(choice: str) -> str:
    """The image the rules choose for the one tool: an exact override, else --image."""
    return {"spec": "spec", "image": "image", "override": "override", "both": "override"}[choice]
