"""Spark reads: consistent snapshots and change reads of one pinned state version.

``partitions()`` runs once per DataFrame on the driver: it reads the shard state once (the
*pinned* version), checks the times against since and upper, and plans the work. Every
partition reads only parts of that version, so a read is consistent even while writers
commit; those parts stay in place because GC keeps what recent versions reference.

Consolidation must see every update of a row, so partitions split the rows by *key range*
over the first row column, using the chunk statistics in the part footers: partition ``i``
reads, from every part, only the chunks whose key range meets ``[split_i, split_i+1)`` and
keeps the rows in it (nulls go to the last partition). All updates of a row have the same
first column, so they meet in one task, and reads stay parallel. When the first column has no
usable statistics (floats, nested types), the read is one partition.

Each task then filters times, forwards times below since, consolidates with the one rule of
`persistshard.core.rows`, and yields Arrow batches that match Spark's read schema exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from persistshard.core.blob import Blob
from persistshard.core.parts import adapt_part_table, open_part
from persistshard.core.rows import DIFF, TIME, advance_times, consolidate, snapshot_of
from persistshard.core.shard import Shard, check_as_of, check_updates_range, open_shard
from persistshard.core.state import PartRef, ShardState
from persistshard.core.validate import update_schema
from persistshard.datasource.options import ReadOptions
from persistshard.datasource.types import arrow_schema_of, conform
from persistshard.errors import InvalidUpdates, NegativeDiff

#: Rows per Arrow batch handed to Spark.
BATCH_ROWS = 1 << 16


@dataclass(frozen=True)
class Query:
    """What a read computes: a snapshot at ``as_of`` or the updates in ``[lo, hi)``."""

    mode: str  # "snapshot" | "updates"
    as_of: int = 0
    lo: int = 0
    hi: int = 0
    since: int = 0
    with_diff: bool = False


@dataclass(frozen=True)
class PartSlice:
    """The chunks of one part a partition reads."""

    ref: PartRef
    chunks: tuple[int, ...] | None  # None: every chunk


@dataclass(frozen=True)
class KeyRange:
    """Rows whose first column is in ``[lo, hi)``; None bounds are open; nulls when last."""

    column: str
    lo: Any
    hi: Any
    nulls: bool


class ShardPartition(InputPartition):
    """One task's share of a read: part slices of the pinned version and a key range."""

    def __init__(
        self,
        location: str,
        version: int,
        slices: list[PartSlice],
        key_range: KeyRange | None,
        query: Query,
        stored_schema: pa.Schema,
    ) -> None:
        super().__init__(version)
        self.location = location
        self.version = version
        self.slices = slices
        self.key_range = key_range
        self.query = query
        self.stored_schema = stored_schema


def check_query(shard: Shard, state: ShardState, opts: ReadOptions) -> Query:
    """The query of ``opts`` against ``state``, or the API's error for bad times."""
    if opts.reads_updates:
        lo = opts.updates_from if opts.updates_from is not None else 0
        hi = opts.updates_to if opts.updates_to is not None else state.upper
        if opts.updates_to is None and lo > hi:
            raise InvalidUpdates(
                f"updates_from {lo} is after the shard's upper {state.upper}: no update there "
                f"is sealed yet; read from {state.upper} at most",
                location=shard.location,
            )
        check_updates_range(state, lo, hi, shard.location)
        return Query("updates", lo=lo, hi=hi, since=state.since)
    as_of = opts.as_of if opts.as_of is not None else state.upper - 1
    check_as_of(state, as_of, shard.location)
    return Query(
        "snapshot", as_of=as_of, since=state.since, with_diff=opts.with_diff or opts.changes
    )


def _relevant_parts(state: ShardState, q: Query) -> list[PartRef]:
    max_time = q.as_of if q.mode == "snapshot" else q.hi - 1
    refs = [
        p
        for b in state.trace
        if b.lower <= max_time
        for p in b.parts
        if p.num_rows and p.min_time <= max_time
    ]
    refs += [p for b in state.unsealed for p in b.parts if p.num_rows and p.min_time <= max_time]
    return refs


_RANGE_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_binary,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_decimal,
    pa.types.is_boolean,
)


