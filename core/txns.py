"""Transactions over many shards (after persist's txn-wal): a *txns shard* whose rows say which
data shards are registered with it and which writes were committed to them at which time.

The txns shard is an ordinary shard (its own location and log). Its rows (`TXNS_SCHEMA`):
``register`` (a data shard's identity and canonical location, the time it was registered at)
and ``write`` (a transaction's id, the data shard's identity and location, the batch it wrote
there, its time). A data shard that leaves is forgotten by retracting its ``register`` row; a
write that is applied is tidied by retracting its ``write`` row in a later commit, so the txns
shard's snapshot holds the registrations and the writes not known applied, and its history
is bounded (a retention of a few versions, and its compaction consolidates the pairs).

A transaction (`Txn`, ``with txns.begin() as tx``) plans at ``t``, the txns shard's upper:
1. *Parts*: each ``append`` writes its rows at ``t`` as parts of the data shard, under the
   data shard's write protocol (`persistshard.core.shard.write_transaction`: a write id and
   its lease).
2. *Pins*: each data shard commits ``stage_txn`` (`ShardState.txn_pins`): its gc keeps the
   parts from then on, applied or not; a pin needs the parts' lease live (after gc's fence,
   `LeaseExpired`).
3. *Commit*: one compare-and-append on the txns shard at ``[t, t + 1)`` with the ``write``
   rows, under the transaction's id: it lands all the writes at ``t`` at once and moves the
   logical upper of every registered shard to ``t + 1``. A lost race is `UpperMismatch`: the
   pins are released and the parts deleted, nothing applied. A lost response is resolved by
   reading the log back for the transaction's id (the state machine); if that cannot tell,
   `Indeterminate`, and the pins stay until gc finds them dangling.
4. *Apply*: each committed, unapplied write becomes ``apply_txn`` on its data shard, the
   batch at ``[the shard's upper, t + 1)`` (idempotent: a shard whose upper is above ``t``
   has it; anyone may apply, `TxnsShard.apply`; never refused for an expired lease).

What always holds:
- A data shard's writes are applied in the order of their times, each at most once, so its
  upper is above ``t`` exactly when the write at ``t`` is applied.
- A crash at any step loses nothing committed: before step 3 nothing is visible (the pins
  of a transaction that died are released by the data shard's gc once `PIN_PENDING_MS`
  passed; the transaction never commits later than half of that after its first pin); after
  it, anyone applies the write later, and reads see it meanwhile.
- Reads of a registered shard (`logical_state`) see the txns shard's upper and exactly the
  writes committed at or before their time: the txns shard's snapshot is read first, then
  the data shard's state, and the writes not applied in that state are added to it in memory
  (a reader that cannot write reads pending writes instead of applying them).
- A registered shard takes no other append (`InvalidOption` naming the txns shard).
- Registration goes data shard first (``register_txns``, then the ``register`` row), and
  forgetting the other way round (the row's retraction, the pending writes applied, then
  ``unregister_txns`` sealing the shard at the logical upper): no write is ever committed for
  a shard that takes plain appends.
Relies on: data shards share the txns shard's storage options and kind of log (next to the
data, or one database given by URL: `persistshard.core.shard.Shard.related`); the clocks of
committers and gc agree to well within `PIN_PENDING_MS` / 2. References are by identity (the
shard id, `persistshard.core.fork.identity`) with the location to find it; a location that
holds another shard is `CorruptData`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa

from persistshard.core.fork import identity
from persistshard.core.rows import DIFF, TIME, consolidate
from persistshard.core.shard import Shard, open_shard, read_state, write_transaction
from persistshard.core.statemachine.commits.apply_txn import ApplyTxn
from persistshard.core.statemachine.commits.register_txns import RegisterTxns
from persistshard.core.statemachine.commits.release_txn import ReleaseTxn
from persistshard.core.statemachine.commits.stage_txn import StageTxn
from persistshard.core.statemachine.commits.unregister_txns import UnregisterTxns
from persistshard.core.statemachine.machine import DETERMINATE_REFUSALS
from persistshard.core.statemachine.state import PIN_PENDING_MS, PartRef, ShardState
from persistshard.core.storage.layout import canonical_location
from persistshard.core.txnlog import (
    TXNS_SCHEMA,
    CommittedWrite,
    Registration,
    TxnsView,
    logical_state,
    read_view,
    related_by_id,
)
from persistshard.core.write.transaction import WriteTransaction, WrittenUpdates
from persistshard.core.write.validate import normalize_updates, user_schema
from persistshard.errors import (
    Indeterminate,
    InvalidOption,
    InvalidUpdates,
    PersistShardError,
    StateConflict,
    UpperMismatch,
)

log = logging.getLogger("persistshard.core.txns")

#: The history a txns shard keeps readable (data versions): readers use its newest snapshot.
TXNS_RETENTION_VERSIONS = 2
#: How many times `register`, `forget` and `apply` read again after losing a race.
ATTEMPTS = 16

__all__ = ["TXNS_SCHEMA", "Txn", "TxnsShard", "logical_state", "open_txns"]

# --- the txns shard ---------------------------------------------------------------------------


def _rows(rows: list[dict[str, Any]], diffs: list[int], at: int) -> pa.Table:
    table = pa.Table.from_pylist(rows, schema=TXNS_SCHEMA)
    table = table.append_column(DIFF, pa.array(diffs, pa.int64()))
    return table.append_column(TIME, pa.array(np.full(len(rows), at, dtype=np.int64)))


class TxnsShard:
    """A txns shard at ``shard.location`` (`open_txns`); see the module docstring."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.location = shard.location

    @property
    def upper(self) -> int:
        """The logical upper of every registered shard."""
        return self.shard._machine.state().upper

    def view(self) -> TxnsView:
        return read_view(self.shard)

    def identity(self) -> str:
        return identity(self.shard)

    def data(self, url: str) -> Shard:
        """A handle on the data shard at ``url`` (this shard's storage options and log kind)."""
        location = canonical_location(url)
        if location == self.location:
            raise InvalidOption(
                "a txns shard cannot register itself as a data shard", location=self.location
            )
        return self.shard._related(location, maintenance=self.shard.maintenance.enabled)

    def registered(self) -> dict[str, str]:
        """``{location: shard id}`` of the registered data shards."""
        return {r.location: r.shard_id for r in self.view().registered.values()}

    def _commit_rows(
        self,
        view: TxnsView,
        rows: list[dict[str, Any]],
        diffs: list[int],
        *,
        at: int | None = None,
        commit_id: str | None = None,
    ) -> ShardState:
        """One compare-and-append on the txns shard at ``[at, at + 1)`` (default: its upper)
        expecting ``view.upper``, with ``rows`` and the retractions of the writes ``view``
        holds that are applied (the tidy), under ``commit_id``."""
        at = view.upper if at is None else at
        tidy = self._applied(view)
        table = _rows([*rows, *(w.row() for w in tidy)], [*diffs, *(-1 for _ in tidy)], at)
        txn = write_transaction(self.shard)
        state = self.shard._machine.state() if view.version == 0 else None
        if state is not None and state.version == 0:
            txn.refuse_foreign_files()
        with txn:
            written = txn.write_updates(
                table,
                lower=view.upper,
                new_upper=at + 1,
                schema=TXNS_SCHEMA if view.version else None,
            )
            new = txn.commit(
                written,
                expected_upper=view.upper,
                new_upper=at + 1,
                schema=TXNS_SCHEMA,
                commit_id=commit_id,
            )
        if new.retention is None:  # the first commit: keep the txns shard's history short
            try:
                new = self.shard.set_retention(versions=TXNS_RETENTION_VERSIONS)
            except (PersistShardError, OSError) as e:  # the commit stands; the next sets it
                log.warning("%s: could not set the txns retention: %s", self.location, e)
        txn.maintain()
        return new

    def _applied(self, view: TxnsView) -> list[CommittedWrite]:
        """The writes of ``view`` their data shards have applied (upper above their time)."""
        uppers: dict[str, int] = {}
        out = []
        for w in view.writes:
            if w.shard_id not in uppers:
                data = self.shard._related(w.location)
                uppers[w.shard_id] = data._machine.state().upper
            if uppers[w.shard_id] > w.at:
                out.append(w)
        return out

    # --- registration ----------------------------------------------------------------------

    def register(self, *urls: str) -> int:
        """Register the shards at ``urls`` (each at a time no earlier than its own upper: the
        txns shard moves up to it); idempotent. Returns the txns shard's upper after."""
        txns_id = self.identity()
        for url in urls:
            data = self.data(url)
            shard_id = identity(data)
            for attempt in range(ATTEMPTS):
                view = self.view()
                state = data._machine.state()
                known = view.registered.get(shard_id)
                if state.txns is not None and state.txns.shard_id != txns_id:
                    raise InvalidOption(
                        f"the shard is registered with the txns shard at "
                        f"{state.txns.location}; forget it there first",
                        location=data.location,
                    )
                at = known.at if known is not None else max(view.upper, state.upper)
                try:
                    if state.txns is None:  # the data shard first: it takes no plain append
                        data._machine.commit(
                            RegisterTxns(txns_id, self.location, at, id=data._machine.new_id())
                        )
                    if known is None:
                        reg = Registration(shard_id, data.location, at)
                        self._commit_rows(view, [reg.row()], [1], at=at)
                        log.info("%s: registered %s at %d", self.location, data.location, at)
                    break
                except UpperMismatch:
                    if attempt == ATTEMPTS - 1:
                        raise
        return self.upper

    def forget(self, url: str) -> int:
        """Apply what is pending for the shard at ``url``, retract its registration and seal it
        at the logical upper: a plain shard again (idempotent). Returns the upper it was
        sealed at."""
        data = self.data(url)
        shard_id = identity(data)
        txns_id = self.identity()
        for attempt in range(ATTEMPTS):
            self.apply()
            view = self.view()
            known = view.registered.get(shard_id)
            if known is None:
                break
            try:
                self._commit_rows(view, [known.row()], [-1])
                break
            except UpperMismatch:
                if attempt == ATTEMPTS - 1:
                    raise
        self.apply()  # writes committed before the retraction landed
        upper = self.upper
        state = data._machine.state()
        if state.txns is not None and state.txns.shard_id == txns_id:
            state = data._machine.commit(
                UnregisterTxns(txns_id, max(upper, state.upper), id=data._machine.new_id())
            )
            log.info("%s: forgot %s, sealed at %d", self.location, data.location, state.upper)
        return state.upper

    # --- transactions ------------------------------------------------------------------------

    def begin(self) -> Txn:
        """A new transaction at the txns shard's upper (commit on leaving a ``with`` block
        without an exception, or `Txn.commit`)."""
        return Txn(self)

    def apply(self) -> int:
        """Apply every committed write not applied yet to its data shard (idempotent; anyone
        may call it). Returns how many writes this call applied."""
        view = self.view()
        applied = 0
        handles: dict[str, Shard] = {}
        for w in view.writes:
            data = handles.get(w.shard_id)
            if data is None:
                data = cast(Shard, related_by_id(self.shard, w.location, w.shard_id, "data shard"))
                handles[w.shard_id] = data
            applied += apply_write(data, w)
        return applied


