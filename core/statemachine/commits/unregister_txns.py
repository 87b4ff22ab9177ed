"""``unregister_txns``: a shard leaves its txns shard (`persistshard.core.txns`, ``forget``)
and is sealed at the logical upper it had there: a plain shard again.

Precondition: the shard is registered with ``txns_id`` (else nothing changes but the
version: a rerun after a crash), every pinned transaction of it is applied or released
(`StateConflict` otherwise), and ``upper`` is at or above its upper. Effect: ``txns`` is
cleared and the upper moves to ``upper`` (an empty trace batch, widened after a seal).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import Batch, ShardState
from persistshard.errors import InvalidOption, StateConflict


@dataclass(frozen=True)
class UnregisterTxns(Commit):
    """Leave the txns shard ``txns_id``, sealed at ``upper`` (module docstring)."""

    kind = "unregister_txns"

    txns_id: str
    upper: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        if state.txns is None or state.txns.shard_id != self.txns_id:
            return state
        if state.txn_pins:
            raise StateConflict(
                f"transactions {sorted(state.txn_pins)} are not applied yet; apply them "
                "(txns.apply()) before forgetting the shard",
                location=location,
            )
        if self.upper < state.upper:
            raise InvalidOption(
                f"cannot seal at {self.upper}: the upper is already {state.upper}",
                location=location,
            )
        trace = state.trace
        if self.upper > state.upper:
            last = trace[-1] if trace else None
            if last is not None and not last.parts and last.level == 0:
                trace = (*trace[:-1], replace(last, upper=self.upper))
            else:
                seal = Batch(f"{self.id}-t", state.upper, self.upper, ())
                trace = (*trace, seal)
        return replace(state, txns=None, upper=self.upper, trace=trace)

    def summary(self) -> str:
        return f"left txns shard {self.txns_id}, sealed at {self.upper}"
