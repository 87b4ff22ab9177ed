"""Shard: a durable collection of (row, time, diff) updates with two frontiers.

What always holds (for every state version a reader can see):
- Everything at a time ``< upper`` is final: no later commit adds or removes updates there.
  Every append starts exactly at the current upper (compare-and-append).
- Reads at ``as_of`` in ``[since, upper)`` are exact: the snapshot is the sum of diffs of
  every update at a time ``<= as_of``. Updates at times ``< since`` may have been forwarded
  to ``since``; reads forward them too, so answers do not depend on whether physical
  compaction has happened.
- Updates at times ``>= upper`` (unsealed) are durable but invisible until upper passes them.
- A failed write changes nothing: parts are written before the commit under fresh keys, the
  commit is one compare-and-set, and a refused commit deletes the parts it wrote.
- An append whose encoded updates are small (at most ``inline_bytes``) carries them in its
  commit instead of a part file (`persistshard.core.storage.parts`), while the state's inline
  bytes stay within ``inline_cap``; reads, scans, listen and compaction read them like parts.
- A write holds a lease (`persistshard.core.statemachine.leases`) from its first part to its commit:
  gc never deletes its parts meanwhile, and a commit after the lease ran out is `LeaseExpired`.

`Shard` is the user-facing facade: its public surface is what README.md documents (pinned by
tests/test_architecture.py): the frontiers, the writes, the reads, holds and consumers, forks,
and two groups, ``shard.maintenance`` (`Maintenance`: compaction, gc, the operator's tools
that release since, the after-commit maintenance ``auto``) and ``shard.inspect`` (`Inspect`:
state, history, verify, describe, readers, consumers, retention). The flat ``compact``,
``gc``, ``verify``, ``history``, ``readers`` and ``consumers`` are one-line aliases of the
groups, kept because the user contract names them on the shard. It validates
input and hands every data write to the write protocol
(`persistshard.core.write.transaction.WriteTransaction`, made by `write_transaction`: lease,
parts, one compare-and-append, sweep), and every state change to its
`persistshard.core.statemachine.machine.StateMachine`, which owns the commit loop
(compare-and-set, retries of the same commit, rollups) and the refresh of the state. The
handle's state machine and blob store (``_machine``, ``_blob``) are private to the package:
Spark paths reach them only through `write_transaction` and the read helpers below
(`plan_read_tasks`, `iter_read_task`, `run_read_task`). A wrapped blob store (faults, request
counting) is handed over as ``Shard(location, blob=...)``. Compaction
(`persistshard.core.maintenance.compact`) and gc (`persistshard.core.maintenance.gc`) work on
the machine too; `Maintenance.compact` and `Maintenance.gc` only call them. After each of its
own commits (appends, upserts, seals) a shard opened with ``maintenance=True`` (the default)
runs the bounded after-commit maintenance of `persistshard.core.maintenance.auto`; it never
fails the commit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import KNOBS, ShardConfig
from persistshard.core.maintenance.auto import AutoMaintenance, MaintenanceReport
from persistshard.core.maintenance.compact import CompactionReport, compact_shard
from persistshard.core.maintenance.compact import maybe_compact as maybe_compact_shard
from persistshard.core.maintenance.gc import GcReport, collect
from persistshard.core.read.filters import Pred
from persistshard.core.read.listen import Listen
from persistshard.core.read.plan import (
    DirectSlice,
    Query,
    ReadTask,
    check_as_of,
    check_updates_range,
    direct_slices,
    iter_task,
    plan_read,
    read_query,
    read_task,
    read_times,
    snapshot_query,
    updates_query,
)
from persistshard.core.read.race import pinned_read
from persistshard.core.read.scan import Scan
from persistshard.core.rows import DIFF, TIME
from persistshard.core.statemachine.commits.advance_since import AdvanceSince
from persistshard.core.statemachine.commits.expire_reader import ExpireReader
from persistshard.core.statemachine.commits.set_retention import SetRetention
from persistshard.core.statemachine.consumers import Consumer, check_name
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.statemachine.holds import DEFAULT_LEASE_SECONDS, ReaderHold
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.retention import Retention
from persistshard.core.statemachine.state import (
    MAX_INLINE_PART_BYTES,
    ShardState,
)
from persistshard.core.storage import layout, metrics
from persistshard.core.storage.blob import Blob, open_blob
from persistshard.core.storage.consensus import (
    BlobConsensus,
    Consensus,
    DatabaseLog,
    underlying,
)
from persistshard.core.storage.layout import DEFAULT_RETENTION_SECONDS, new_id
from persistshard.core.storage.sqlconsensus import open_consensus, redact_url
from persistshard.core.write.transaction import (
    CommitOptions,
    WriteTransaction,
    WrittenUpdates,
    split_at,
)
from persistshard.core.write.validate import update_schema, user_schema
from persistshard.errors import (
    CorruptData,
    InvalidOption,
    NoShard,
    PersistShardError,
    UpperMismatch,
    VersionCollected,
)

log = logging.getLogger("persistshard.core.shard")

__all__ = [
    "Shard",
    "ShardAddress",
    "VerifyReport",
    "WrittenUpdates",
    "advance_consumer",
    "new_id",
    "open_shard",
    "read_state",
    "split_at",
    "write_transaction",
]


@dataclass(frozen=True)
class ShardAddress:
    """What opens a shard again in another place (a Spark task, a CLI subcommand): its
    location, the blob store's options (may hold credentials: ``repr`` hides them), its
    consensus URL (None: the log next to the data) and its configuration. Picklable when the
    configuration's clock is (the default is)."""

    location: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    consensus: str | None = None
    config: ShardConfig = field(default_factory=ShardConfig)

    def __repr__(self) -> str:
        """The storage options' names only, the consensus URL without its password."""
        consensus = redact_url(self.consensus) if self.consensus else None
        names = ", ".join(sorted(self.storage_options))
        return (
            f"ShardAddress({self.location!r}, storage_options=[{names}], "
            f"consensus={consensus!r}, config={self.config!r})"
        )

    def open(self, *, maintenance: bool = True, blob: Blob | None = None) -> Shard:
        """The shard at this address (``blob``: a store to use instead of the default)."""
        return Shard(
            self.location,
            consensus=self.consensus,
            blob=blob,
            config=self.config,
            maintenance=maintenance,
            **self.storage_options,
        )


