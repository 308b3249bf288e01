"""Pulumi programs for npa's stacks, one module per stack.

npa runs them through the Pulumi Automation API (inline programs); ``__main__`` lets the plain
``pulumi`` CLI run the same programs from the top-level Pulumi.yaml. Every program reads its
inputs from ``npa:*`` stack config, so both ways run the same thing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def _load(module: str) -> Callable[[], None]:
    """The ``program`` of ``stacks.<module>``, imported only when the stack runs."""

    def run() -> None:
        importlib.import_module(f"stacks.{module}").program()

    return run


# Stack programs by kind (the ``npa:stack`` config value); the CLI entry point picks one.
PROGRAMS: dict[str, Callable[[], None]] = {
    "local": _load("local"),
    "kubernetes": _load("kubernetes"),
    "nebius": _load("nebius"),
}
