"""``sweep_leases``: gc's lease fence (`persistshard.core.statemachine.leases`).

No precondition. Effect: ``lease_fence_ms`` rises to ``through_ms`` (never falls) and the
explicit leases that ran out by then are dropped: from now on no commit may add a part of a
write whose lease ran out by the fence, because gc is about to delete such parts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True)
class SweepLeases(Commit):
    """gc's fence at ``through_ms`` (module docstring)."""

    kind = "sweep_leases"

    through_ms: int

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        fence = max(state.lease_fence_ms, self.through_ms)
        leases = {w: e for w, e in state.leases.items() if e > fence}
        return replace(state, lease_fence_ms=fence, leases=leases)

    def summary(self) -> str:
        return f"gc sweeps the parts of writes whose lease ran out by {self.through_ms} ms"
