"""Write leases: a write in flight keeps gc away from its parts, and commits only while it lives.

A write (an append, an overwrite, an upsert, a Spark job, a compaction) writes its parts under
``parts/<write id>/`` before the commit that references them. Until that commit lands nothing
references the parts, so gc cannot tell them from the leftovers of a write that died. The
*lease* settles it: a write owns its parts while its lease is live, and gc deletes the
unreferenced parts of a write only once its lease ran out.

- Every write has an *implicit* lease: `DEFAULT_WRITE_LEASE_SECONDS` from the time in its write
  id (`persistshard.core.storage.layout.new_id`). Short writes never do anything else.
- A write that may outlive it holds an *explicit* lease in the shard state (``leases``: write
  id -> expiry), renewed by `renew_lease` commits (`WriteLease` renews from a background
  thread). An explicit lease named ``w`` also covers the writes ``w-<suffix>`` (the delta
  writes of an overwrite). A write's lease expires at the later of the two.
- gc (`persistshard.core.maintenance.gc`) deletes an unreferenced part only when its write's lease
  ran out by gc's clock, and before deleting anything it commits a *fence* (`sweep_leases`,
  ``lease_fence_ms`` = gc's clock).

What always holds: a commit never lands that adds a part gc may have deleted. Before every
attempt the state machine checks (`check_commit`, against the very state version the
compare-and-set expects) that the lease of each added part's write is live both at the
commit's time and past the state's fence; otherwise the commit is refused with `LeaseExpired`
(determinate: nothing applied). gc's fence is a commit, so an attempt that read the state
before the fence loses its compare-and-set, re-reads, and is refused; an attempt that landed
before the fence is in the log gc reads after its fence, so its parts are referenced and kept.

The Spark paths hold leases with `holding` (several `WriteLease` at once, optionally checked
live first): the drivers of the distributed overwrite and compaction from the mint to the
commit, upsert staging tasks while they run, the streaming and upsert commits over every
task's write. A task's write is renewed only while it runs or once the commit holds it, so a
Spark job whose task ended more than a lease before its commit began is still refused
(`LeaseExpired`, never missing parts): no driver-side Python process lives while the tasks run.

Relies on: the committing processes' clocks agreeing to well within a lease (a committer
whose clock runs behind by more than the time left on a lease can still commit after gc's
clock says the lease ran out: the fence then refuses it only if gc already ran). Leases are
not checked on replay: the log holds commits that passed the check when they landed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Protocol

from persistshard.core.config import ShardConfig
from persistshard.core.statemachine.commits import Commit
from persistshard.core.statemachine.commits.renew_lease import RenewLease
from persistshard.core.statemachine.commits.sweep_leases import SweepLeases
from persistshard.core.statemachine.state import ShardState, lease_covers
from persistshard.core.storage.layout import id_time_ms
from persistshard.errors import InvalidOption, LeaseExpired


class Committer(Protocol):
    """What leases need of a state machine (`persistshard.core.statemachine.machine.StateMachine`,
    which imports this module to check leases, so it is named by its shape here)."""

    config: ShardConfig

    def commit(self, commit: Commit) -> ShardState: ...

    def state(self) -> ShardState: ...

    def new_id(self) -> str: ...


log = logging.getLogger("persistshard.core.statemachine.leases")

#: The implicit lease of every write, from the time in its write id. A write that may take
#: longer holds a `WriteLease`, which renews it. Not a knob of a shard's configuration
#: (`persistshard.core.config`): gc judges other processes' writes by it, so every process
#: writing to a shard must agree on it.
DEFAULT_WRITE_LEASE_SECONDS = 3600.0


def implicit_lease_ms() -> int:
    """The implicit lease in milliseconds (read at each use, so tests can shorten it)."""
    return int(DEFAULT_WRITE_LEASE_SECONDS * 1000)


def expiry_ms(state: ShardState, write_id: str) -> int | None:
    """When the lease of ``write_id`` runs out (ms since the epoch) in ``state``, or None if
    it cannot be told (a write id without a time and without an explicit lease: such parts
    are never deleted by gc, and never refused)."""
    started = id_time_ms(write_id)
    best = started + implicit_lease_ms() if started is not None else None
    for lease_id, until in state.leases.items():
        if lease_covers(lease_id, write_id) and (best is None or until > best):
            best = until
    return best


def live(state: ShardState, write_id: str, now_ms: int) -> bool:
    """Whether the lease of ``write_id`` is live at ``now_ms`` and past gc's fence."""
    until = expiry_ms(state, write_id)
    return until is None or (until > now_ms and until > state.lease_fence_ms)


