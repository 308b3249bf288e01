"""The stage graph of a validated workflow: execution order, levels and waves."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from npa.spec.model import Workflow
from npa.spec.validate import upstream

Dependencies = Mapping[str, set[str]]  # stage name -> the stages it waits for


def dependencies(workflow: Workflow) -> dict[str, set[str]]:
    """Each stage's :func:`upstream` stages, in spec order: computed once a plan, for its order,
    its levels and each stage's ``depends_on`` (each asked for them again before)."""
    return {s.name: upstream(s) for s in workflow.stages}


def topological_order(workflow: Workflow, deps: Dependencies | None = None) -> list[str]:
    """Stage names so every stage comes after the stages it depends on.

    Among stages that are ready at the same time, the one written first in the spec goes
    first, so the order is deterministic and reads like the spec.
    """
    deps = dependencies(workflow) if deps is None else deps
    index = {s.name: i for i, s in enumerate(workflow.stages)}
    waiting = {s.name: set(deps[s.name]) for s in workflow.stages}
    downstream: dict[str, list[str]] = {name: [] for name in index}
    for name, before in waiting.items():
        for dep in before:
            downstream[dep].append(name)
    ready = [(index[n], n) for n, before in waiting.items() if not before]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(name)
        for nxt in downstream[name]:
            waiting[nxt].discard(name)
            if not waiting[nxt]:
                heapq.heappush(ready, (index[nxt], nxt))
    if len(order) != len(index):  # validation rejects cycles; this guards misuse
        raise ValueError("the stage graph has a cycle")
    return order


def levels(
    workflow: Workflow, order: list[str], deps: Dependencies | None = None
) -> dict[str, int]:
    """Level 0 has no dependencies; a stage's level is one more than its deepest dependency.
    Stages on the same level can run at the same time."""
    deps = dependencies(workflow) if deps is None else deps
    level: dict[str, int] = {}
    for name in order:
        level[name] = 1 + max((level[d] for d in deps[name]), default=-1)
    return level