@dataclass(frozen=True)
class VerifyReport:
    """What `Inspect.verify` checked and found; ``ok`` when ``problems`` is empty."""

    version: int
    parts_checked: int
    bytes_checked: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


class Shard:
    """A shard at ``location`` (any fsspec URL or local path). See the module docstring."""

    def __init__(
        self,
        location: str,
        *,
        consensus: Consensus | str | None = None,
        blob: Blob | None = None,
        config: ShardConfig | None = None,
        maintenance: bool = True,
        **options: Any,
    ) -> None:
        """``options``: the knobs of `persistshard.core.config.ShardConfig` by name (e.g.
        ``inline_bytes=0``, ``clock=...``), applied over ``config`` (default: the defaults,
        and the environment `ShardConfig.from_options` reads); every other key is a storage
        option of the blob store (fsspec's). ``blob``: the blob store to use instead of
        `open_blob`'s (a wrapped store, e.g. a fault-injecting one: conformance)."""
        #: The canonical location (`persistshard.core.storage.layout.canonical_location`):
        #: every spelling of one place gives one string, the shard's name in logs, caches and
        #: the keys of database logs written before shard ids.
        self.location = layout.canonical_location(location)
        knobs = {k: v for k, v in options.items() if k.lower() in KNOBS or k == "clock"}
        #: This handle's tunables and clock (`persistshard.core.config`).
        self.config = ShardConfig.from_options(
            knobs, base=config, env=config is None, location=self.location
        )
        # The blob store's options (fsspec's) and the consensus URL when the consensus was
        # given as one: what reopens the shard elsewhere (`address`).
        self._storage_options = {k: v for k, v in options.items() if k not in knobs}
        self._consensus_url = consensus if isinstance(consensus, str) else None
        #: Compaction, gc and the operator's tools (`Maintenance`); ``maintenance.auto`` is
        #: the bounded compaction and gc after this handle's commits (off: ``enabled=False``).
        self.maintenance = Maintenance(self, AutoMaintenance(enabled=maintenance))
        #: Read-only looks at the shard's state, log and storage (`Inspect`).
        self.inspect = Inspect(self)
        blob = blob if blob is not None else open_blob(self.location, **self._storage_options)
        blob = metrics.counting_blob(blob)  # store requests counted per operation
        if isinstance(consensus, str):
            # Keyed by the shard id recorded next to the data (read on first use), so every
            # spelling of the location finds one log, and another database is refused.
            consensus = open_consensus(consensus, self.location, blob)
        elif consensus is not None and isinstance(underlying(consensus), DatabaseLog):
            attached = underlying(consensus)
            assert isinstance(attached, DatabaseLog)
            attached.attach(blob)
        consensus = consensus if consensus is not None else BlobConsensus(blob)
        counts = not (isinstance(consensus, BlobConsensus) and consensus.blob is blob)
        self._machine = StateMachine(
            self.location,
            blob,
            metrics.count_consensus(consensus, requests=counts),
            self.config,
        )

    @property
    def _inline_bytes(self) -> int:
        """An append's part of at most this many bytes is committed inline (0: never)."""
        return min(self.config.inline_bytes, MAX_INLINE_PART_BYTES)

    @property
    def address(self) -> ShardAddress:
        """What opens this shard again elsewhere (a Spark task, another process): its
        location, storage options, consensus URL and configuration."""
        return ShardAddress(self.location, self._storage_options, self._consensus_url, self.config)

    @property
    def _blob(self) -> Blob:
        return self._machine.blob

    @property
    def _consensus(self) -> Consensus:
        return self._machine.consensus

    # --- frontiers and columns ------------------------------------------------------------

    @property
    def upper(self) -> int:
        """The upper reads see: for a shard registered with a txns shard, its logical upper
        (the txns shard's: `persistshard.core.txns`)."""
        return self._read_state().upper

    def _read_state(self) -> ShardState:
        """The newest state as reads see it: for a shard registered with a txns shard, with
        the committed writes not applied yet and the logical upper
        (`persistshard.core.txns.logical_state`); else the newest state."""
        state = self._machine.state()
        if state.txns is None:
            return state
        from persistshard.core import txnlog

        return txnlog.logical_state(self)

    @property
    def since(self) -> int:
        return self._machine.state().since

    @property
    def schema(self) -> pa.Schema | None:
        """The user columns (without ``_time``/``_diff``), or None before the first write
        (for a registered shard, a committed write counts, applied or not)."""
        return self._read_state().schema

    def _require_shard(self, state: ShardState | None = None) -> ShardState:
        """``state`` (default: the newest, unless this handle already knows a committed one),
        or `NoShard` when nothing was ever committed at this location.

        Every read, inspection and maintenance call but ``upper``/``since``/``schema``/``state``
        starts here: a mistyped location must not read as an empty table (API.md, `NoShard`).
        A shard is created only by a data write (its first commit), so once this handle
        knows a version above 0 no request is needed (a shard dropped since by another
        handle is found at the next state read). A dropped shard (`drop`) is `NoShard` too."""
        if state is None:
            state = self._machine.known()
            if state.version == 0:
                state = self._machine.state()
        if state.version == 0:
            raise NoShard(
                f"no shard at {self.location}: no state was ever committed there (a mistyped "
                "location, or the wrong storage options or consensus?); a data write creates "
                "a shard, reads and maintenance never do"
            )
        if state.dropped:
            raise NoShard(
                f"no shard at {self.location}: it was dropped (persistshard drop); what is "
                "left there is kept for its forks until they release it"
            )
        return state

    # --- writes -------------------------------------------------------------------------

    @metrics.operation_method("append")
    def commit_checked(
        self,
        written: WrittenUpdates,
        *,
        expected_upper: int,
        new_upper: int,
        schema: pa.Schema | None,
        **options: Unpack[CommitOptions],
    ) -> ShardState:
        """Commit parts that came from elsewhere (written by other processes or built by the
        caller) with one compare-and-append: each part is checked first (present with its
        recorded size, its times inside its batch; one listing per write directory), so a
        commit naming a missing part, a part of another size than recorded, or a part whose
        times lie outside its batch is refused (`CorruptData`, `InvalidUpdates`) with nothing
        applied and nothing deleted. ``options``: ``commit_id``, ``writer``, ``rebase``,
        ``label``, ``retention`` (`persistshard.core.write.transaction.CommitOptions`). A
        refused commit deletes the parts; see
        `persistshard.core.write.transaction.WriteTransaction.commit`."""
        return write_transaction(self).commit(
            written,
            expected_upper=expected_upper,
            new_upper=new_upper,
            schema=schema,
            check=True,
            **options,
        )

    @metrics.operation_method("append")
    def compare_and_append(
        self,
        updates: pa.Table | None,
        expected_upper: int,
        new_upper: int,
        *,
        writer: tuple[str, int] | None = None,
    ) -> ShardState:
        """Append ``updates`` iff the shard's upper is ``expected_upper``; move it to ``new_upper``.

        Updates must have times ``>= expected_upper``; those ``>= new_upper`` are unsealed.
        Raises `UpperMismatch` (nothing written) if the upper moved, `InvalidUpdates` for bad
        updates and `InvalidOption` for a ``new_upper`` below ``expected_upper`` (nothing
        written). Then the after-commit maintenance (`maintain`).
        """
        since = self._machine.known().since
        out = self._compare_and_append(updates, expected_upper, new_upper, writer=writer)
        self._maintain(since)
        return out

    def _compare_and_append(
        self,
        updates: pa.Table | None,
        expected_upper: int,
        new_upper: int,
        *,
        writer: tuple[str, int] | None = None,
    ) -> ShardState:
        if new_upper < expected_upper:
            raise InvalidOption(
                f"new upper {new_upper} is below the expected upper {expected_upper}",
                location=self.location,
            )
        current = self._machine.known()
        if current.version == 0 or current.upper != expected_upper:
            current = self._machine.state()  # the known state may be behind: read the newest
        if current.upper != expected_upper:
            raise UpperMismatch(expected_upper, current.upper, location=self.location)
        txn = write_transaction(self)
        if current.version == 0:
            txn.refuse_foreign_files()
        written = WrittenUpdates()
        schema = current.schema
        with txn:  # the lease is renewed if the write outlives it
            if updates is not None:
                incoming = user_schema(updates.schema) if schema is None else None
                written = txn.write_updates(
                    updates, lower=expected_upper, new_upper=new_upper, schema=schema
                )
                schema = schema or incoming
            return txn.commit(
                written,
                expected_upper=expected_upper,
                new_upper=new_upper,
                schema=schema,
                writer=writer,
            )

    @metrics.operation_method("append")
    def append(self, updates: pa.Table, new_upper: int | None = None) -> ShardState:
        """Append at the current upper; ``new_upper`` defaults to one past the largest time
        (or current upper + 1 when the updates are empty).

        *Plain* updates (no ``_time`` column, ``_diff`` optional and ``+1`` by default, no
        ``new_upper``) are rows written at whatever the upper is when the commit lands: the
        append never fails with `UpperMismatch`; after a lost race its parts are committed at
        the newer upper without being rewritten.
        """
        plain = TIME not in updates.column_names and new_upper is None
        # A plain append lands at whatever the upper is at its commit, so it plans on the
        # state this shard last read or committed (no read: the compare-and-set tells whether
        # it is still the newest, and the commit is re-applied to the newest if not).
        current = self._machine.known() if plain else self._machine.state()
        if current.version == 0:
            current = self._machine.state()
        expected = current.upper
        since = current.since
        if plain:
            n = updates.num_rows
            if DIFF not in updates.column_names:
                updates = updates.append_column(DIFF, pa.array(np.ones(n, dtype=np.int64)))
            updates = updates.append_column(TIME, pa.array(np.full(n, expected, dtype=np.int64)))
            schema = current.schema
            incoming = user_schema(updates.schema) if schema is None else schema
            with write_transaction(self) as txn:
                written = txn.write_updates(
                    updates, lower=expected, new_upper=expected + 1, schema=schema
                )
                out = txn.commit(
                    written,
                    expected_upper=expected,
                    new_upper=expected + 1,
                    schema=incoming,
                    commit_id=txn.write_id,
                    rebase=True,
                )
            self._maintain(since)
            return out
        if new_upper is None:
            times = updates.column(TIME) if TIME in updates.column_names else None
            biggest = pc.max(times).as_py() if times is not None and len(times) else None
            new_upper = max(expected, biggest) + 1 if biggest is not None else expected + 1
        out = self._compare_and_append(updates, expected, new_upper)
        self._maintain(since)
        return out

    @metrics.operation_method("upsert")
    def upsert(
        self,
        rows: pa.Table,
        key_columns: str | list[str] | tuple[str, ...],
        *,
        delete_column: str | None = None,
        retries: int = 3,
        stats: Any = None,
    ) -> ShardState:
        """Upsert ``rows`` by ``key_columns`` at one new time: each row replaces the current
        row with its key; ``_diff = -1`` or a true ``delete_column`` deletes the key. A commit
        by someone else between the read and the commit makes it recompute (up to
        ``retries`` times). See `persistshard.core.upsert`."""
        from persistshard.core import upsert as up

        table = up.upsert_input(rows, delete_column=delete_column, location=self.location)
        for attempt in range(retries + 1):
            state = self._machine.state()
            txn = write_transaction(self)
            if state.version == 0:
                txn.refuse_foreign_files()
            incoming, keys, schema = up.prepare(table, key_columns, state, self.location)
            try:
                with txn:
                    # The current rows are read at ``state``: a compaction and gc (retention
                    # 0) may collect its parts meanwhile, a lost race like UpperMismatch.
                    with pinned_read(state.version, self._machine.state, self.location):
                        parts = txn.upsert_delta(state, incoming, keys, schema, stats=stats)
                    out = txn.commit(
                        WrittenUpdates(sealed=parts),
                        expected_upper=state.upper,
                        new_upper=state.upper + 1,
                        schema=up.with_key_columns(schema, keys),
                        commit_id=txn.write_id,
                        label="upsert",
                    )
                self._maintain(state.since)
                return out
            except (UpperMismatch, VersionCollected):
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")

    @metrics.operation_method("seal")
    def seal(self, new_upper: int) -> ShardState:
        """Move upper to ``new_upper`` without new updates (unsealed ones below it appear)."""
        current = self._machine.state()
        if new_upper < current.upper:
            raise InvalidOption(
                f"cannot seal at {new_upper}: the upper is already {current.upper} and only "
                "moves forward",
                location=self.location,
            )
        if new_upper == current.upper:
            return current
        return self.compare_and_append(None, current.upper, new_upper)

    @metrics.operation_method("advance_since")
    def advance_since(self, since: int) -> int:
        """Allow compaction of history before ``since``, as far as live reader holds allow:
        since moves to ``min(since, every live hold)`` (never back); returns the since reached."""
        current = self._machine.state()
        if since <= current.since:
            return current.since
        return self._machine.commit(AdvanceSince(since, id=self._machine.new_id())).since

    def set_retention(
        self, seconds: float | None = None, versions: int | None = None
    ) -> ShardState:
        """Keep this much history readable (both None: clear the retention): a window of
        ``seconds`` and/or the ``versions`` newest data versions (commits that moved the upper).
        Stored in the shard's state; from then on since follows the upper minus the retention
        on every commit that moves the upper (and at once), never past a live reader hold and
        never to the upper. See `persistshard.core.statemachine.retention`."""
        retention = retention_of(seconds, versions, self.location)
        return self._machine.commit(SetRetention(retention, id=self._machine.new_id()))

    def _maintain(self, since_before: int, *, compact: bool = True) -> MaintenanceReport | None:
        """The bounded after-commit maintenance (`persistshard.core.maintenance.auto`) of a
        commit that found since at ``since_before``: due Spine merges (unless ``compact`` is
        false), then gc if since moved. None when this handle was opened with
        ``maintenance=False``. Never raises for a maintenance failure (it is logged)."""
        return self.maintenance.auto.after_commit(self._machine, since_before, compact=compact)

    # --- reader holds (core/statemachine/holds.py) and listen
    # -----------------------------------------

    def register_reader(
        self, reader_id: str, *, lease_seconds: float = DEFAULT_LEASE_SECONDS
    ) -> ReaderHold:
        """Hold the current since for ``reader_id`` (unique among live holds) with a lease."""
        return ReaderHold.register(self._machine, reader_id, lease_seconds)

    def reader(self, reader_id: str) -> ReaderHold:
        """The handle of ``reader_id``'s live hold (renews it); `HoldExpired` if it has none."""
        return ReaderHold.attach(self._machine, reader_id)

    def readers(self) -> dict[str, tuple[int, int]]:
        """`Inspect.readers` (API.md names it on the shard)."""
        return self.inspect.readers()

    # --- durable consumers (core/statemachine/consumers.py) -------------------------------

    def consumer(self, name: str) -> Consumer:
        """Durable consumer ``name``: the existing one, or a new one at the current since (a
        commit). It holds since back with no lease until it advances or is dropped."""
        self._require_shard()
        return Consumer.open(self._machine, name, self.updates)

    def consumers(self) -> dict[str, int]:
        """`Inspect.consumers` (API.md names it on the shard)."""
        return self.inspect.consumers()

    def listen(
        self,
        as_of: int,
        *,
        timeout: float | None = None,
        reader_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Listen:
        """Iterate ``(updates, frontier)`` from ``as_of`` on, holding since while open; see
        `persistshard.core.read.listen.Listen`."""
        self._require_shard()
        return Listen(
            self, as_of, timeout=timeout, reader_id=reader_id, lease_seconds=lease_seconds
        )

    # --- reads --------------------------------------------------------------------------

    def _read_range(
        self, state: ShardState, *, min_time: int | None, max_time: int | None
    ) -> pa.Table:
        """Every stored update of ``state`` with time in ``[min_time, max_time]`` (inclusive
        bounds, optional), unconsolidated, times not forwarded (`core.read.read_times`)."""
        return read_times(self._blob, state, min_time=min_time, max_time=max_time)

    def snapshot(self, as_of: int | None = None) -> pa.Table:
        """Rows + ``_diff`` at ``as_of`` (default upper - 1): one row per distinct row, diffs
        summed over all times ``<= as_of``, zero sums dropped, sorted by row."""
        state = self._require_shard(self._read_state())
        if state.schema is None:
            if as_of is not None:
                check_as_of(state, as_of, self.location)
            return pa.schema([pa.field(DIFF, pa.int64(), False)]).empty_table()
        if as_of is None:
            if state.upper == 0:
                return _snapshot_schema(state.schema).empty_table()
            as_of = state.upper - 1
        with pinned_read(state.version, self._machine.state, self.location):  # VersionCollected
            return read_query(self._blob, state, snapshot_query(state, as_of, self.location))

    def updates(self, from_time: int, to_time: int) -> pa.Table:
        """Rows + ``_time`` + ``_diff`` for every update whose time, forwarded to since, is in
        ``[from_time, to_time)``; consolidated and sorted by (row, time).

        Exact only when ``from_time`` is 0 or later than since (otherwise updates from before
        ``from_time`` may have been forwarded into the range): else `SinceViolation`.
        """
        state = self._require_shard(self._read_state())
        check_updates_range(state, from_time, to_time, self.location)
        if state.schema is None:
            return pa.schema(
                [pa.field(TIME, pa.int64(), False), pa.field(DIFF, pa.int64(), False)]
            ).empty_table()
        if from_time == to_time:
            return update_schema(state.schema).empty_table()
        q = updates_query(state, from_time, to_time, self.location)
        with pinned_read(state.version, self._machine.state, self.location):  # VersionCollected
            return read_query(self._blob, state, q)

    def scan(
        self,
        as_of: int | None = None,
        columns: Sequence[str] | None = None,
        filter: Pred | pc.Expression | None = None,
        with_diff: bool = False,
    ) -> Scan:
        """A lazy, streamed snapshot at ``as_of`` (default upper - 1) of the newest state,
        pinned now: only ``columns`` (default all), only rows passing ``filter`` (a pyarrow
        compute expression or a `Pred`), each row repeated by its count unless ``with_diff``
        (then rows + ``_diff``). Checks the time now (`SinceViolation`, `NotSealed`); reads
        nothing until consumed. See `persistshard.core.read.scan`."""
        state = self._require_shard(self._read_state())
        if as_of is not None or (state.upper > 0 and state.schema is not None):
            at = state.upper - 1 if as_of is None else as_of
            query = snapshot_query(state, at, self.location, with_diff=with_diff)
        else:  # nothing written or sealed yet: an empty answer
            query = Query("snapshot", as_of=-1, since=state.since, with_diff=with_diff)
        return Scan(
            self._blob,
            self.location,
            state,
            query,
            columns=columns,
            filter=filter,
            config=self.config,
            newest=self._machine.state,
        )

    def scan_updates(
        self,
        from_time: int,
        to_time: int,
        columns: Sequence[str] | None = None,
        filter: Pred | pc.Expression | None = None,
    ) -> Scan:
        """A lazy, streamed change read: the `updates` in ``[from_time, to_time)`` (rows +
        ``_time`` + ``_diff``), only ``columns`` and rows passing ``filter`` (which may also
        read ``_time`` and ``_diff``). Checks the range now; reads nothing until consumed."""
        state = self._require_shard(self._read_state())
        check_updates_range(state, from_time, to_time, self.location)
        q = updates_query(state, from_time, to_time, self.location)
        return Scan(
            self._blob,
            self.location,
            state,
            q,
            columns=columns,
            filter=filter,
            config=self.config,
            newest=self._machine.state,
        )

    # --- forks and drop (core/fork.py) ----------------------------------------------------

    def _related(self, location: str, *, maintenance: bool = False) -> Shard:
        """A handle on the shard at ``location`` with this one's storage options,
        configuration and kind of log (next to its data when this one's is, else the same
        database URL), on a sibling of this one's store (`Blob.sibling`): a fork's source, a
        source's fork. `InvalidOption` for a shard whose log is a consensus object (forks need
        a log every process can name)."""
        url = self._consensus_url
        if url is None and not isinstance(underlying(self._consensus), BlobConsensus):
            raise InvalidOption(
                "forks need the shard's log next to its data or in a database given by URL "
                "(consensus='sqlite:///...' or 'postgresql://...'), not a consensus object",
                location=self.location,
            )
        blob = self._blob.sibling(location)
        return Shard(
            location,
            consensus=url,
            blob=blob,
            config=self.config,
            maintenance=maintenance,
            **self._storage_options,
        )

    @metrics.operation_method("fork")
    def fork(self, dst: str, as_of: int | None = None) -> Shard:
        """A new shard at ``dst`` whose snapshot at ``as_of`` (default upper - 1; in
        ``[since, upper)``) is this shard's, with since ``as_of`` and upper ``as_of + 1``. It
        names this shard's parts instead of copying them (it writes its metadata only), with
        the same storage options and kind of log; writes, compaction and gc on either side
        never change the other. See `persistshard.core.fork`."""
        from persistshard.core import fork as forks

        forked = forks.fork(self, dst, as_of)
        assert isinstance(forked, Shard)  # made by `_related`
        return forked

    @metrics.operation_method("drop")
    def drop(self, *, dry_run: bool = False) -> Any:  # a core.fork.DropReport
        """Delete this shard: its own parts and log, releasing what it referenced (its pins at
        the shards it was forked from). Parts that live forks name are kept (with the log
        recording them) until the forks release them. ``dry_run``: only report what would go.
        Returns a `persistshard.core.fork.DropReport`; rerun after a crash to finish."""
        from persistshard.core import fork as forks

        return forks.drop(self, apply=not dry_run)

    @metrics.operation_method("compact")
    def _maybe_compact(self, max_merges: int = 1) -> CompactionReport | None:
        """The small compaction a writer may run after its commit; None if nothing was due
        (`persistshard.core.maintenance.compact.maybe_compact`)."""
        self._require_shard()
        return maybe_compact_shard(self._machine, max_merges=max_merges)

    # --- the flat names API.md promises: thin aliases of the groups ----------------------

    def compact(self, *, full: bool = True, max_merges: int | None = None) -> CompactionReport:
        """`Maintenance.compact` (API.md names it on the shard)."""
        return self.maintenance.compact(full=full, max_merges=max_merges)

    def gc(
        self,
        dry_run: bool = True,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        now_ms: int | None = None,
    ) -> GcReport:
        """`Maintenance.gc` (API.md names it on the shard)."""
        return self.maintenance.gc(dry_run, retention_seconds=retention_seconds, now_ms=now_ms)

    def verify(self) -> VerifyReport:
        """`Inspect.verify` (API.md names it on the shard)."""
        return self.inspect.verify()

    def history(self) -> list[dict[str, Any]]:
        """`Inspect.history` (API.md names it on the shard)."""
        return self.inspect.history()


class Maintenance:
    """``shard.maintenance``: what tidies a shard or undoes what a reader left behind.

    Compaction and gc never change what any read returns (`persistshard.core.maintenance`);
    `expire_reader` and `drop_consumer` are an operator's tools that release since (the CLI's
    ``holds --expire/--drop``). ``auto`` is the bounded compaction and gc this handle runs
    after each of its own commits (`persistshard.core.maintenance.auto`; ``auto.enabled`` is
    ``open_shard(..., maintenance=...)``). `compact`, `gc` and `drop_consumer` are `NoShard` on
    a location that holds no shard."""

    def __init__(self, shard: Shard, auto: AutoMaintenance) -> None:
        self._shard = shard
        #: The after-commit maintenance of this handle's commits.
        self.auto = auto

    @property
    def location(self) -> str:
        """The shard's location (what `metrics.operation_method` names a storage error by)."""
        return self._shard.location

    @property
    def enabled(self) -> bool:
        """Whether this handle runs the after-commit maintenance."""
        return self.auto.enabled

    @metrics.operation_method("compact")
    def compact(self, *, full: bool = True, max_merges: int | None = None) -> CompactionReport:
        """Merge trace batches (unsealed updates, same-level pairs, and with ``full`` every
        batch below since) until the trace is tidy, at most ``max_merges`` merges. See
        `persistshard.core.maintenance.compact`."""
        self._shard._require_shard()
        return compact_shard(self._shard._machine, full=full, max_merges=max_merges)

    @metrics.operation_method("gc")
    def gc(
        self,
        dry_run: bool = True,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        now_ms: int | None = None,
    ) -> GcReport:
        """List (and with ``dry_run=False`` delete) parts, rollups and log entries no live
        version needs, keeping what changed within ``retention_seconds``; with
        ``dry_run=False`` it also releases this shard's pins that no fork needs any more. See
        `persistshard.core.maintenance.gc`."""
        shard = self._shard
        state = shard._require_shard()
        released: list[str] = []
        if not dry_run and state.forks:
            from persistshard.core import fork as forks

            released += forks.release_dangling(shard, now_ms)  # creations that died
        if not dry_run and state.txn_pins:
            from persistshard.core import txnlog

            released += txnlog.release_dangling(shard, now_ms)  # transactions that died
        report = collect(
            shard._machine, dry_run=dry_run, retention_seconds=retention_seconds, now_ms=now_ms
        )
        if not dry_run and report.unneeded_sources:
            from persistshard.core import fork as forks

            released += forks.release_sources(shard, report.unneeded_sources)
        report.released_pins = released
        return report

    def expire_reader(self, reader_id: str) -> None:
        """Drop ``reader_id``'s hold by hand (CLI ``holds --expire``; idempotent)."""
        machine = self._shard._machine
        machine.commit(ExpireReader(reader_id, id=machine.new_id()))

    def drop_consumer(self, name: str) -> None:
        """Drop durable consumer ``name`` by hand (CLI ``holds --drop``; idempotent)."""
        self._shard._require_shard()
        Consumer(self._shard._machine, name, None).drop()


class Inspect:
    """``shard.inspect``: read-only looks at a shard's state, log and storage.

    Nothing here commits or deletes. Every call but `state` is `NoShard` on a location that
    holds no shard; `state` returns the empty state there (version 0)."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard

    def state(self) -> ShardState:
        """The newest state version (re-reads the consensus head): the model of
        `persistshard.core.statemachine.state`, for tools and tests."""
        return self._shard._machine.state()

    def head_version(self) -> int | None:
        """The version of the newest entry of the shard's log, or None where nothing was
        ever committed: one read of the log's head, none of the state (whether a shard is
        there, for tools that refuse a location holding none)."""
        head = self._shard._consensus.head()
        return None if head is None else head.version

    def retention(self) -> Retention | None:
        """The shard's history retention, or None (keeps everything until since is moved)."""
        return self._shard._machine.state().retention

    def readers(self) -> dict[str, tuple[int, int]]:
        """``{reader_id: (since, lease expiry in ms since the epoch)}`` of the live holds."""
        shard = self._shard
        shard._require_shard()
        holds = shard._machine.state().live_holds(shard.config.clock())
        return {r: (h.since, h.expires_ms) for r, h in sorted(holds.items())}

    def consumers(self) -> dict[str, int]:
        """``{name: position}`` of the durable consumers (`readers` lists the leased holds)."""
        state = self._shard._require_shard(self._shard._machine.state())
        return {n: c.position for n, c in sorted(state.consumers.items())}

    def history(self) -> list[dict[str, Any]]:
        """The commits still in the log, oldest first: version, what it did (``kind``: one of
        `HISTORY_KINDS`), the commit kind of the state machine (``commit``), id, time and a
        one-line summary."""
        self._shard._require_shard()
        out = []
        for version, entry in self._shard._machine.entries(1):
            out.append(
                {
                    "version": version,
                    "kind": entry.commit.history_kind(),
                    "commit": entry.commit.kind,
                    "id": entry.commit.id,
                    "at_ms": entry.at_ms,
                    "summary": entry.commit.summary(),
                    "metrics": entry.commit.metrics,
                }
            )
        return out

    def verify(self) -> VerifyReport:
        """Check every invariant of the newest state, every checksum of every part and of
        every retained consensus entry."""
        from persistshard.core.storage.parts import open_part, part_blob

        shard = self._shard
        problems: list[str] = []
        state = shard._require_shard(shard._machine.state())
        try:
            state.check()
        except CorruptData as e:
            problems.append(str(e))
        for logged in shard._consensus.scan(1):  # every retained log entry's checksum
            try:
                name = shard._consensus.entry_name(logged.version)
                Entry.decode(logged.data, name, shard.location)
            except CorruptData as err:
                problems.append(str(err))
        checked = 0
        nbytes = 0
        for b in (*state.trace, *state.unsealed):
            for ref in b.parts:
                stored = part_blob(shard._blob, ref)  # a fork's source's part: the source's store
                size = stored.size(ref.key) if ref.inline is None else len(ref.inline)
                if size is None:
                    problems.append(f"part {ref.key} of batch {b.id} is missing")
                    continue
                if size != ref.size:
                    problems.append(f"part {ref.key} has {size} bytes, the state says {ref.size}")
                    continue
                try:
                    reader = open_part(shard._blob, ref)
                    reader.verify()
                    if reader.num_rows != ref.num_rows:
                        problems.append(
                            f"part {ref.key} has {reader.num_rows} rows, state says {ref.num_rows}"
                        )
                except PersistShardError as e:
                    problems.append(str(e))
                checked += 1
                nbytes += size
        for problem in problems:
            log.warning("%s: verify: %s", shard.location, problem)
        return VerifyReport(state.version, checked, nbytes, problems)

    def describe(self) -> dict[str, Any]:
        """Upper, since, batches by level, sizes, unsealed updates (for `persistshard inspect`)."""
        shard = self._shard
        state = shard._require_shard(shard._machine.state())
        now = shard.config.clock()
        levels: dict[int, dict[str, int]] = {}
        for b in state.trace:
            lvl = levels.setdefault(b.level, {"batches": 0, "parts": 0, "rows": 0, "bytes": 0})
            lvl["batches"] += 1
            lvl["parts"] += len(b.parts)
            lvl["rows"] += b.num_rows
            lvl["bytes"] += b.size_bytes
        return {
            "location": shard.location,
            "version": state.version,
            "upper": state.upper,
            "since": state.since,
            "schema": str(state.schema) if state.schema is not None else None,
            "trace_levels": {str(k): v for k, v in sorted(levels.items())},
            "trace_batches": len(state.trace),
            "unsealed_batches": len(state.unsealed),
            "unsealed_rows": sum(b.num_rows for b in state.unsealed),
            "unsealed_bytes": sum(b.size_bytes for b in state.unsealed),
            "writers": dict(state.writers),
            "forks": {f: pin.location for f, pin in sorted(state.forks.items())},
            "sources": dict(sorted(state.sources.items())),
            "txns": state.txns.to_json() if state.txns is not None else None,
            "pending_transactions": sorted(state.txn_pins),
            "holds": {
                r: {
                    "since": h.since,
                    "expires_ms": h.expires_ms,
                    "live": h.live_at(now),
                }
                for r, h in sorted(state.holds.items())
            },
            "consumers": {
                n: {"position": c.position, "moved_ms": c.moved_ms, "age_ms": now - c.moved_ms}
                for n, c in sorted(state.consumers.items())
            },
        }


