"""``release_fork``: a shard forgets a fork's pin (`ShardState.forks`): its gc may then delete
the parts only that pin kept (after the retention window, like any part a commit removed).

No precondition (idempotent: a pin that is gone changes nothing but the version). Taken by a
dropped shard too (a fork may outlive its source's drop).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class ReleaseFork(Commit):
    """Drop the pin of the fork ``fork_id`` (module docstring)."""

    kind = "release_fork"
    on_dropped = True

    fork_id: str

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        forks = {f: p for f, p in state.forks.items() if f != self.fork_id}
        return replace(state, forks=forks)

    def summary(self) -> str:
        return f"fork {self.fork_id} released its pin"
