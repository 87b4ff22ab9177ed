"""``drop_consumer``: a durable consumer is removed and stops holding since
(`persistshard.core.statemachine.consumers`).

No precondition (idempotent: dropping a consumer that is not there changes nothing but the
version). Effect: the consumer is gone; since no longer waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class DropConsumer(Commit):
    """Drop consumer ``name`` (module docstring)."""

    kind = "drop_consumer"

    name: str

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        consumers = {n: c for n, c in state.consumers.items() if n != self.name}
        return replace(state, consumers=consumers)

    def summary(self) -> str:
        return f"consumer {self.name} dropped"
