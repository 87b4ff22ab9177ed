"""``advance_since``: since moves toward a new time, as far as live reader holds allow.

Precondition: the new since is at most the upper (else `NotSealed`). Effect: ``since =
max(since, min(new, every live hold))``; never back.
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
        holds = state.holds if self.at_ms is None else state.live_holds(self.at_ms)
        for hold in holds.values():
            since = min(since, hold.since)
        return replace(state, since=max(state.since, since))

    def summary(self) -> str:
        return f"since toward {self.since}, as far as live reader holds allow"
