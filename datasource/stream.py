"""Streaming reads: the snapshot, then every later update, as rows with ``_time`` and ``_diff``.

Offsets are ``{"upper": u}``: everything at times below ``u`` has been emitted. The first
micro-batch (from the initial offset ``{"upper": -1}``) emits the snapshot at ``end - 1`` as
updates at that time (one row per distinct row, its net diff); each later micro-batch emits the
consolidated updates in ``[start, end)``. Because times below the upper are final, a
micro-batch replayed after a restart emits exactly the same rows.

Relies on: the shard's since not passing a stream's offset while the stream is stopped (there
are no read holds yet); a stream that finds its offset compacted away fails with
`SinceViolation` rather than emit inexact changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from persistshard.core.rows import DIFF, TIME
from persistshard.core.shard import check_as_of, check_updates_range, open_shard
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
from persistshard.errors import InvalidUpdates

INITIAL = -1


class PersistShardStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("persistshard")`` (see the module docstring)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options, schema)
        if self.opts.as_of is not None or self.opts.updates_to is not None:
            raise InvalidUpdates("a streaming read takes no as_of or updates_to")
        self.schema = schema
        target = arrow_schema_of(schema)
        if TIME not in target.names or DIFF not in target.names:
            raise InvalidUpdates(
                "a streaming read emits rows with _time and _diff, but Spark does not tell a "
                "source that a read is a stream: add .option('changes', True) (the snapshot, "
                "then every later update) or .option('updates_from', T) (every update from T)"
            )

    def initialOffset(self) -> dict[str, int]:
        start = self.opts.updates_from
        return {"upper": INITIAL if start is None else start}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, int]:
        return {"upper": open_shard(self.opts.location, **self.opts.storage_options).upper}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ShardPartition]:
        lo, hi = int(start["upper"]), int(end["upper"])
        shard = open_shard(self.opts.location, **self.opts.storage_options)
        state = shard.state()
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
        """Nothing to release: the stream holds no resources between micro-batches."""