def check_commit(state: ShardState, commit: Commit, location: str | None) -> None:
    """Refuse (`LeaseExpired`) ``commit``, about to be applied to ``state`` at its time
    ``commit.at_ms``, if it adds a part of a write whose lease ran out or is behind the fence,
    or if it renews such a lease (``commit.leased_writes()``). See the module docstring for
    why this is enough."""
    now = commit.at_ms
    if now is None:
        return
    for write_id in sorted(commit.leased_writes()):
        if not live(state, write_id, now):
            until = expiry_ms(state, write_id)
            assert until is not None
            raise LeaseExpired(write_id, until, now, location=location)


def require_live(
    state: ShardState, write_ids: Iterable[str], location: str | None, now_ms: int
) -> None:
    """Raise `LeaseExpired` if the lease of any of ``write_ids`` ran out (or is behind gc's
    fence) in ``state`` at ``now_ms`` (the shard's clock): gc may have deleted its parts, so
    whatever would read or commit them must stop here, with a clear error, rather than meet
    missing files later (`CorruptData`)."""
    now = now_ms
    for write_id in sorted(set(write_ids)):
        if not live(state, write_id, now):
            until = expiry_ms(state, write_id)
            assert until is not None
            raise LeaseExpired(write_id, until, now, location=location)


@contextlib.contextmanager
def holding(
    machine: Committer,
    write_ids: Iterable[str],
    *,
    check: bool = False,
    location: str | None = None,
) -> Iterator[list[WriteLease]]:
    """Keep the leases of every one of ``write_ids`` (duplicates and empty ids dropped) alive
    while the block runs: a `WriteLease` each, renewed by the process's lease keeper.

    With ``check``, first make sure they are all live now (`require_live`, one state read):
    for a step that is about to read parts other processes wrote under those ids (staged
    rows, a task's parts) and must not find them swept. Used by the Spark driver around
    everything it does between minting a write and its commit, and by a commit that gathers
    the parts of tasks (each task renews its own write's lease only while it runs).
    """
    ids = sorted({w for w in write_ids if w})
    if check and ids:
        require_live(machine.state(), ids, location, machine.config.clock())
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(WriteLease(machine, w)) for w in ids]


def renew_due() -> int:
    """Renew, in the calling thread, every registered lease that is due now (what the keeper
    thread does when it wakes); how many it renewed. For tests that drive the clock by hand."""
    return _KEEPER.renew_due()


def renew(machine: Committer, write_id: str, lease_seconds: float) -> int:
    """Extend the lease of ``write_id`` to ``now + lease_seconds``; the new expiry (ms).
    `LeaseExpired` if it already ran out (a lease never comes back: gc may have swept)."""
    if not lease_seconds > 0:
        raise InvalidOption(f"lease_seconds must be positive, got {lease_seconds}")
    lease_ms = max(1, int(lease_seconds * 1000))
    state = machine.commit(RenewLease(write_id, lease_ms, id=machine.new_id()))
    return state.leases[write_id]


def fence(machine: Committer, through_ms: int) -> ShardState:
    """gc's fence: commit that every write whose lease ran out by ``through_ms`` is swept."""
    return machine.commit(SweepLeases(int(through_ms), id=machine.new_id()))


