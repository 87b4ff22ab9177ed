"""``register_txns``: a shard is registered with a txns shard (`ShardState.txns`,
`persistshard.core.txns`): from then on its logical upper is the txns shard's and only
``apply_txn`` adds data to it.

Precondition: ``at`` is at or above the shard's upper (a shard is registered at a time no
earlier than its own upper), and the shard is not registered with another txns shard
(`InvalidOption`); registering again with the same one changes nothing but the version.
Effect: ``txns`` = the registration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState, TxnsRef
from persistshard.errors import InvalidOption, UpperMismatch


@dataclass(frozen=True)
class RegisterTxns(Commit):
    """Register with the txns shard ``txns_id`` at ``location`` from time ``at``."""

    kind = "register_txns"

    txns_id: str
    location: str
    at: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        known = state.txns
        if known is not None:
            if known.shard_id != self.txns_id:
                raise InvalidOption(
                    f"the shard is registered with the txns shard at {known.location} (id "
                    f"{known.shard_id}); forget it there before registering it at "
                    f"{self.location}",
                    location=location,
                )
            return state
        if self.at < state.upper:
            raise UpperMismatch(self.at, state.upper, location=location)
        return replace(state, txns=TxnsRef(self.txns_id, self.location, self.at))

    def summary(self) -> str:
        return f"registered with txns shard {self.location} at {self.at}"


def require_registered(state: ShardState, doing: str, location: str | None) -> None:
    """`InvalidOption` saying what was refused (``doing``) unless the shard is registered."""
    if state.txns is None:
        raise InvalidOption(
            f"{doing}: the shard is not registered with a txns shard (txns.register it "
            "first); nothing was applied",
            location=location,
        )
