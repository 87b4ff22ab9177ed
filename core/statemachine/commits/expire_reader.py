"""``expire_reader``: a reader's hold is released (`persistshard.core.statemachine.holds`).

No precondition (idempotent: a reader without a hold changes nothing but the version).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.model import ShardState


@dataclass(frozen=True)
class ExpireReader(Commit):
    """Drop ``reader_id``'s hold (module docstring)."""

    kind = "expire_reader"

    reader_id: str

    def args_json(self) -> dict[str, Any]:
        return {"reader_id": self.reader_id}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        return {"reader_id": args["reader_id"]}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        holds = {r: h for r, h in state.holds.items() if r != self.reader_id}
        return replace(state, holds=holds)

    def summary(self) -> str:
        return f"reader {self.reader_id} releases its hold"
