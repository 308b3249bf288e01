"""A deadline on every store operation of a command that reads runs back.

A store that accepts connections and never answers (a hung proxy, a blackholed endpoint, a
stuck NFS mount) would hold ``status`` for minutes while the client library retries. Each
operation of a :class:`BoundedStore` runs on a daemon thread and is abandoned after the read
timeout; the store is then known to be silent, so later operations fail at once and the
command's total time stays near one timeout. The answer is :class:`StoreUnavailable`: unknown,
never "absent".

The timeout is ``--read-timeout`` where a command has it (:func:`read_budget`), else
``$NPA_READ_TIMEOUT``, else :data:`DEFAULT_READ_TIMEOUT` seconds.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from npa.adapters.storage.base import ObjectStore, WrappingStore
from npa.core.errors import InvalidInput, StoreUnavailable

READ_TIMEOUT_ENV = "NPA_READ_TIMEOUT"
DEFAULT_READ_TIMEOUT = 15.0
_budget: ContextVar[float | None] = ContextVar("npa_read_budget", default=None)
T = TypeVar("T")


@contextlib.contextmanager
def read_budget(seconds: float | None) -> Iterator[None]:
    """Within this block, stores opened for reading give up after ``seconds`` (None: the
    environment's or the default)."""
    token = _budget.set(seconds)
    try:
        yield
    finally:
        _budget.reset(token)


def read_timeout() -> float:
    """The read timeout in force: the command's flag, else $NPA_READ_TIMEOUT, else the default."""
    flag = _budget.get()
    if flag is not None:
        return flag
    raw = os.environ.get(READ_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_READ_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise InvalidInput(
            f"{READ_TIMEOUT_ENV}={raw!r} is not a number of seconds between 0 and 3600",
            fix=f"export {READ_TIMEOUT_ENV}={DEFAULT_READ_TIMEOUT:g}",
        )
    return value


class BoundedStore(WrappingStore):
    """``inner`` with every operation abandoned after ``seconds``."""

    def __init__(self, inner: ObjectStore, seconds: float, *, fix: str | None = None) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self._fix = fix
        self._silent = False

    def _silence(self, what: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"the store {self.uri} did not answer {what} within {self.seconds:g} s; npa cannot "
            "tell what it holds",
            fix=self._fix
            or f"export {READ_TIMEOUT_ENV}=60  # more time, if the store is slow rather than "
            "down; then run the command again",
            details={"store": self.uri, "timeout_seconds": self.seconds},
        )

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        if self._silent:
            raise self._silence(what)
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread as it is
                box["error"] = exc
            finally:
                done.set()

        # A daemon thread: an abandoned call never keeps the process alive.
        threading.Thread(target=run, name="npa-store-call", daemon=True).start()
        if not done.wait(self.seconds):
            self._silent = True
            raise self._silence(what)
        if "error" in box:
            raise box["error"]
        value: T = box["value"]
        return value
