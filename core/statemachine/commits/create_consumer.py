"""``create_consumer``: a durable consumer is created at the shard's since
(`persistshard.core.statemachine.consumers`).

No precondition (idempotent: a consumer of that name already there keeps its position, so two
processes creating one consumer at once both get it). Effect: the consumer at ``position =
since``, moved at the commit's time; from then on since moves no further than
``position - 1`` (it is at the since already, so since stays where it is until the consumer
advances).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ConsumerPosition, ShardState


@dataclass(frozen=True)
class CreateConsumer(Commit):
    """Create consumer ``name`` at the since, unless it exists (module docstring)."""

    kind = "create_consumer"

    name: str

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        if self.name in state.consumers:
            return state
        created = ConsumerPosition(state.since, self.now())
        return replace(state, consumers={**state.consumers, self.name: created})

    def summary(self) -> str:
        return f"consumer {self.name} created at the since"
