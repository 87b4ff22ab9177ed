"""Fault injection: a Blob wrapper that fails, loses responses, repeats requests or lies.

`FaultyBlob` wraps a real `Blob` and, by one seeded random draw per call of an operation in
``operations``, injects at most one of these faults (each a probability per call; they are
tried in this order and their sum should stay <= 1):

- ``fail_before``: raise *before* doing the operation (certainly not done).
- ``fail_after``: do the operation, then raise (done, but the caller is told it failed; the
  indeterminate case a timeout produces).
- ``lose_response``: the store applied the request and its response was lost; the caller gets
  ``TimeoutError``. (The same outcome as ``fail_after``, counted apart as ``lost``.)
- ``retry_after_lost``: the response was lost and the *client library* retried on its own
  (botocore and s3fs do, invisibly to the caller): the operation is applied, then the same
  request is issued again, and the caller gets the *second* answer. For ``put_if_absent``
  that answer is False ("exists": the retry met the object the first request created),
  exactly what s3fs reports after a 412 to its retry; ``put`` and ``delete`` answer as usual.
- ``duplicate``: the network delivered the request twice: applied twice, the caller gets the
  first answer (for ``put_if_absent`` the second delivery is refused by the store, harmless on
  an honest store).

Independently of the draw, ``ignore_condition`` (a probability per ``put_if_absent``; 1.0
makes a consistently lying store) turns ``put_if_absent`` into a plain ``put`` that
overwrites whatever is there and answers True: an S3-compatible endpoint that ignores
``If-None-Match``. The wrapper keeps the inner's capabilities, so the lie is not declared.

Errors are ``TimeoutError`` (an ``OSError``), as a network filesystem would raise. The commit
protocol must stay correct under every fault: no lost commit, no commit applied twice, no
partial state visible, no refusal reported for a commit that landed.

It can also *stall* (``stall``, with ``on_stall``): pause before an operation while
``on_stall()`` runs, which lets other writers commit and gc truncate the log in the middle of
this caller's commit, as a long GC pause or a slow network would.

Counters: ``injected`` (every fault but stalls and lies), ``lost``, ``retried``,
``duplicated``, ``lied``, ``stalls``.

`Faults` is a picklable factory of such wrappers: what
`persistshard.conformance.storage.Store.wrap` takes to run the shipped contract suites under a
fault (racing worker processes build their own wrapped blobs from it).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from persistshard.core.storage.blob import Blob, BlobWrapper

log = logging.getLogger("persistshard.conformance.faults")

#: Every fault a draw may pick, in the order their probabilities are stacked.
FAULTS = ("before", "after", "lost", "retry", "duplicate")


class FaultyBlob(BlobWrapper):
    """A `Blob` whose operations fail, lose their responses, repeat or lie at random (see the
    module docstring). It wraps any implementation of the interface and keeps its
    capabilities. ``enabled = False`` turns every fault off (also ``ignore_condition``)."""

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
        lose_response: float = 0.0,
        retry_after_lost: float = 0.0,
        duplicate: float = 0.0,
        ignore_condition: float = 0.0,
    ) -> None:
        super().__init__(inner)
        self.fail_before = fail_before
        self.fail_after = fail_after
        self.lose_response = lose_response
        self.retry_after_lost = retry_after_lost
        self.duplicate = duplicate
        self.ignore_condition = ignore_condition
        self.operations = operations
        self.stall = stall
        self.on_stall = on_stall
        self.enabled = True
        self.injected = 0
        self.lost = 0
        self.retried = 0
        self.duplicated = 0
        self.lied = 0
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
        odds = (
            self.fail_before,
            self.fail_after,
            self.lose_response,
            self.retry_after_lost,
            self.duplicate,
        )
        edge = 0.0
        for fault, p in zip(FAULTS, odds, strict=True):
            edge += p
            if r < edge:
                return fault
        return None

    def _run(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
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
        if fault == "lost":
            self.injected += 1
            self.lost += 1
            log.debug("injecting a lost response to %s (done)", op)
            raise TimeoutError(f"injected: the response to {op} was lost (it was done)")
        if fault == "retry":
            self.injected += 1
            self.retried += 1
            log.debug("injecting a lost response to %s and the client's own retry", op)
            return fn(*args)
        if fault == "duplicate":
            self.injected += 1
            self.duplicated += 1
            log.debug("injecting a duplicated %s", op)
            fn(*args)
        return result

    def _lie(self) -> bool:
        if not self.enabled or not self.ignore_condition:
            return False
        with self._lock:
            lie = self._rng.random() < self.ignore_condition
        if lie:
            self.lied += 1
        return lie

    def probe_key(self) -> Hashable | None:
        """The inner's, unless this wrapper lies about conditional creates: then its own."""
        if self.ignore_condition:
            return ("faulty-ignores-condition", id(self))
        return self.inner.probe_key()

    def get(self, key: str) -> bytes | None:
        result: bytes | None = self._run("get", self.inner.get, key)
        return result

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        result: bytes = self._run("get", self.inner.get_range, key, offset, length)
        return result

    def put(self, key: str, data: bytes) -> None:
        self._run("put", self.inner.put, key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self._lie():

            def overwrite(key: str, data: bytes) -> bool:
                self.inner.put(key, data)
                return True

            lied: bool = self._run("put_if_absent", overwrite, key, data)
            return lied
        result: bool = self._run("put_if_absent", self.inner.put_if_absent, key, data)
        return result

    def delete(self, key: str) -> None:
        self._run("delete", self.inner.delete, key)


@dataclass
class Faults:
    """Wraps each blob it is called with in a fresh `FaultyBlob` with the keywords ``odds``
    (e.g. ``{"lose_response": 0.25}``) and ``operations`` (None: FaultyBlob's default), so a
    `persistshard.conformance.storage.Store` built with ``wrap=Faults(...)`` runs the
    contract suites under that fault.

    Picklable (racing workers in other processes wrap their own blobs). The n-th blob made
    in a process draws with seed ``seed + n``: reproducible, while two handles of one test do
    not meet the same faults in lockstep. ``made`` holds this process's wrappers (not
    pickled), so a test can count what was injected (`injected`)."""

    odds: dict[str, float]
    seed: int = 0
    operations: frozenset[str] | None = None
    made: list[FaultyBlob] = field(default_factory=list, repr=False, compare=False)

    def __call__(self, blob: Blob) -> FaultyBlob:
        keywords: dict[str, Any] = dict(self.odds)
        if self.operations is not None:
            keywords["operations"] = self.operations
        faulty = FaultyBlob(blob, seed=self.seed + len(self.made), **keywords)
        self.made.append(faulty)
        return faulty

    @property
    def injected(self) -> int:
        """Faults injected so far by the wrappers this process made."""
        return sum(b.injected for b in self.made)

    @property
    def names(self) -> str:
        """The faults, for test ids and messages."""
        return "+".join(sorted(self.odds))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["made"] = []  # wrappers hold locks and belong to this process
        return state
