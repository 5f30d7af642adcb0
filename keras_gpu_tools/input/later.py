"""Verdicts made when first read: an epoch end keeps what they are made of, the reader makes them.

An epoch end of the detector judges the epoch and its last window; the
figures go into the epoch logs at once, but the verdicts (their text, evidence
and advice) are read later, if at all: by the TensorBoard writer on the fit
session's thread, by ``LiveView``, or by the user after fit(). What a verdict
depends on that changes with time (the GPU logger's points, the host's CPU
figures) is read at the epoch end; the rest is made by the first reader, once,
on whichever thread reads.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Later(Generic[T]):
    """``make()``, called once when first read (from any thread); the same object for every reader."""

    __slots__ = ("_make", "_value", "_lock")

    def __init__(self, make: Callable[[], T]):
        self._make: Callable[[], T] | None = make
        self._value: T | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        if self._make is not None:
            with self._lock:
                if self._make is not None:
                    self._value, self._make = self._make(), None
        return self._value  # type: ignore[return-value]  # (made above)


class LaterList(Generic[T]):
    """A list whose items are made when the list is read, in the order they were added.

    ``add`` (the training thread) only appends to a deque: it never waits for a
    reader making the items. ``items()`` makes those added since the last read
    and returns the same list object every time, grown.
    """

    def __init__(self, items: list[T] | None = None):
        self._made: list[T] = list(items or [])
        self._pending: collections.deque[Callable[[], T]] = collections.deque()
        self._lock = threading.Lock()  # one reader makes the pending items at a time, in order

    def add(self, item: Callable[[], T]) -> None:
        self._pending.append(item)

    def items(self) -> list[T]:
        if self._pending:
            with self._lock:
                while self._pending:
                    self._made.append(self._pending.popleft()())
        return self._made