def plan_partitions(
    shard: Shard, state: ShardState, q: Query, opts: ReadOptions
) -> list[ShardPartition]:
    """Partitions of the pinned ``state`` for ``q``, split by key range (module docstring)."""
    assert state.schema is not None
    stored = update_schema(state.schema)
    refs = _relevant_parts(state, q)
    total = sum(r.size for r in refs)
    want = max(1, min(opts.max_partitions, -(-total // max(1, opts.partition_bytes))))
    first = state.schema.field(0)
    rangeable = any(test(first.type) for test in _RANGE_TYPES)
    if want == 1 or not rangeable or not refs:
        slices = [PartSlice(r, None) for r in refs]
        return [ShardPartition(shard.location, state.version, slices, None, q, stored)]
    with ThreadPoolExecutor(max_workers=min(8, len(refs))) as pool:
        readers = list(pool.map(lambda r: open_part(shard.blob, r), refs))
    chunk_stats = []  # (key_min, key_max, has_nulls, bytes, part index, chunk index)
    for pi, reader in enumerate(readers):
        for ci, c in enumerate(reader.chunks):
            if c.key_min is None and c.key_null_count < c.num_rows:
                slices = [PartSlice(r, None) for r in refs]
                return [ShardPartition(shard.location, state.version, slices, None, q, stored)]
            chunk_stats.append((c.key_min, c.key_max, c.key_null_count > 0, c.length, pi, ci))
    valued = sorted((s for s in chunk_stats if s[0] is not None), key=lambda s: s[0])
    if not valued:
        slices = [PartSlice(r, None) for r in refs]
        return [ShardPartition(shard.location, state.version, slices, None, q, stored)]
    total_bytes = sum(s[3] for s in valued)
    splits: list[Any] = []
    acc = 0
    for s in valued:
        if acc >= total_bytes * (len(splits) + 1) / want and (not splits or s[0] > splits[-1]):
            if s[0] > valued[0][0]:
                splits.append(s[0])
        acc += s[3]
    bounds = [None, *splits, None]
    out = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        last = i == len(bounds) - 2
        per_part: dict[int, list[int]] = {}
        for kmin, kmax, has_nulls, _, pi, ci in chunk_stats:
            meets = kmin is not None and (lo is None or kmax >= lo) and (hi is None or kmin < hi)
            if meets or (last and has_nulls):
                per_part.setdefault(pi, []).append(ci)
        slices = [PartSlice(refs[pi], tuple(cis)) for pi, cis in sorted(per_part.items())]
        key_range = KeyRange(first.name, lo, hi, last)
        out.append(ShardPartition(shard.location, state.version, slices, key_range, q, stored))
    return out


def _in_range(table: pa.Table, kr: KeyRange) -> pa.Table:
    col = table.column(kr.column)
    mask = None
    if kr.lo is not None:
        mask = pc.greater_equal(col, pa.scalar(kr.lo, col.type))
    if kr.hi is not None:
        upper = pc.less(col, pa.scalar(kr.hi, col.type))
        mask = upper if mask is None else pc.and_(mask, upper)
    if mask is None:
        return table if kr.nulls else table.filter(pc.is_valid(col))
    mask = pc.fill_null(mask, False)
    if kr.nulls:
        mask = pc.or_(mask, pc.is_null(col))
    return table.filter(mask)


def read_partition(
    p: ShardPartition, blob: Blob | None = None, *, as_multiset: bool = False
) -> pa.Table:
    """The consolidated rows of one partition (rows + ``_diff``, or + ``_time`` + ``_diff``).

    With ``as_multiset`` (a snapshot whose rows will be repeated by their diffs), rows may
    repeat when every diff is positive: repeating each update by its diff gives the same
    multiset as repeating each consolidated row by its summed diff, so the sort is skipped.
    """
    blob = blob if blob is not None else open_shard(p.location).blob
    q = p.query
    max_time = q.as_of if q.mode == "snapshot" else q.hi - 1

    def load(s: PartSlice) -> pa.Table:
        reader = open_part(blob, s.ref)
        chunks = list(range(len(reader.chunks))) if s.chunks is None else list(s.chunks)
        chunks = [
            c for c in chunks if (low := reader.chunks[c].min_time) is None or low <= max_time
        ]
        table = adapt_part_table(reader.read(chunks=chunks), s.ref, p.stored_schema)
        if s.ref.max_time > max_time:
            table = table.filter(pc.less_equal(table.column(TIME), max_time))
        if p.key_range is not None:
            table = _in_range(table, p.key_range)
        return table

    if not p.slices:
        table = p.stored_schema.empty_table()
    elif len(p.slices) == 1:
        table = load(p.slices[0])
    else:
        with ThreadPoolExecutor(max_workers=min(4, len(p.slices))) as pool:
            table = pa.concat_tables(list(pool.map(load, p.slices)))
    if q.mode == "snapshot":
        single_time = len(p.slices) == 1 and p.slices[0].ref.min_time == p.slices[0].ref.max_time
        if single_time:
            # One consolidated part at one time: rows are already distinct and sorted.
            return table.drop_columns([TIME])
        if as_multiset and (table.num_rows == 0 or pc.min(table.column(DIFF)).as_py() > 0):
            return table.drop_columns([TIME])
        return snapshot_of(table)
    table = advance_times(table, q.since)
    times = table.column(TIME)
    table = table.filter(pc.and_(pc.greater_equal(times, q.lo), pc.less(times, q.hi)))
    return consolidate(table)


def expand_rows(table: pa.Table, location: str, as_of: int) -> pa.Table:
    """Repeat each row by its diff (a snapshot without ``with_diff``); negative is an error."""
    diffs = table.column(DIFF).to_numpy()
    rows = table.drop_columns([DIFF])
    if diffs.size == 0 or bool((diffs == 1).all()):
        return rows
    negative = np.flatnonzero(diffs < 0)
    if negative.size:
        first = table.slice(int(negative[0]), 1).to_pylist()[0]
        raise NegativeDiff(
            f"{negative.size} rows have a negative count at as_of {as_of}, for example "
            f"{first}; read with option('with_diff', True) to see the diffs",
            location=location,
        )
    return rows.take(pa.array(np.repeat(np.arange(len(diffs), dtype=np.int64), diffs)))


def with_snapshot_time(table: pa.Table, q: Query) -> pa.Table:
    """A snapshot's rows as updates at ``as_of`` (adds ``_time``); other results unchanged."""
    if q.mode != "snapshot" or TIME in table.column_names:
        return table
    times = pa.array(np.full(table.num_rows, q.as_of, dtype=np.int64))
    return table.append_column(pa.field(TIME, pa.int64(), nullable=False), times)


def check_read_schema(opts: ReadOptions, schema: StructType) -> None:
    """Refuse a read whose Spark schema would lose what the options ask for.

    A SQL table's schema is fixed when it is created; ``SELECT * FROM t WITH ('updates_from'
    = ...)`` on a table without ``_time``/``_diff`` would return changes as plain rows, where
    a deletion and an insertion look the same. That is refused, naming the table to create.
    """
    names = set(schema.names)
    location = opts.location
    if (opts.reads_updates or opts.changes) and not {TIME, DIFF} <= names:
        asked = "changes" if opts.changes else "updates_from / updates_to"
        raise InvalidUpdates(
            f"option {asked} reads changes, but this table's columns have no {TIME} and "
            f"{DIFF}, so every change would come back as a plain row. Create a change table "
            f"over the same shard and read that: CREATE TABLE t_changes USING persistshard "
            f"LOCATION '{location}' OPTIONS (changes 'true'); SELECT * FROM t_changes WITH "
            "('updates_from' = '1')"
        )
    if opts.with_diff and DIFF not in names:
        raise InvalidUpdates(
            f"option with_diff reads {DIFF}, but this table's columns have none. Create a table "
            f"that has it: CREATE TABLE t_diffs USING persistshard LOCATION '{location}' "
            "OPTIONS (with_diff 'true')"
        )


def check_table_columns(schema: StructType, stored: pa.Schema, location: str) -> None:
    """A SQL table's columns must be the shard's, plus (after ``ALTER TABLE ... ADD COLUMNS``)
    nullable columns the shard does not have yet, which read as nulls. Anything else (a
    dropped or renamed column) is refused, saying what differs."""
    wanted = [f for f in schema.fields if f.name not in (TIME, DIFF)]
    names = {f.name for f in wanted}
    lost = [f.name for f in stored if f.name not in names]
    if lost:
        raise InvalidUpdates(
            f"the table's columns ({', '.join(names_in_order(wanted))}) no longer include the "
            f"shard's column{'s' if len(lost) > 1 else ''} {', '.join(lost)}: persistshard "
            "can only add nullable columns (ALTER TABLE ... ADD COLUMNS); dropping or renaming "
            "is not supported. Re-create the table over the shard: DROP TABLE t; CREATE TABLE "
            f"t USING persistshard LOCATION '{location}'",
            location=location,
        )


def names_in_order(fields: list[Any]) -> list[str]:
    return [f.name for f in fields]


class PersistShardReader(DataSourceReader):
    """A batch read (``spark.read.format("persistshard")``); see the module docstring."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options, schema)
        check_read_schema(self.opts, schema)
        self.schema = schema

    def partitions(self) -> list[ShardPartition]:
        shard = open_shard(self.opts.location)
        state = shard.state()
        if state.schema is None:
            raise InvalidUpdates(f"no shard at {shard.location}: nothing was ever written there")
        check_table_columns(self.schema, state.schema, shard.location)
        q = check_query(shard, state, self.opts)
        return plan_partitions(shard, state, q, self.opts)

    def read(self, partition: ShardPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        q = partition.query
        target = arrow_schema_of(self.schema)
        table = read_partition(partition, as_multiset=DIFF not in target.names)
        if q.mode == "snapshot" and DIFF not in target.names:
            table = expand_rows(table, partition.location, q.as_of)
        table = with_snapshot_time(table, q)
        table = conform(table, target)
        yield from table.to_batches(max_chunksize=BATCH_ROWS)