class WriteLease:
    """Keeps the lease of one write alive while a ``with`` block runs.

    The write's implicit lease already covers `DEFAULT_WRITE_LEASE_SECONDS` from its id's time;
    while the block runs, the process's lease keeper (one daemon thread for every lease of the
    process, started on first use) renews it (``lease_seconds`` from the renewal) once a third
    of the lease is left. Entering and leaving the block only registers and unregisters the
    lease: nothing is committed, and no thread is started or joined, for a write that ends
    early. Renewals use their own state machine (the caller's is not thread-safe). A renewal
    that fails is logged and tried again a little later, until the lease has run out; one
    refused with `LeaseExpired`, or still failing when the lease runs out, stops renewing (the
    lease is *lost*), and the write's commit will be refused too.
    """

    def __init__(
        self,
        machine: Committer,
        write_id: str,
        *,
        lease_seconds: float | None = None,
    ) -> None:
        self.write_id = write_id
        self.lease_seconds = DEFAULT_WRITE_LEASE_SECONDS if lease_seconds is None else lease_seconds
        self._source = machine
        self._machine: Committer | None = None
        #: The shard's clock (its configuration's): renewals are due by it.
        self.clock = machine.config.clock
        started = id_time_ms(write_id)
        self.expires_ms = (started if started is not None else self.clock()) + int(
            self.lease_seconds * 1000
        )
        self.renewals = 0
        self.lost = False
        self._retry_at_ms = 0
        self._lock = threading.Lock()  # one renewal at a time (keeper thread, `renew_due`)

    def renew(self) -> None:
        """Renew now (the keeper calls this; so may a write that wants to be sure)."""
        with self._lock:
            if self._machine is None:
                m: Any = self._source  # a StateMachine: a fresh one of its kind, for this thread
                self._machine = type(m)(m.location, m.blob, m.consensus, m.config)
            self.expires_ms = renew(self._machine, self.write_id, self.lease_seconds)
            self.renewals += 1

    def due_ms(self) -> int:
        """When the keeper renews it next (by `clock`): a third of the lease before it runs
        out."""
        return max(self.expires_ms - int(self.lease_seconds * 1000 / 3), self._retry_at_ms)

    def due_in_ms(self) -> int:
        """How long until the keeper renews it (negative: overdue), by its shard's clock."""
        return self.due_ms() - self.clock()

    def _renew_quietly(self) -> None:
        try:
            self.renew()
        except LeaseExpired as e:
            log.warning("write %s lost its lease: %s", self.write_id, e)
            self.lost = True
        except Exception as e:  # storage trouble: try again a little later, while it can help
            now = self.clock()
            if now >= self.expires_ms:
                # The lease ran out while the store failed: no renewal can bring it back (gc
                # may already sweep the write's parts, and its commit will be refused), so stop
                # rather than retry for the rest of the process.
                log.warning("write %s lost its lease while renewing failed: %s", self.write_id, e)
                self.lost = True
                return
            log.warning("write %s could not renew its lease: %s", self.write_id, e)
            self._retry_at_ms = now + max(50, int(self.lease_seconds * 1000 / 30))

    def __enter__(self) -> WriteLease:
        _KEEPER.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _KEEPER.remove(self)


def _monotonic_ms() -> int:
    """The keeper's own timer (its naps; a lease is due by its shard's clock)."""
    return time.monotonic_ns() // 1_000_000


class _Keeper:
    """The one thread per process that renews every registered `WriteLease` when it is due.

    It sleeps until the earliest due time (at most `MAX_NAP_SECONDS`, so a clock that jumps is
    noticed); registering a lease wakes it only when that lease is due before its planned
    wake-up, so a short write costs a set insertion and removal.
    """

    MAX_NAP_SECONDS = 60.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._leases: set[WriteLease] = set()
        self._thread: threading.Thread | None = None
        self._wake_ms: int | None = None

    def add(self, lease: WriteLease) -> None:
        with self._cond:
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="persistshard-lease-keeper", daemon=True
                )
                self._thread.start()
            elif self._wake_ms is None or lease.due_in_ms() < self._wake_ms - _monotonic_ms():
                self._cond.notify()

    def remove(self, lease: WriteLease) -> None:
        with self._cond:
            self._leases.discard(lease)

    def renew_due(self) -> int:
        with self._cond:
            due = [x for x in self._leases if not x.lost and x.due_in_ms() <= 0]
        for lease in due:
            lease._renew_quietly()
        return len(due)

    def _run(self) -> None:
        while True:
            with self._cond:
                waiting = {x: x.due_in_ms() for x in self._leases if not x.lost}
                due = [x for x, wait in waiting.items() if wait <= 0]
                if not due:
                    nap_ms = min(waiting.values(), default=1000 * self.MAX_NAP_SECONDS)
                    nap = min(self.MAX_NAP_SECONDS, max(0.01, nap_ms / 1000))
                    self._wake_ms = _monotonic_ms() + int(nap * 1000)
                    self._cond.wait(nap)
                    self._wake_ms = None
                    continue
            for lease in due:  # outside the lock: a renewal is a commit
                lease._renew_quietly()


_KEEPER = _Keeper()