def _snapshot_schema(user: pa.Schema) -> pa.Schema:
    return pa.schema([*user, pa.field(DIFF, pa.int64(), nullable=False)])


#: What `Inspect.history` calls each commit, by what it did.
HISTORY_KINDS = (
    "append",  # rows added at the upper (also a plain append that landed after a lost race)
    "overwrite",  # a self-correcting overwrite: the difference from the previous contents
    "upsert",  # rows replaced or deleted by key: the difference from the previous rows
    "stream append",  # one micro-batch of a streaming writer
    "seal",  # the upper moved without new updates
    "compact",  # batches merged (physical and logical compaction)
    "advance_since",  # since asked to move forward (as far as live reader holds allow)
    "register_reader",  # a reader took a hold on since
    "downgrade_since",  # a reader moved its hold forward
    "heartbeat",  # a reader renewed its hold's lease
    "expire_reader",  # a reader's hold was released
    "renew_lease",  # a long write renewed its lease (core/statemachine/leases.py)
    "sweep_leases",  # gc's lease fence before it deleted parts of abandoned writes
    "set_retention",  # the history retention was set or cleared
    "create_consumer",  # a durable consumer was created at the since
    "advance_consumer",  # a durable consumer moved its position (a compare-and-set)
    "drop_consumer",  # a durable consumer was dropped
    "fork",  # the first version of a fork: the source's parts named, not copied
    "add_fork",  # a fork pinned the parts of this shard it names
    "release_fork",  # a fork released its pin (its compaction replaced them, or it was dropped)
    "drop",  # the shard was dropped
    "register_txns",  # the shard was registered with a txns shard (core/txns.py)
    "unregister_txns",  # the shard left its txns shard, sealed at the logical upper
    "stage_txn",  # a transaction pinned the parts it wrote here, before its commit
    "release_txn",  # a transaction that lost its race or died released its pin
    "apply_txn",  # a committed transaction's write was applied here
)


