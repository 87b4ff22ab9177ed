"""``downgrade_since``: a reader moves its hold forward (`persistshard.core.statemachine.holds`).

Precondition: the reader's hold is live (``AssertLiveHold``, else `HoldExpired`) and the new
hold is not behind the old one (else `SinceViolation`). Effect: the hold moves to ``since``
and its lease is renewed from the commit's time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import AssertLiveHold, Hold, ShardState
from persistshard.errors import SinceViolation


@dataclass(frozen=True)
class DowngradeSince(Commit):
    """Move ``reader_id``'s hold forward to ``since`` (module docstring)."""

    kind = "downgrade_since"

    reader_id: str
    since: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        reader, since = self.reader_id, self.since
        now = self.now()
        hold = AssertLiveHold(reader, now).check(state, location)
        if since < hold.since:
            raise SinceViolation(
                since,
                hold.since,
                location=location,
                message=f"reader {reader!r} cannot move its hold back from {hold.since} to "
                f"{since}: holds only move forward",
            )
        holds = {**state.holds, reader: Hold(since, now + hold.lease_ms, hold.lease_ms)}
        return replace(state, holds=holds)

    def summary(self) -> str:
        return f"reader {self.reader_id} holds since at {self.since}"
