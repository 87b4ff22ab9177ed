"""``drop``: the shard is dropped (`persistshard.core.fork.drop`): the first step of deleting
it, committed before anything is released or deleted.

No precondition (dropping a dropped shard changes nothing but the version). Effect: no batch,
no hold, no consumer, no write lease; since moves to the upper; ``dropped`` is set, so every read,
inspection and maintenance call says the shard is gone (`NoShard`) and every commit but
``release_fork`` and ``drop`` is refused. The pins of its forks stay: the parts they name
are kept until the forks release them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class Drop(Commit):
    """Drop the shard (module docstring)."""

    kind = "drop"
    on_dropped = True

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        return replace(
            state,
            since=state.upper,
            trace=(),
            unsealed=(),
            holds={},
            consumers={},
            leases={},
            dropped=True,
        )

    def summary(self) -> str:
        return "shard dropped"
