"""A store that records every request it is asked, for tests that count requests (never time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from npa.adapters.storage import ObjectStore
from npa.adapters.storage.base import WrappingStore

T = TypeVar("T")


class Counting(WrappingStore):
    """The real store, with every request it is asked recorded as a phrase ("a read of KEY"),
    in order."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.calls: list[str] = []

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        self.calls.append(what)
        return fn()

    def reads(self) -> list[str]:
        return [c.removeprefix("a read of ") for c in self.calls if c.startswith("a read of ")]

    def writes(self) -> list[str]:
        return [c.removeprefix("a write of ") for c in self.calls if c.startswith("a write of ")]

    def listings(self) -> list[str]:
        return [c for c in self.calls if c.startswith("a listing of ")]
