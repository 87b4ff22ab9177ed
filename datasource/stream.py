"""Streaming reads: the snapshot, then every later update, as rows with ``_time`` and ``_diff``.

Offsets are ``{"upper": u}``: everything at times below ``u`` has been emitted. The first
micro-batch (from the initial offset ``{"upper": -1}``) emits the snapshot at ``end - 1`` as
updates at that time (one row per distinct row, its net diff); each later micro-batch emits the
consolidated updates in ``[start, end)``. Because times below the upper are final, a
micro-batch replayed after a restart emits exactly the same rows.

Holds: the stream holds the shard's since (`persistshard.core.statemachine.holds`) at ``offset - 1``
of the last offset Spark committed (the last time it has fully emitted), so the updates it reads
next stay exact. The hold is named by the option ``reader_id`` (default: one fresh id per query
run) and leased for ``reader_lease_seconds`` (default 900), renewed while the query asks for
new offsets. A query restarted with the same ``reader_id`` while its hold is still live takes
the hold over and reads its changes exactly; one whose hold ran out may find its offset
compacted away, and then fails with `SinceViolation` rather than emit inexact changes. A
``reader_id`` must not be shared by two running queries.

A hold is a commit to the shard, so it needs write access to the location. On a location this
process may only read, the stream fails with `StorageError` saying so (never with the
`HoldExpired` and `Indeterminate` the refused commit raises inside); ``.option("hold",
"false")`` reads without a hold: nothing is written, and the stream fails with
`SinceViolation` if compaction passes its position before it reads on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from persistshard.core.read.plan import check_as_of, check_updates_range
from persistshard.core.rows import DIFF, TIME
from persistshard.core.shard import Shard, read_state
from persistshard.core.statemachine.holds import DEFAULT_LEASE_SECONDS, ReaderHold
from persistshard.core.storage.layout import new_id
from persistshard.datasource.options import ReadOptions
from persistshard.datasource.reader import (
    BATCH_ROWS,
    Query,
    ShardPartition,
    plan_partitions,
    read_partition,
    with_snapshot_time,
)
from persistshard.datasource.types import arrow_schema_of, conform
from persistshard.errors import (
    HoldExpired,
    Indeterminate,
    InvalidOption,
    StorageError,
    is_access_error,
    storage_cause,
)

log = logging.getLogger("persistshard.datasource.stream")

INITIAL = -1


class PersistShardStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("persistshard")`` (see the module docstring)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options, schema)
        if self.opts.as_of is not None or self.opts.updates_to is not None:
            raise InvalidOption("a streaming read takes no as_of or updates_to")
        if self.opts.consumer is not None:
            raise InvalidOption(
                "option consumer is for batch reads (a job that reads its changes and then "
                "advances the consumer); a stream holds its position with option reader_id"
            )
        self.schema = schema
        target = arrow_schema_of(schema)
        if TIME not in target.names or DIFF not in target.names:
            raise InvalidOption(
                "a streaming read emits rows with _time and _diff, but Spark does not tell a "
                "source that a read is a stream: add .option('changes', True) (the snapshot, "
                "then every later update) or .option('updates_from', T) (every update from T)"
            )
        if not self.opts.hold and self.opts.reader_id is not None:
            raise InvalidOption(
                f"option hold is false, but option reader_id ({self.opts.reader_id!r}) names a "
                "hold: leave one of them out"
            )
        self.reader_id = self.opts.reader_id or f"stream-{new_id()}"
        self.lease_seconds = float(self.opts.reader_lease_seconds or DEFAULT_LEASE_SECONDS)
        self._hold: ReaderHold | None = None
        self._renewed = 0.0

    def __getstate__(self) -> dict[str, Any]:
        # Executors only read partitions: the hold stays with the driver-side reader.
        return {**self.__dict__, "_hold": None}

    def _holding(self, shard: Shard) -> ReaderHold | None:
        """This stream's live hold (None with option ``hold`` false): taken over (a restart
        with the same reader id) or registered, and renewed once a third of its lease has
        passed. A refusal to write (a read-only location, credentials that may only read) is
        a `StorageError` that says holds need write access."""
        if not self.opts.hold:
            return None
        try:
            return self._hold_or_renew(shard)
        except (Indeterminate, OSError, StorageError) as e:
            cause = storage_cause(e)
            if cause is None or not is_access_error(cause):
                raise
            raise StorageError(
                f"a streaming read holds the shard's since (reader {self.reader_id!r}), and "
                f"holding is a commit to the shard, but writing at {shard.location} was refused "
                f"({type(cause).__name__}: {cause}); nothing was committed. Grant this user "
                "write access to the location, or read without a hold: "
                ".option('hold', 'false') (the stream then fails with SinceViolation if "
                "compaction passes its position before it reads on)",
                location=shard.location,
                cause=cause,
            ) from None  # Spark prints the chain: the refused commit's errors would confuse

    def _hold_or_renew(self, shard: Shard) -> ReaderHold:
        now = time.monotonic()
        if self._hold is not None and now - self._renewed < self.lease_seconds / 3:
            return self._hold
        try:
            if self._hold is None:
                self._hold = shard.reader(self.reader_id)
            else:
                self._hold.heartbeat()
        except HoldExpired:
            self._hold = shard.register_reader(self.reader_id, lease_seconds=self.lease_seconds)
        self._renewed = now
        return self._hold

    def initialOffset(self) -> dict[str, int]:
        start = self.opts.updates_from
        hold = self._holding(self.opts.address.open())
        if hold is not None and start is not None and start - 1 > hold.since:
            hold.downgrade_since(start - 1)
        return {"upper": INITIAL if start is None else start}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, int]:
        shard = self.opts.address.open()
        self._holding(shard)
        return {"upper": shard.upper}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ShardPartition]:
        lo, hi = int(start["upper"]), int(end["upper"])
        shard = self.opts.address.open()
        state = read_state(shard)  # a registered shard's: its pending writes too
        if hi <= 0 or state.schema is None:
            return []
        if lo == INITIAL:
            as_of = hi - 1
            check_as_of(state, as_of, shard.location)
            q = Query("snapshot", as_of=as_of, since=state.since, with_diff=True)
        elif lo >= hi:
            return []
        else:
            check_updates_range(state, lo, hi, shard.location)
            q = Query("updates", lo=lo, hi=hi, since=state.since)
        return plan_partitions(shard, state, q, self.opts)

    def read(self, partition: ShardPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        table = read_partition(partition)
        table = with_snapshot_time(table, partition.query)
        table = conform(table, arrow_schema_of(self.schema))
        yield from table.to_batches(max_chunksize=BATCH_ROWS)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has everything below ``end``: hold since at ``end - 1`` from now on."""
        upper = int(end["upper"])
        hold = self._holding(self.opts.address.open())
        if hold is not None and upper - 1 > hold.since:
            log.debug(
                "%s: stream read through %d; hold moves to %d", self.opts.location, upper, upper - 1
            )
            hold.downgrade_since(upper - 1)

    def stop(self) -> None:
        """The query stopped: keep the hold (a restart with the same ``reader_id`` resumes
        from it); without a ``reader_id`` nobody can resume it, so release it."""
        if self._hold is not None and self.opts.reader_id is None:
            self._hold.expire()
        self._hold = None
