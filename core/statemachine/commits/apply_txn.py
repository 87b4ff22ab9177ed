"""``apply_txn``: a committed transaction's write lands on a registered data shard
(`persistshard.core.txns`): the append of the batch the transaction wrote, at
``[upper, t + 1)`` where ``t`` is the transaction's commit time on the txns shard.

Precondition: the shard is registered (`ShardState.txns`, else `InvalidOption`) and its upper
is ``expected_upper`` (`AssertUpper`: whoever applies reads the shard again on a lost race; an
upper above ``t`` means the write is applied already). Never refused for an expired lease
(`leased_writes` is empty): its parts are pinned (``stage_txn``) from before the txns commit,
so gc kept them. Effect: the append's (`commits.append.Append`), and the transaction's pin
goes (its parts are the state's now).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.register_txns import require_registered
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class ApplyTxn(Append):
    """Apply transaction ``txn``'s batch (module docstring)."""

    kind = "apply_txn"
    through_txns: ClassVar[bool] = True

    txn: str = ""

    def args_json(self) -> dict[str, Any]:
        return {**super().args_json(), "txn": self.txn}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        rest = dict(args)
        txn = rest.pop("txn")
        if not isinstance(txn, str) or not txn:
            raise TypeError(f"apply_txn transaction {txn!r} is not an id")
        return {**super().fields_from_args(rest), "txn": txn}

    def leased_writes(self) -> set[str]:
        return set()

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        require_registered(state, f"transaction {self.txn} applies its write", location)
        new = super().apply(state, location)
        return replace(new, txn_pins={t: p for t, p in new.txn_pins.items() if t != self.txn})

    def history_kind(self) -> str:
        return "apply_txn"

    def summary(self) -> str:
        rows = sum(p.num_rows for p in self.batch.parts)
        return (
            f"transaction {self.txn}: {rows} rows, upper {self.expected_upper} -> {self.new_upper}"
        )