def retention_of(seconds: float | None, versions: int | None, location: str) -> Retention | None:
    """The `Retention` of `Shard.set_retention`'s arguments (None when both are None);
    `InvalidOption` naming the value when one is not a positive finite number (or integer)."""
    if seconds is None and versions is None:
        return None
    ms = None
    if seconds is not None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise InvalidOption(
                f"retention seconds {seconds!r} is not a positive finite number; give a "
                "window in seconds, or None to keep no window",
                location=location,
            )
        ms = max(1, round(seconds * 1000))
    if versions is not None and (isinstance(versions, bool) or not isinstance(versions, int)):
        raise InvalidOption(f"retention versions {versions!r} is not an integer", location=location)
    retention = Retention(ms=ms, versions=versions)
    problem = retention.problem()
    if problem is not None:
        raise InvalidOption(f"{problem}; choose a smaller or positive value", location=location)
    return retention


def advance_consumer(
    location: str,
    name: str,
    *,
    to: int,
    expected: int,
    consensus: Consensus | str | None = None,
    **storage_options: Any,
) -> int:
    """Move durable consumer ``name`` of the shard at ``location`` from ``expected`` to
    ``to`` (`Consumer.advance`: a compare-and-set, `StateConflict` with ``.actual`` for the
    loser, `InvalidOption` backwards or past the upper); returns ``to``. Never creates the
    consumer. For a job's driver after its output is committed."""
    shard = Shard(location, consensus=consensus, maintenance=False, **storage_options)
    shard._require_shard()
    return Consumer(shard._machine, check_name(name, shard.location), None).advance(
        to, expected=expected
    )


