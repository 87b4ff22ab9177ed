"""``renew_lease``: a long write extends its explicit lease
(`persistshard.core.statemachine.leases`).

Precondition: the write's lease is live and past gc's fence, checked before any attempt
(``leased_writes``; `LeaseExpired`), not on replay. Effect: the lease runs until the later of
its expiry and the commit's time + ``lease_ms`` (never shortened).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class RenewLease(Commit):
    """Extend the lease of ``write_id`` by ``lease_ms`` from the commit's time."""

    kind = "renew_lease"

    write_id: str
    lease_ms: int

    def leased_writes(self) -> set[str]:
        return {str(self.write_id)}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        until = max(state.leases.get(self.write_id, 0), self.now() + self.lease_ms)
        return replace(state, leases={**state.leases, self.write_id: until})

    def summary(self) -> str:
        return f"write {self.write_id} renews its lease ({self.lease_ms / 1000:g} s)"
