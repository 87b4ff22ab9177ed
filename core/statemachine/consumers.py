"""Durable consumers: a named position in a shard that holds since back, with no lease.

A reader hold (`persistshard.core.statemachine.holds`) suits a running stream; a job that runs
nightly needs a position that keeps history between runs without heartbeats, and that two
copies of the job cannot both move (persist's critical since handles, Paimon's consumer ids).
A consumer is part of the shard state, committed through consensus like everything else.

What always holds:
- A consumer has read every update at a time below its ``position``; the changes it has
  still to read are the updates in ``[position, upper)``. It is created at the shard's since
  (`create_consumer`, idempotent) and only moves forward, never past the upper.
- Since moves no further than ``position - 1`` of every consumer (`ShardState.hold_floor`), so
  the updates from its position on stay exact (`check_updates_range`); a consumer created at
  since ``s`` keeps since at ``s`` until it moves, and its first read (`read_from`: from 0) is
  the snapshot at ``s`` as updates at ``s``, then every later update. This holds for
  `advance_since`, retention, compaction (which forwards only below since) and so gc.
- `Consumer.advance` is a compare-and-set on the position: it lands only if the position is
  still ``expected``; the loser gets `StateConflict` with ``.actual`` and nothing moves. A
  commit whose answer was lost is resolved by its id, never reported as refused.
- No lease: a consumer nobody advances holds since until it is dropped (`Consumer.drop`, CLI
  ``persistshard holds --drop NAME``); ``persistshard inspect`` shows each consumer's age, the
  time since the commit that last moved it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pyarrow as pa

from persistshard.core.statemachine.commits.advance_consumer import AdvanceConsumer
from persistshard.core.statemachine.commits.create_consumer import CreateConsumer
from persistshard.core.statemachine.commits.drop_consumer import DropConsumer
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import AssertConsumerAt, ConsumerPosition, ShardState
from persistshard.core.storage.layout import new_id
from persistshard.errors import InvalidOption, StateConflict

log = logging.getLogger("persistshard.core.statemachine.consumers")


def check_name(name: object, location: str | None) -> str:
    """``name`` if it is a non-empty string, else `InvalidOption`."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidOption(
            f"a consumer name must be a non-empty string, got {name!r}", location=location
        )
    return name


def read_from(state: ShardState, position: int) -> int:
    """Where a read of a consumer's changes (the updates in ``[position, upper)``) starts:
    ``position``, or 0 when the position is at since (a consumer that never moved since it was
    created there: it has read nothing, and the updates from 0 are the snapshot at since as
    updates at since, then every later one; the updates from since itself are not exact)."""
    return position if position > state.since else 0


class Consumer:
    """A handle on one durable consumer (module docstring).

    ``position`` is the position this handle last saw (when it was made, by its own
    `advance`, or by `refresh`), not re-read on each access: pass it as ``expected``, so a
    racing copy of a job that moved the consumer first makes this one's `advance` fail.
    """

    def __init__(
        self,
        machine: StateMachine,
        name: str,
        record: ConsumerPosition | None,
        updates: Callable[[int, int], pa.Table] | None = None,
    ) -> None:
        self.machine = machine
        self.name = name
        self._record = record
        self._updates = updates

    @classmethod
    def open(
        cls,
        machine: StateMachine,
        name: str,
        updates: Callable[[int, int], pa.Table] | None = None,
    ) -> Consumer:
        """Consumer ``name``: the existing one, or a new one at the shard's current since
        (a commit; racing creations both get the one that landed first). ``updates``: the
        shard's change read (`changes` uses it)."""
        check_name(name, machine.location)
        state = machine.state()
        record = state.consumers.get(name)
        if record is None:
            state = machine.commit(CreateConsumer(name, id=new_id()))
            record = state.consumers[name]
            log.info("%s: consumer %s created at %d", machine.location, name, record.position)
        return cls(machine, name, record, updates)

    def changes(self, to: int | None = None) -> pa.Table:
        """The updates this consumer has still to read, from its position (`read_from`) to
        ``to`` (default: the upper now): rows + ``_time`` + ``_diff``, as `Shard.updates`."""
        if self._updates is None:
            raise InvalidOption(
                f"consumer {self.name!r}: this handle reads nothing; get it from "
                "shard.consumer(name)",
                location=self.machine.location,
            )
        state = self.machine.state()
        return self._updates(read_from(state, self.position), state.upper if to is None else to)

    @property
    def position(self) -> int:
        """The consumer's position as this handle last saw it; `StateConflict` once dropped."""
        return self._current().position

    @property
    def moved_ms(self) -> int:
        """The commit time (ms since the epoch) of the commit that last moved the consumer,
        as this handle last saw it."""
        return self._current().moved_ms

    def _current(self) -> ConsumerPosition:
        if self._record is None:
            raise self._gone(None)
        return self._record

    def _gone(self, expected: int | None) -> StateConflict:
        return StateConflict(
            f"consumer {self.name!r} was dropped; create it again with shard.consumer(name)",
            location=self.machine.location,
            expected=expected,
            actual=None,
        )

    def refresh(self) -> int:
        """Read the consumer's position again (the newest state); `StateConflict` if it was
        dropped."""
        self._record = self.machine.state().consumers.get(self.name)
        return self.position

    def advance(self, to: int, *, expected: int) -> int:
        """Move the position from ``expected`` to ``to``, as a compare-and-set; returns ``to``.

        `StateConflict` (``.expected``, ``.actual``; nothing moved) when the consumer is not
        at ``expected`` (another process moved it, or it was dropped: ``.actual`` None); this
        handle then knows the actual position. `InvalidOption` when ``to`` is below
        ``expected`` (positions move forward only) or past the shard's upper. Moving to
        ``expected`` itself commits nothing once the position is checked.
        """
        location = self.machine.location
        for what, value in (("to", to), ("expected", expected)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidOption(
                    f"consumer {self.name!r}: {what} {value!r} is not a shard time (an "
                    "integer >= 0)",
                    location=location,
                )
        if to < expected:
            raise InvalidOption(
                f"consumer {self.name!r} cannot move back from {expected} to {to}: a "
                "consumer moves forward only",
                location=location,
            )
        state = self.machine.state()
        if to > state.upper:
            raise InvalidOption(
                f"consumer {self.name!r} cannot move to {to}: past the shard's upper "
                f"{state.upper} (the updates there are not sealed yet)",
                location=location,
            )
        try:
            found = self._check_at(state, expected)
            if to == expected:
                self._record = found
                return to
            state = self.machine.commit(AdvanceConsumer(self.name, expected, to, id=new_id()))
        except StateConflict:
            # The state the refusal was judged on: this handle now knows the actual position.
            self._record = self.machine.known().consumers.get(self.name)
            raise
        self._record = state.consumers[self.name]
        return to

    def _check_at(self, state: ShardState, expected: int) -> ConsumerPosition:
        return AssertConsumerAt(self.name, expected).check(state, self.machine.location)

    def drop(self) -> None:
        """Remove the consumer: since no longer waits for it (idempotent)."""
        self.machine.commit(DropConsumer(self.name, id=new_id()))
        self._record = None

    def __repr__(self) -> str:
        where = self._record.position if self._record is not None else "dropped"
        return f"Consumer({self.name!r}, position={where})"
