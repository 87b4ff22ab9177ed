"""Listen: a subscription to a shard's changes from a time on, holding since while it runs.

``shard.listen(as_of)`` yields ``(updates, frontier)`` pairs. The first is the snapshot as of
``as_of``, given as updates at time ``as_of`` (rows, ``_time``, ``_diff``), with frontier
``as_of + 1``; each later one holds every update in ``[previous frontier, frontier)``,
consolidated, and comes once the shard's upper has moved past the previous frontier.

What always holds:
- Summing every pair's updates up to a frontier ``f`` gives the snapshot as of ``f - 1``: the
  pairs are the shard's history from ``as_of`` on, each update exactly once.
- While the listener is open it holds since at ``frontier - 1`` (the last time it has fully
  delivered), so every later read it makes is exact. Closing it (or leaving its ``with``
  block) releases the hold; a listener that dies lets its lease run out.
- A delivery is never lost to a failure after its updates were read: moving the hold is
  best effort (a failed move keeps since lower until the next delivery moves it), and a
  failure before the read leaves the frontier where it was, so the next call reads again:
  a read that lost a race with gc (`VersionCollected`, `persistshard.core.read.race`) is
  such a failure, and the next call delivers.
- Waiting polls the shard's upper with exponential backoff and renews the lease while it waits;
  ``timeout`` (seconds, None for ever) ends the iteration when nothing new arrives in time.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Protocol

import pyarrow as pa

from persistshard.core.config import ShardConfig
from persistshard.core.rows import DIFF, TIME
from persistshard.core.statemachine.holds import ReaderHold
from persistshard.core.storage.layout import new_id
from persistshard.errors import HoldExpired, Indeterminate, SinceViolation

log = logging.getLogger("persistshard.core.read.listen")


class Readable(Protocol):
    """What a listener reads through (a `persistshard.core.shard.Shard`)."""

    location: str
    config: ShardConfig

    @property
    def upper(self) -> int: ...

    def register_reader(self, reader_id: str, *, lease_seconds: float = ...) -> ReaderHold: ...

    def snapshot(self, as_of: int | None = None) -> pa.Table: ...

    def updates(self, from_time: int, to_time: int) -> pa.Table: ...


class Listen:
    """An open subscription (see the module docstring); iterate it, then close it."""

    def __init__(
        self,
        shard: Readable,
        as_of: int,
        *,
        timeout: float | None,
        reader_id: str | None,
        lease_seconds: float,
        min_poll_seconds: float = 0.02,
        max_poll_seconds: float = 1.0,
    ) -> None:
        self.shard = shard
        self.as_of = int(as_of)
        self.timeout = timeout
        self.min_poll = min_poll_seconds
        self.max_poll = max_poll_seconds
        self.hold = shard.register_reader(
            reader_id or f"listen-{new_id(shard.config.clock())}", lease_seconds=lease_seconds
        )
        if self.as_of < self.hold.since:
            self.hold.expire()
            raise SinceViolation(self.as_of, self.hold.since, location=shard.location)
        if self.as_of > self.hold.since:
            self.hold.downgrade_since(self.as_of)
        self.frontier: int | None = None  # None until the snapshot was delivered
        self._renewed = time.monotonic()
        self._closed = False

    def __iter__(self) -> Listen:
        return self

    def __next__(self) -> tuple[pa.Table, int]:
        if self._closed:
            raise StopIteration
        upper = self._wait_past(self.as_of if self.frontier is None else self.frontier)
        if upper is None:
            self.close()
            raise StopIteration
        if self.frontier is None:
            table = _as_updates(self.shard.snapshot(self.as_of), self.as_of)
            self.frontier = self.as_of + 1
            return table, self.frontier
        table = self.shard.updates(self.frontier, upper)
        self.frontier = upper
        try:
            self.hold.downgrade_since(upper - 1)
            self._renewed = time.monotonic()
        except (OSError, Indeterminate, HoldExpired) as e:
            # The updates are read and the frontier has moved: deliver them (raising here
            # would lose them). The hold stays where it was, which only keeps since lower
            # (the next delivery moves it); a hold that expired shows as SinceViolation on
            # the next read if since has passed the frontier meanwhile.
            log.warning("listener could not move its hold to %d: %s", upper - 1, e)
        return table, upper

    def _wait_past(self, time_: int) -> int | None:
        """The shard's upper once it is beyond ``time_`` (so ``time_`` is sealed and there is
        something new to read), or None after ``timeout`` seconds without that."""
        started = time.monotonic()
        pause = self.min_poll
        while True:
            upper = self.shard.upper  # the newest state's
            if upper > time_:
                return upper
            now = time.monotonic()
            if self.timeout is not None and now - started >= self.timeout:
                log.debug("listen: upper still %d after %.1f s; timing out", upper, now - started)
                return None
            if now - self._renewed >= self.hold.lease_seconds / 3:
                self.hold.heartbeat()
                self._renewed = now
            wait = pause
            if self.timeout is not None:
                wait = min(wait, max(0.0, self.timeout - (now - started)))
            time.sleep(wait)
            pause = min(pause * 2, self.max_poll)

    def close(self) -> None:
        """Release the hold (idempotent)."""
        if not self._closed:
            self._closed = True
            self.hold.expire()

    def __enter__(self) -> Listen:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _as_updates(snapshot: pa.Table, at: int) -> pa.Table:
    """A snapshot (rows + ``_diff``) as updates at time ``at`` (rows + ``_time`` + ``_diff``)."""
    times = pa.array([at] * snapshot.num_rows, pa.int64())
    index = snapshot.schema.get_field_index(DIFF)
    return snapshot.add_column(index, pa.field(TIME, pa.int64(), nullable=False), times)
