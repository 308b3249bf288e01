"""The stage graph of a validated workflow: execution order, levels and waves."""

from __future__ import annotations

import heapq

from npa.spec.model import Workflow
from npa.spec.validate import upstream


def topological_order(workflow: Workflow) -> list[str]:
    """Stage names so every stage comes after the stages it depends on.

    Among stages that are ready at the same time, the one written first in the spec goes
    first, so the order is deterministic and reads like the spec.
    """
    index = {s.name: i for i, s in enumerate(workflow.stages)}
    waiting = {s.name: set(upstream(s)) for s in workflow.stages}
    downstream: dict[str, list[str]] = {name: [] for name in index}
    for name, deps in waiting.items():
        for dep in deps:
            downstream[dep].append(name)
    ready = [(index[n], n) for n, deps in waiting.items() if not deps]
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


def levels(workflow: Workflow, order: list[str]) -> dict[str, int]:
    """Level 0 has no dependencies; a stage's level is one more than its deepest dependency.
    Stages on the same level can run at the same time."""
    by_name = {s.name: s for s in workflow.stages}
    level: dict[str, int] = {}
    for name in order:
        deps = upstream(by_name[name])
        level[name] = 1 + max((level[d] for d in deps), default=-1)
    return level
