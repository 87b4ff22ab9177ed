"""Reader holds: a reader's leased claim that the shard keep history from some time on.

The shard's since may only advance to the smallest since held by a *live* reader, so a reader
can read exactly at every time at or after its hold (a snapshot ``as_of >= hold``, the
updates from ``hold + 1``). A hold is part of the shard state, committed through consensus
like everything else, so every process sees it. Leases make crashed readers harmless: a hold
whose lease ran out (by the clock of the commit that looks at it) no longer counts, and is
dropped by the next commit.

What always holds:
- A hold starts at the shard's since when it registers, and only moves forward
  (`ReaderHold.downgrade_since`; backwards is `SinceViolation`).
- Renewing (`heartbeat`, `downgrade_since`) needs a live hold; an expired one is `HoldExpired`
  and never comes back (register again: the shard may have compacted past it meanwhile).
- Reader ids are unique among live holds (a second registration is `InvalidOption`).

Relies on: the state machine's clock (its configuration's ``clock``) being roughly the
same on every process that commits; a clock far ahead on one committer can expire a hold early.
"""

from __future__ import annotations

import logging
from types import TracebackType

from persistshard.core.statemachine.commits import Commit
from persistshard.core.statemachine.commits.downgrade_since import DowngradeSince
from persistshard.core.statemachine.commits.expire_reader import ExpireReader
from persistshard.core.statemachine.commits.heartbeat import Heartbeat
from persistshard.core.statemachine.commits.register_reader import RegisterReader
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import Hold
from persistshard.errors import HoldExpired, InvalidOption

log = logging.getLogger("persistshard.core.statemachine.holds")

#: The lease of a hold when the reader does not choose one.
DEFAULT_LEASE_SECONDS = 900.0


def lease_ms(lease_seconds: float) -> int:
    """A lease in whole milliseconds; it must be positive."""
    if not lease_seconds > 0:
        raise InvalidOption(f"lease_seconds must be positive, got {lease_seconds}")
    return max(1, int(lease_seconds * 1000))


class ReaderHold:
    """A handle on one reader's hold (see the module docstring). A context manager: leaving
    the ``with`` block expires the hold."""

    def __init__(self, machine: StateMachine, reader_id: str, hold: Hold) -> None:
        self.machine = machine
        self.reader_id = reader_id
        self._hold = hold
        self._expired = False

    @classmethod
    def register(
        cls, machine: StateMachine, reader_id: str, lease_seconds: float = DEFAULT_LEASE_SECONDS
    ) -> ReaderHold:
        """Hold the shard's current since under a new reader id."""
        if not reader_id:
            raise InvalidOption("a reader id must be a non-empty string")
        lease = lease_ms(lease_seconds)
        state = machine.commit(RegisterReader(reader_id, lease, id=machine.new_id()))
        return cls(machine, reader_id, state.holds[reader_id])

    @classmethod
    def attach(cls, machine: StateMachine, reader_id: str) -> ReaderHold:
        """The handle of a live hold registered earlier (by this or another process); renews
        its lease. `HoldExpired` if there is none."""
        state = machine.commit(Heartbeat(reader_id, id=machine.new_id()))
        return cls(machine, reader_id, state.holds[reader_id])

    @property
    def since(self) -> int:
        """The time this reader holds: reads at or after it stay exact."""
        return self._hold.since

    @property
    def expires_ms(self) -> int:
        """When the lease runs out unless renewed (ms since the epoch), as last committed."""
        return self._hold.expires_ms

    @property
    def lease_seconds(self) -> float:
        return self._hold.lease_ms / 1000

    def _run(self, commit: Commit) -> None:
        if self._expired:
            raise HoldExpired(self.reader_id, location=self.machine.location)
        try:
            state = self.machine.commit(commit)
        except HoldExpired:
            log.info("reader %s: hold expired (%s)", self.reader_id, commit.kind)
            self._expired = True
            raise
        self._hold = state.holds[self.reader_id]

    def downgrade_since(self, since: int) -> None:
        """Move the hold forward to ``since`` (renews the lease); a no-op at the same time."""
        self._run(DowngradeSince(self.reader_id, int(since), id=self.machine.new_id()))

    def heartbeat(self) -> None:
        """Renew the lease."""
        self._run(Heartbeat(self.reader_id, id=self.machine.new_id()))

    def expire(self) -> None:
        """Release the hold (idempotent)."""
        if not self._expired:
            self.machine.commit(ExpireReader(self.reader_id, id=self.machine.new_id()))
            self._expired = True

    def __enter__(self) -> ReaderHold:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.expire()

    def __repr__(self) -> str:
        return f"ReaderHold({self.reader_id!r}, since={self.since})"