def open_shard(
    location: str,
    *,
    consensus: Consensus | str | None = None,
    config: ShardConfig | None = None,
    maintenance: bool = True,
    **options: Any,
) -> Shard:
    """Open (or create on first write) the shard at ``location``. ``consensus``: where its log
    is, a `Consensus` or a URL (``sqlite:///...``, ``postgresql://...``,
    `persistshard.core.storage.sqlconsensus`); default the log next to the data
    (`BlobConsensus`). ``config`` and the knobs named in ``options`` (``inline_bytes=0``,
    ``clock=...``: `persistshard.core.config.ShardConfig`) tune the handle; the other
    ``options`` are the blob store's (fsspec's). ``maintenance``: whether this handle runs the
    bounded compaction and gc after its commits (`persistshard.core.maintenance.auto`;
    default on)."""
    return Shard(location, consensus=consensus, config=config, maintenance=maintenance, **options)


def write_transaction(shard: Shard, write_id: str | None = None) -> WriteTransaction:
    """The write protocol on ``shard`` (`persistshard.core.write.transaction`): a transaction
    under ``write_id`` (default: a fresh id from the shard's clock), with the handle's inline
    settings and after-commit maintenance. Every write path (the Python API's appends and
    upserts, every Spark write) goes through one."""
    return WriteTransaction(
        shard._machine,
        inline_bytes=shard._inline_bytes,
        inline_cap=shard.config.inline_cap,
        maintenance=shard.maintenance.auto,
        write_id=write_id,
    )


