"""Entry point for the plain ``pulumi`` CLI: run the program named by ``npa:stack`` config."""

from __future__ import annotations

import pulumi

from stacks import PROGRAMS

kind = pulumi.Config("npa").require("stack")
if kind not in PROGRAMS:
    known = ", ".join(sorted(PROGRAMS)) or "none"
    raise pulumi.RunError(f"npa:stack is {kind!r}; known stack programs: {known}")
PROGRAMS[kind]()
