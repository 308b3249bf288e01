"""The ``local`` target: what the embedded default needs on this machine.

Config: ``npa:storeDir`` (the local object store) and ``npa:executorDir`` (the local executor's
state). Both are owner-only directories; a teardown removes them only when empty.
"""

from __future__ import annotations

import pulumi

from stacks.localfs import Directory


def program() -> None:
    config = pulumi.Config("npa")
    store = Directory("store", config.require("storeDir"))
    executor = Directory("executor-state", config.require("executorDir"))
    pulumi.export("store_dir", store.path)
    pulumi.export("executor_dir", executor.path)
