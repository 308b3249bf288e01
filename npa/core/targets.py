"""Where npa provisions and plans: one list for provision-if-absent, teardown, plan-spec and
shell completion (light: the CLI's completion imports it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from npa.core.commands import npa_command
from npa.core.errors import InvalidInput
from npa.core.suggest import closest, unknown

Target = Literal["local", "kubernetes", "nebius"]
TARGETS: tuple[Target, ...] = ("local", "kubernetes", "nebius")
#: The target whose quota is the disk of this machine: what a run on this machine is planned on.
MACHINE_TARGET: Target = "local"


def checked_target(value: str, command: Sequence[str], args: Sequence[str] = ()) -> Target:
    """``value`` as a target, or a clear error whose fix reruns ``command`` with ``args`` and
    the nearest target (or asks for the command's ``--help`` when no target is near)."""
    for target in TARGETS:
        if value == target:
            return target
    guess = closest(value, TARGETS)
    if guess is None:
        fix = npa_command(*command, "--help")
    else:
        fix = npa_command(*command, *args, "--target", guess)
    raise InvalidInput(unknown("--target", value, TARGETS), fix=fix)
