"""Fault injection: a Blob wrapper that fails, or succeeds and then reports failure.

`FaultyBlob` wraps a real `Blob` and, by a seeded random draw per call, either
- raises *before* doing the operation (``fail_before``: certainly not done), or
- does the operation and then raises (``fail_after``: done, but the caller is told it failed;
  the indeterminate case a timeout produces).
Errors are ``TimeoutError`` (an ``OSError``), as a network filesystem would raise. The commit
protocol must stay correct under both: no lost commit, no commit applied twice, no partial
state visible.

It can also *stall* (``stall``, with ``on_stall``): pause before an operation while
``on_stall()`` runs, which lets other writers commit and gc truncate the log in the middle of
this caller's commit, as a long GC pause or a slow network would.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from persistshard.core.storage.blob import Blob, BlobWrapper

log = logging.getLogger("persistshard.conformance.faults")


class FaultyBlob(BlobWrapper):
    """A `Blob` whose operations fail at random (see the module docstring). It wraps any
    implementation of the interface and keeps its capabilities."""

    def __init__(
        self,
        inner: Blob,
        *,
        fail_before: float = 0.0,
        fail_after: float = 0.0,
        seed: int = 0,
        operations: frozenset[str] = frozenset({"put", "put_if_absent", "get", "delete"}),
        stall: float = 0.0,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(inner)
        self.fail_before = fail_before
        self.fail_after = fail_after
        self.operations = operations
        self.stall = stall
        self.on_stall = on_stall
        self.enabled = True
        self.injected = 0
        self.stalls = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def _draw(self, op: str) -> str | None:
        if not self.enabled or op not in self.operations:
            return None
        with self._lock:
            r = self._rng.random()
            stalled = self.on_stall is not None and self._rng.random() < self.stall
        if stalled and self.on_stall is not None:
            self.stalls += 1
            self.on_stall()
        if r < self.fail_before:
            return "before"
        if r < self.fail_before + self.fail_after:
            return "after"
        return None

    def _run(self, op: str, fn: Any, *args: Any) -> Any:
        fault = self._draw(op)
        if fault == "before":
            self.injected += 1
            log.debug("injecting a failure before %s", op)
            raise TimeoutError(f"injected failure before {op}")
        result = fn(*args)
        if fault == "after":
            self.injected += 1
            log.debug("injecting a failure after %s (done)", op)
            raise TimeoutError(f"injected failure after {op} (it was done)")
        return result

    def get(self, key: str) -> bytes | None:
        result: bytes | None = self._run("get", self.inner.get, key)
        return result

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        result: bytes = self._run("get", self.inner.get_range, key, offset, length)
        return result

    def put(self, key: str, data: bytes) -> None:
        self._run("put", self.inner.put, key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        result: bool = self._run("put_if_absent", self.inner.put_if_absent, key, data)
        return result

    def delete(self, key: str) -> None:
        self._run("delete", self.inner.delete, key)
