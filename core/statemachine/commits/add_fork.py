"""``add_fork``: a shard records a fork that will name its parts (`ShardState.forks`).

Committed on the source *before* the fork's first entry exists (`persistshard.core.fork`), so
no fork ever names a part its source's gc may delete.

Precondition: every pinned key is kept by the state the pin lands on (a part of it, or
pinned by another fork: `ShardState.kept_keys`), else `StateConflict` (a compaction and gc
replaced them since the fork read the source: fork again). That is what makes the pin safe
against a racing gc: a key named by the head when the pin lands was named by every head a
gc could have read before it, so no gc deletes it. Effect: ``forks[fork_id]`` = the pin, at
the commit's time (an existing pin of the same fork is replaced: a retried creation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ForkPin, ShardState
from persistshard.errors import StateConflict


@dataclass(frozen=True)
class AddFork(Commit):
    """Pin ``keys`` for the fork ``fork_id`` at ``location`` (module docstring)."""

    kind = "add_fork"

    fork_id: str
    location: str
    keys: tuple[str, ...]

    def args_json(self) -> dict[str, Any]:
        return {"fork_id": self.fork_id, "location": self.location, "keys": list(self.keys)}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        fork_id, location, keys = args["fork_id"], args["location"], args["keys"]
        if not isinstance(fork_id, str) or not isinstance(location, str):
            raise TypeError(f"add_fork arguments {args!r} are not an id and a location")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise TypeError(f"add_fork keys {keys!r} are not strings")
        return {"fork_id": fork_id, "location": location, "keys": tuple(keys)}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        kept = state.kept_keys()
        gone = [k for k in self.keys if k not in kept]
        if gone:
            raise StateConflict(
                f"fork {self.location}: {len(gone)} of the parts it would name (first "
                f"{gone[0]}) are no longer the shard's (replaced by a compaction since the "
                "fork read it); fork again",
                location=location,
            )
        pin = ForkPin(self.location, self.keys, self.now())
        return replace(state, forks={**state.forks, self.fork_id: pin})

    def summary(self) -> str:
        return f"fork {self.location} pins {len(self.keys)} parts"
