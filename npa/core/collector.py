"""The one way npa pauses Python's cyclic garbage collector around building a large result."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (or the decorated function), then
    resume it if it was running.

    Reading, validating, planning and rendering a large workflow allocate millions of objects
    that all stay alive until the end: each collection of the oldest generation rescans every
    one of them with nothing to free, so the time grows faster than the document (plan-spec of
    20,000 stages: 4x the CPU per stage of 200; render's plan and tasks 3-4x, its collections
    10x). Reference counting still frees what is not cyclic.

    What outlives the block is frozen (``gc.freeze``) before the collector resumes: all of it sat
    in the young generation, and the first collection after the pause scanned every object
    once more to find nothing (build_plan at 20,000 stages timed with that collection: 0.75 s;
    frozen, 0.53 s). Frozen objects are never scanned again; one that later becomes part of an
    unreachable cycle is kept until the process ends. Every caller is a command that builds
    once and exits (the supervisor builds nothing), so that costs nothing. Nests: an inner
    pause leaves an outer one in force. tests/unit/test_scaling.py holds every command and
    builder that uses it to it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()
