"""Pulumi programs for npa's stacks, one module per stack.

npa runs them through the Pulumi Automation API (inline programs); ``__main__`` lets the plain
``pulumi`` CLI run the same programs from the top-level Pulumi.yaml.
"""

from __future__ import annotations

from collections.abc import Callable

# Stack programs register here by stack kind; the CLI entry point picks one by config.
PROGRAMS: dict[str, Callable[[], None]] = {}
