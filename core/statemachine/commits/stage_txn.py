"""``stage_txn``: a registered shard pins the parts a transaction wrote to it, before the txns
shard's commit names them (`ShardState.txn_pins`, `persistshard.core.txns`), so its gc keeps
them from the moment they are written until they are applied.

Precondition: the shard is registered with a txns shard (`InvalidOption`), and the writes of
the pinned parts hold live leases (`Commit.leased_writes`: after gc's fence no pin may adopt
parts gc may have deleted, `LeaseExpired`). Effect: ``txn_pins[txn]`` = the keys, at the
commit's time (a retried pin replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.commits.register_txns import require_registered
from persistshard.core.statemachine.state import ShardState, TxnPin, part_write_id


@dataclass(frozen=True)
class StageTxn(Commit):
    """Pin ``keys`` for the transaction ``txn`` (module docstring)."""

    kind = "stage_txn"

    txn: str
    keys: tuple[str, ...]

    def args_json(self) -> dict[str, Any]:
        return {"txn": self.txn, "keys": list(self.keys)}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        txn, keys = args["txn"], args["keys"]
        if not isinstance(txn, str):
            raise TypeError(f"stage_txn transaction {txn!r} is not an id")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise TypeError(f"stage_txn keys {keys!r} are not strings")
        return {"txn": txn, "keys": tuple(keys)}

    def leased_writes(self) -> set[str]:
        return {w for w in (part_write_id(k) for k in self.keys) if w is not None}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        require_registered(state, f"transaction {self.txn} pins its parts", location)
        pins = {**state.txn_pins, self.txn: TxnPin(self.keys, self.now())}
        return replace(state, txn_pins=pins)

    def summary(self) -> str:
        return f"transaction {self.txn} pins {len(self.keys)} parts"
