"""``advance_consumer``: a durable consumer moves its position forward, as a compare-and-set
(`persistshard.core.statemachine.consumers`).

Precondition: the consumer exists and is at ``expected`` (``AssertConsumerAt``, else
`StateConflict` with ``.expected`` and ``.actual``: another copy of the job moved it, or it
was dropped), and ``expected <= to <= upper`` (else `InvalidOption`; `Consumer.advance`
refuses such arguments with `InvalidOption` before it commits). Effect: the position is
``to`` and the consumer moved at the commit's time; since may follow up to ``to - 1`` on its
next move. The same commit retried after a lost race finds its own effect and is resolved by
its id (`persistshard.core.statemachine.machine`), never refused or applied twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import AssertConsumerAt, ConsumerPosition, ShardState
from persistshard.errors import InvalidOption


@dataclass(frozen=True)
class AdvanceConsumer(Commit):
    """Move consumer ``name`` from ``expected`` to ``to`` (module docstring)."""

    kind = "advance_consumer"

    name: str
    expected: int
    to: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        AssertConsumerAt(self.name, self.expected).check(state, location)
        if not self.expected <= self.to <= state.upper:
            raise InvalidOption(
                f"consumer {self.name!r} cannot move from {self.expected} to {self.to}: a "
                f"consumer moves forward only, and never past the upper {state.upper}",
                location=location,
            )
        moved = ConsumerPosition(self.to, self.now())
        return replace(state, consumers={**state.consumers, self.name: moved})

    def summary(self) -> str:
        return f"consumer {self.name} {self.expected} -> {self.to}"
