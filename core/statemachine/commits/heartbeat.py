"""``heartbeat``: a reader renews its hold's lease (`persistshard.core.statemachine.holds`).

Precondition: the hold is live (``AssertLiveHold``, else `HoldExpired`). Effect: the lease
runs until the commit's time + the hold's lease.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import AssertLiveHold, ShardState


@dataclass(frozen=True)
class Heartbeat(Commit):
    """Renew ``reader_id``'s lease (module docstring)."""

    kind = "heartbeat"

    reader_id: str

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        now = self.now()
        hold = AssertLiveHold(self.reader_id, now).check(state, location)
        holds = {**state.holds, self.reader_id: replace(hold, expires_ms=now + hold.lease_ms)}
        return replace(state, holds=holds)

    def summary(self) -> str:
        return f"reader {self.reader_id} renews its lease"