def apply_write(data: Shard, w: CommittedWrite) -> int:
    """Apply the committed write ``w`` to ``data`` unless it is (1 when this call did)."""
    for _ in range(ATTEMPTS):
        state = data._machine.state()
        if state.upper > w.at:
            return 0
        commit = ApplyTxn(
            state.upper,
            w.at + 1,
            w.batch(state.upper),
            schema=w.schema,
            txn=w.txn,
            id=data._machine.new_id(),
        )
        try:
            data._machine.commit(commit, base=state)
        except UpperMismatch:
            continue
        log.info("%s: applied transaction %s at %d", data.location, w.txn, w.at)
        return 1
    raise UpperMismatch(w.at, data._machine.state().upper, location=data.location)


@dataclass
class Writing:
    """What a transaction writes to one data shard (`Txn.writer`)."""

    shard: Shard
    shard_id: str
    txn: WriteTransaction
    schema: pa.Schema | None
    parts: list[PartRef] = field(default_factory=list)
    pinned: bool = False


class Txn:
    """One transaction over the data shards of ``txns`` (module docstring). ``committed_at``:
    the time its writes landed at, once committed."""

    def __init__(self, txns: TxnsShard) -> None:
        self.txns = txns
        self._view = txns.view()
        #: The time the transaction writes at (the txns shard's upper when it began).
        self.at = self._view.upper
        self.id = txns.shard._machine.new_write_id()
        self.committed_at: int | None = None
        self._writes: dict[str, Writing] = {}
        self._leases = contextlib.ExitStack()
        self._done = False

    def __enter__(self) -> Txn:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    @property
    def done(self) -> bool:
        """Whether the transaction is over (committed, aborted, or its outcome unknown)."""
        return self._done

    def writer_of(self, location: str) -> Writing | None:
        """What this transaction writes to the shard at canonical ``location``, if anything."""
        for write in self._writes.values():
            if write.shard.location == location:
                return write
        return None

    def writer(self, url: str) -> Writing:
        """What this transaction writes to the registered shard at ``url``: its handle, the
        write transaction whose lease is kept until the commit (or abort) and the parts so
        far. `InvalidOption` when the shard is not registered (nothing written)."""
        if self._done:
            raise InvalidOption(f"transaction {self.id} is over", location=self.txns.location)
        data = self.txns.data(url)
        shard_id = identity(data)
        if shard_id not in self._view.registered:
            raise InvalidOption(
                f"the shard at {data.location} is not registered with the txns shard at "
                f"{self.txns.location} (txns.register it first); nothing was written",
                location=data.location,
            )
        write = self._writes.get(shard_id)
        if write is None:
            state = read_state(data)  # the schema of committed writes too, applied or not
            txn = write_transaction(data)
            self._leases.enter_context(txn)
            write = Writing(data, shard_id, txn, state.schema)
            self._writes[shard_id] = write
        return write

    def append(self, url: str, table: pa.Table) -> None:
        """Write ``table`` (rows with an optional ``_diff``, as a plain `Shard.append`) to the
        registered shard at ``url`` as part of this transaction, at its time."""
        write = self.writer(url)
        location = write.shard.location
        if TIME in table.column_names:
            raise InvalidUpdates(
                f"a transaction writes at its own time; the table has a {TIME} column",
                location=location,
            )
        n = table.num_rows
        if DIFF not in table.column_names:
            table = table.append_column(DIFF, pa.array(np.ones(n, dtype=np.int64)))
        table = table.append_column(TIME, pa.array(np.full(n, self.at, dtype=np.int64)))
        updates = normalize_updates(table, lower=self.at, schema=write.schema, location=location)
        if write.schema is None:
            write.schema = user_schema(updates.schema)
        if updates.num_rows:
            write.parts.extend(write.txn.write_parts(consolidate(updates)))

    def add_parts(self, url: str, parts: list[PartRef], schema: pa.Schema) -> None:
        """Add parts written elsewhere (Spark tasks, under ``writer(url).txn.write_id``) to
        this transaction's write to ``url``: each is checked first (present with its recorded
        size, every time at the transaction's; else `CorruptData` or `InvalidUpdates`, nothing
        added). ``schema``: their user columns (the shard's, or the first write's)."""
        write = self.writer(url)
        write.txn.check_parts([(parts, self.at, self.at + 1)])
        if write.schema is None:
            write.schema = schema
        write.parts.extend(parts)

    def abort(self) -> None:
        """Give the transaction up: release its pins and delete its parts (nothing applied)."""
        self._done = True
        try:
            for write in self._writes.values():
                if write.pinned:
                    write.shard._machine.commit(
                        ReleaseTxn(self.id, id=write.shard._machine.new_id())
                    )
                write.txn.delete(WrittenUpdates(sealed=write.parts).stored_keys())
        finally:
            self._leases.close()

    def commit(self) -> int:
        """Pin the parts, commit on the txns shard at `at` and apply; returns the time.
        `UpperMismatch` when another commit moved the txns shard first (nothing applied)."""
        if self._done:
            raise InvalidOption(f"transaction {self.id} is over", location=self.txns.location)
        txns = self.txns.shard
        try:
            started = time.monotonic()
            for write in self._writes.values():
                keys = tuple(p.key for p in write.parts if p.inline is None)
                write.shard._machine.commit(
                    StageTxn(self.id, keys, id=write.shard._machine.new_id())
                )
                write.pinned = True
            if time.monotonic() - started > PIN_PENDING_MS / 2000:
                raise StateConflict(
                    f"transaction {self.id}'s pins took longer than half their pending time; "
                    "run it again",
                    location=self.txns.location,
                )
            rows = [
                CommittedWrite(
                    self.id, w.shard_id, w.shard.location, self.at, tuple(w.parts), w.schema
                ).row()
                for w in self._writes.values()
                if w.schema is not None
            ]
            before = txns._machine.known().version
            try:
                self.txns._commit_rows(self._view, rows, [1] * len(rows), commit_id=self.id)
            except (Indeterminate, OSError):
                # Resolve by the transaction's id: read the log back for it.
                if txns._machine.find_commit(self.id, before) is None:
                    raise
        except (*DETERMINATE_REFUSALS,):
            self.abort()
            raise
        except BaseException:
            # Unknown outcome or a crash: the pins stay (gc releases them if it never landed).
            self._done = True
            self._leases.close()
            raise
        self._done = True
        self.committed_at = self.at
        log.info("%s: transaction %s committed at %d", self.txns.location, self.id, self.at)
        try:
            # Every committed write not applied yet, in time order, not only this one's: a
            # write of an earlier transaction whose apply failed (or whose committer died)
            # goes first. Applying this batch alone would move the data shard's upper past
            # that write, which then counts as applied and is lost.
            self.txns.apply()
            for write in self._writes.values():
                write.txn.maintain()  # the data shard's bounded compaction and gc
        except (PersistShardError, OSError) as e:  # committed: anyone applies it later
            log.warning("%s: transaction %s not applied yet: %s", self.txns.location, self.id, e)
        finally:
            self._leases.close()
        return self.at


def open_txns(
    location: str,
    *,
    consensus: str | None = None,
    storage_options: dict[str, Any] | None = None,
    **knobs: Any,
) -> TxnsShard:
    """The txns shard at ``location`` (created by its first registration). ``consensus``: a
    database URL for its log and its data shards' (default: next to the data);
    ``storage_options``: the store's (fsspec's), used for the data shards too; ``knobs``: the
    configuration (`persistshard.core.config.ShardConfig`) of every handle it opens."""
    shard = open_shard(location, consensus=consensus, **knobs, **(storage_options or {}))
    return TxnsShard(shard)
