"""Process-wide memos of pure functions of bytes read from storage.

A part's footer and a state rollup are immutable once written, and what a reader makes of
their bytes (parsed, then checked) depends on nothing else: a process that met the same
bytes before can take what it made then. A `BytesMemo` remembers such results by their
bytes (or a key holding them), bounded three ways: entries, bytes per entry and bytes in all,
the least recently used forgotten first.

Invariants: only results are remembered, never failures (the caller puts a value once it
was made); a remembered value is shared by every caller that gets it, so values must be
immutable or never mutated; every method is thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

_V = TypeVar("_V")


class BytesMemo(Generic[_V]):
    """At most ``entries`` values, each made from at most ``max_bytes`` bytes and
    ``total_bytes`` in all (`bytes` counts them), least recently used forgotten first."""

    def __init__(self, entries: int, max_bytes: int, total_bytes: int) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self.total_bytes = total_bytes
        self.bytes = 0
        self._values: OrderedDict[Hashable, tuple[_V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: Hashable) -> _V | None:
        """The value remembered for ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._values.get(key)
            if found is None:
                return None
            self._values.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: _V, size: int) -> None:
        """Remember ``value``, made from ``size`` bytes, for ``key`` (unless it is larger
        than ``max_bytes``), then forget the least recently used past the bounds."""
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._values[key] = (value, size)
            self.bytes += size
            while self._values and (
                len(self._values) > self.entries or self.bytes > self.total_bytes
            ):
                self.bytes -= self._values.popitem(last=False)[1][1]

    def forget(self, key: Hashable) -> None:
        """Drop the value remembered for ``key``, if any."""
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self.bytes -= old[1]

    def clear(self) -> None:
        """Drop every value."""
        with self._lock:
            self._values.clear()
            self.bytes = 0
