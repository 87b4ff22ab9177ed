"""``expire_reader``: a reader's hold is released (`persistshard.core.statemachine.holds`).

No precondition (idempotent: a reader without a hold changes nothing but the version).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class ExpireReader(Commit):
    """Drop ``reader_id``'s hold (module docstring)."""

    kind = "expire_reader"

    reader_id: str

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        holds = {r: h for r, h in state.holds.items() if r != self.reader_id}
        return replace(state, holds=holds)

    def summary(self) -> str:
        return f"reader {self.reader_id} releases its hold"
