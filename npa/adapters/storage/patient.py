"""A store that rides out an outage: what a run's long-lived processes write through.

A run lasts hours; a store that answers 500, resets connections or goes silent for a few
seconds must not end it. Every operation of a :class:`PatientStore` that fails with a fault
that may pass by itself (:func:`npa.core.errors.passes_by_itself`) is asked again, after a
pause that doubles from :data:`FIRST_PAUSE` up to :data:`LONGEST_PAUSE`, until the store
answers or the outage has lasted the store's *patience* (``$NPA_STORE_OUTAGE_SECONDS``, else
:data:`DEFAULT_PATIENCE`); the last error is then raised, with ``details["outage_seconds"]``.
A fault a person must fix (refused credentials, a missing bucket, a full disk) is raised at
once, and so is every fault once ``stop()`` says the caller is being cancelled.

Every operation here may be asked twice: writes put whole objects under fixed keys (asking
again writes the same bytes) and reads change nothing. ``create_if_absent`` is the exception
(a retry after an answer that was lost would report "exists" for the caller's own write), so
it is never retried.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from npa.adapters.storage.base import ObjectStore, WrappingStore
from npa.core.errors import InvalidInput, StoreUnavailable, passes_by_itself

PATIENCE_ENV = "NPA_STORE_OUTAGE_SECONDS"
DEFAULT_PATIENCE = 120.0
FIRST_PAUSE = 0.5
LONGEST_PAUSE = 15.0
T = TypeVar("T")
# Set once this process is being cancelled: every patient store stops waiting at once.
_STOPPED = threading.Event()


def stop_waiting() -> None:
    """Make every patient store of this process give up its waits (a cancel arrived)."""
    _STOPPED.set()


def store_patience() -> float:
    """How long a run's processes wait out a store outage: ``$NPA_STORE_OUTAGE_SECONDS`` or
    :data:`DEFAULT_PATIENCE`."""
    raw = os.environ.get(PATIENCE_ENV)
    if not raw:
        return DEFAULT_PATIENCE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise InvalidInput(
            f"{PATIENCE_ENV}={raw!r} is not a number of seconds between 0 and 86400",
            fix=f"export {PATIENCE_ENV}={DEFAULT_PATIENCE:g}",
        )
    return value


class PatientStore(WrappingStore):
    """``inner``, with each operation retried through an outage of up to ``patience`` seconds.

    ``sleep`` and ``clock`` are the pause and the time source; by default a pause ends early,
    and no retry follows, once :func:`stop_waiting` was called. ``note`` hears one line per
    retry."""

    def __init__(
        self,
        inner: ObjectStore,
        patience: float,
        *,
        stop: Callable[[], bool] = _STOPPED.is_set,
        sleep: Callable[[float], object] = _STOPPED.wait,
        clock: Callable[[], float] = time.monotonic,
        note: Callable[[str], None] = lambda line: None,
    ) -> None:
        super().__init__(inner)
        self.patience = patience
        self.stop = stop
        self.sleep = sleep
        self.clock = clock
        self.note = note

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        began: float | None = None
        pause = FIRST_PAUSE
        while True:
            try:
                return fn()
            except StoreUnavailable as error:
                if not passes_by_itself(error) or self.stop():
                    raise
                now = self.clock()
                began = now if began is None else began
                left = self.patience - (now - began)
                if left <= 0:
                    error.details["outage_seconds"] = round(now - began, 3)
                    raise
                wait = min(pause, left)
                self.note(
                    f"the store did not complete {what} ({error.message}); asking again in "
                    f"{wait:g} s ({now - began:.0f} s of at most {self.patience:g} s of outage)"
                )
                self.sleep(wait)
                pause = min(pause * 2, LONGEST_PAUSE)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.create_if_absent(key, data)
