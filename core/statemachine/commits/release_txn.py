"""``release_txn``: a registered shard drops a transaction's pin (`ShardState.txn_pins`): the
transaction lost its race on the txns shard, or died before committing there (gc finds its pin
older than `PIN_PENDING_MS` with no commit of it). gc may then delete its parts.

No precondition (idempotent: a pin that is gone changes nothing but the version).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class ReleaseTxn(Commit):
    """Drop the pin of the transaction ``txn`` (module docstring)."""

    kind = "release_txn"

    txn: str

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        pins = {t: p for t, p in state.txn_pins.items() if t != self.txn}
        return replace(state, txn_pins=pins)

    def summary(self) -> str:
        return f"transaction {self.txn} released its pin"