def plan_read_tasks(
    shard: Shard, state: ShardState, query: Query, **options: Any
) -> list[ReadTask]:
    """Read tasks of ``query`` over the pinned ``state`` (`persistshard.core.read.plan.plan_read`
    with ``options``), planned on ``shard``'s storage: a Spark read's partitions."""
    return plan_read(shard._blob, state, query, **options)


def iter_read_task(
    shard: Shard, task: ReadTask, *, as_multiset: bool = False
) -> Iterator[pa.Table]:
    """The rows of one read task, chunk by chunk when it can
    (`persistshard.core.read.plan.iter_task`), from ``shard``'s storage."""
    return iter_task(shard._blob, task, as_multiset=as_multiset)


def direct_read_slices(
    shard: Shard,
    task: ReadTask,
    accepts: Callable[[pa.Schema], bool],
    hadoop_schemes: Collection[str] = (),
) -> list[DirectSlice] | None:
    """The slices of a read task a reader may hand over as stored
    (`persistshard.core.read.plan.direct_slices`), on ``shard``'s storage; None if none."""
    return direct_slices(shard._blob, task, accepts, hadoop_schemes)


def read_state(shard: Shard) -> ShardState:
    """The newest state of ``shard`` as its reads see it (`Shard._read_state`: for a shard
    registered with a txns shard, its committed writes not applied yet and its logical
    upper): what a Spark read plans on."""
    return shard._read_state()


def run_read_task(shard: Shard, task: ReadTask, *, as_multiset: bool = False) -> pa.Table:
    """The consolidated rows of one read task (`persistshard.core.read.plan.read_task`)."""
    return read_task(shard._blob, task, as_multiset=as_multiset)
