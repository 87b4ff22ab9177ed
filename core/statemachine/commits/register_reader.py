"""``register_reader``: a reader takes a hold on since (`persistshard.core.statemachine.holds`).

Precondition: the reader id has no live hold (``AssertNoLiveHold``). Effect: a hold at the
current since, leased until the commit's time + ``lease_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import AssertNoLiveHold, Hold, ShardState


@dataclass(frozen=True)
class RegisterReader(Commit):
    """Hold since for ``reader_id`` (unique among live holds) with a lease of ``lease_ms``,
    which every `heartbeat` and `downgrade_since` of the reader renews."""

    kind = "register_reader"

    reader_id: str
    lease_ms: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        now = self.now()
        AssertNoLiveHold(self.reader_id, now).check(state, location)
        hold = Hold(state.since, now + self.lease_ms, self.lease_ms)
        return replace(state, holds={**state.holds, self.reader_id: hold})

    def summary(self) -> str:
        return f"reader {self.reader_id} holds since (lease {self.lease_ms / 1000:g} s)"
