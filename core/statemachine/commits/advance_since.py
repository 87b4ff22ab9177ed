"""``advance_since``: since moves toward a new time, as far as live reader holds allow.

Precondition: the new since is at most the upper (else `NotSealed`). Effect: ``since =
max(since, min(new, every live hold, every consumer's position - 1))``; never back
(`ShardState.hold_floor`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState
from persistshard.errors import NotSealed


@dataclass(frozen=True)
class AdvanceSince(Commit):
    """Move since toward ``since`` (module docstring)."""

    kind = "advance_since"

    since: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        since = self.since
        if since > state.upper:
            raise NotSealed(
                since,
                state.upper,
                location=location,
                message=f"cannot advance since to {since}: it would pass the upper {state.upper}",
            )
        floor = state.hold_floor(self.at_ms)
        if floor is not None:
            since = min(since, floor)
        return replace(state, since=max(state.since, since))

    def summary(self) -> str:
        return f"since toward {self.since}, as far as live reader holds allow"
