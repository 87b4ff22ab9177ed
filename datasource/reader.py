"""Spark batch reads: a translation layer over `persistshard.core.read`.

``partitions()`` runs once per DataFrame on the driver: it reads the shard state once (the
*pinned* version), turns the options into a core `Query` (which checks the times against since
and upper) and lets `persistshard.core.read.plan_read` split it into tasks. Each task runs
`persistshard.core.read.iter_task` (`read_task`'s answer, chunk by chunk when it can) and
yields Arrow batches that match Spark's read schema exactly. Read planning, key-range
splitting, change filtering and statistics-based skipping all live in core; nothing here
decides which rows a read returns.

Filter pushdown. Spark calls ``pushFilters`` only when ``spark.sql.python.filterPushdown.enabled``
is true, and when it is false it refuses every read whose reader class overrides
``pushFilters`` (``DATA_SOURCE_PUSHDOWN_DISABLED``). So there are two classes:
`PersistShardReader` (no pushdown) and `PersistShardPushdownReader`, which the data source
returns only while Spark's pushdown planning worker is the caller (`planning_with_pushdown`).
If that detection ever fails, reads fall back to the plain reader: slower, never wrong.

``pushFilters`` takes the filters `persistshard.core.filters.bind` can evaluate as Spark would
(null semantics included) on top-level columns: row columns are filtered before consolidation
and drive chunk skipping; ``_time`` and ``_diff`` of change and ``with_diff`` reads are
filtered on the final rows. It returns every filter to Spark, which re-checks them: Spark 4.3
may run one scan with another scan's reader, even another query's
(`persistshard.datasource.pushes` says when a read may apply its push; a pushed read's
partitions carry an unfiltered plan for when it may not).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from persistshard.core.blob import Blob
from persistshard.core.filters import Pred, bind, conjunction, disjunction, filter_table
from persistshard.core.read import (
    Query,
    ReadTask,
    expand_rows,
    iter_task,
    plan_read,
    read_task,
    snapshot_query,
    updates_query,
    with_snapshot_time,
)
from persistshard.core.rows import DIFF, SYSTEM_COLUMNS, TIME
from persistshard.core.shard import Shard, open_shard
from persistshard.core.state import ShardState
from persistshard.datasource.options import LOCATION_KEY, ReadOptions, StorageOptions
from persistshard.datasource.pushes import Push, claimed_by, record_push
from persistshard.datasource.types import arrow_schema_of, conform
from persistshard.errors import InvalidUpdates

__all__ = [
    "BATCH_ROWS",
    "PersistShardPushdownReader",
    "PersistShardReader",
    "Query",
    "ShardPartition",
    "check_query",
    "plan_partitions",
    "planning_with_pushdown",
    "read_partition",
    "translate_filter",
    "with_snapshot_time",
]

#: Rows per Arrow batch handed to Spark.
BATCH_ROWS = 1 << 16


class ShardPartition(InputPartition):
    """One Spark task: a core `ReadTask` of the pinned version, plus where the shard is."""

    def __init__(
        self,
        location: str,
        version: int,
        task: ReadTask,
        storage_options: dict[str, Any] | None = None,
        unfiltered: ReadTask | None = None,
    ) -> None:
        super().__init__(version)
        self.location = location
        self.version = version
        self.task = task
        self.storage_options = StorageOptions(storage_options or {})  # repr hides the values
        #: A pushed read's partitions carry both plans: ``task`` (pushed filters, skipped
        #: chunks) and ``unfiltered`` (everything), for a scan that may not apply the push
        #: (`persistshard.datasource.pushes`). Either may be an empty task.
        self.unfiltered = unfiltered

    @property
    def query(self) -> Query:
        return self.task.query


def check_query(shard: Shard, state: ShardState, opts: ReadOptions) -> Query:
    """The core query of ``opts`` against ``state``, or the API's error for bad times."""
    if opts.reads_updates:
        lo = opts.updates_from if opts.updates_from is not None else 0
        hi = opts.updates_to if opts.updates_to is not None else state.upper
        if opts.updates_to is None and lo > hi:
            raise InvalidUpdates(
                f"updates_from {lo} is after the shard's upper {state.upper}: no update there "
                f"is sealed yet; read from {state.upper} at most",
                location=shard.location,
            )
        return updates_query(state, lo, hi, shard.location)
    as_of = opts.as_of if opts.as_of is not None else state.upper - 1
    return snapshot_query(state, as_of, shard.location, with_diff=opts.with_diff or opts.changes)


def plan_partitions(
    shard: Shard,
    state: ShardState,
    q: Query,
    opts: ReadOptions,
    row_filter: Pred | None = None,
) -> list[ShardPartition]:
    """Spark partitions of the pinned ``state`` for ``q`` (`core.read.plan_read`)."""
    tasks = plan_read(
        shard.blob,
        state,
        q,
        partition_bytes=opts.partition_bytes,
        max_partitions=opts.max_partitions,
        min_partitions=opts.min_partitions,
        row_filter=row_filter,
    )
    return [ShardPartition(shard.location, state.version, t, shard.storage_options) for t in tasks]


def plan_pushed_partitions(
    shard: Shard,
    state: ShardState,
    q: Query,
    opts: ReadOptions,
    row_filter: Pred,
) -> list[ShardPartition]:
    """Partitions of a pushed read: each carries a task of the filtered plan and one of the
    unfiltered plan (the shorter plan padded with empty tasks)."""
    size, most, least = opts.partition_bytes, opts.max_partitions, opts.min_partitions
    filtered = plan_read(
        shard.blob,
        state,
        q,
        partition_bytes=size,
        max_partitions=most,
        min_partitions=least,
        row_filter=row_filter,
    )
    full = plan_read(
        shard.blob, state, q, partition_bytes=size, max_partitions=most, min_partitions=least
    )
    empty_f = ReadTask((), None, q, filtered[0].stored_schema, row_filter)
    empty_u = ReadTask((), None, q, full[0].stored_schema)
    n = max(len(filtered), len(full))
    return [
        ShardPartition(
            shard.location,
            state.version,
            filtered[i] if i < len(filtered) else empty_f,
            shard.storage_options,
            unfiltered=full[i] if i < len(full) else empty_u,
        )
        for i in range(n)
    ]


def read_partition(
    p: ShardPartition,
    blob: Blob | None = None,
    *,
    as_multiset: bool = False,
    task: ReadTask | None = None,
) -> pa.Table:
    """The consolidated rows of one partition (`core.read.read_task`); ``task`` overrides
    the partition's own (a pushed partition's unfiltered task)."""
    blob = blob if blob is not None else open_shard(p.location, **p.storage_options).blob
    return read_task(blob, task if task is not None else p.task, as_multiset=as_multiset)


def unfiltered_task(task: ReadTask) -> ReadTask:
    """``task`` without its row filter (its chunk choice kept: only a plan without a row
    filter, whose chunks were not chosen by it, comes here)."""
    return dataclasses.replace(task, row_filter=None)


def current_execution_id() -> str | None:
    """The SQL execution id of the running Spark task, if any."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty("spark.sql.execution.id") if ctx is not None else None


# --- filter pushdown -----------------------------------------------------------------------

_PUSHDOWN_WORKER = os.path.join("worker", "data_source_pushdown_filters.py")


def planning_with_pushdown() -> bool:
    """Whether Spark's filter-pushdown planning worker is building this reader.

    Spark runs that worker (and so calls ``pushFilters``) only when
    ``spark.sql.python.filterPushdown.enabled`` is true; any other caller gets a reader
    without ``pushFilters``, which Spark accepts whatever the setting.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PUSHDOWN_WORKER):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


_COMPARISON_OPS: dict[type[Filter], str] = {
    EqualTo: "eq",
    EqualNullSafe: "eq_null_safe",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
    In: "in",
    StringStartsWith: "starts_with",
    StringEndsWith: "ends_with",
    StringContains: "contains",
}


def translate_filter(f: Filter, schema: pa.Schema) -> Pred | None:
    """The core predicate of a Spark filter on a top-level column of ``schema``, or None when
    it cannot be evaluated exactly (`persistshard.core.filters.bind` decides)."""
    if isinstance(f, Not):
        child = translate_filter(f.child, schema)
        return Pred("not", children=(child,)) if child is not None else None
    attribute: Any = getattr(f, "attribute", None)
    if not isinstance(attribute, tuple) or len(attribute) != 1:
        return None  # nested fields are not pushed
    column = attribute[0]
    if isinstance(f, IsNull):
        return bind("is_null", column, None, schema)
    if isinstance(f, IsNotNull):
        return bind("is_not_null", column, None, schema)
    op = _COMPARISON_OPS.get(type(f))
    if op is None:
        return None
    return bind(op, column, getattr(f, "value", None), schema)


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


def declared_table(schema: StructType) -> bool:
    """Whether ``schema`` is a SQL table's catalog schema (its fields carry the location):
    such a table exists, with these columns, before anything is written to its shard."""
    return any(LOCATION_KEY in (f.metadata or {}) for f in schema.fields)


def names_in_order(fields: list[Any]) -> list[str]:
    return [f.name for f in fields]


class PersistShardReader(DataSourceReader):
    """A batch read (``spark.read.format("persistshard")``); see the module docstring."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options, schema)
        check_read_schema(self.opts, schema)
        self.schema = schema
        self.row_filter: Pred | None = None  # on stored row columns, before consolidation
        self.result_filter: Pred | None = None  # on _time / _diff of the final rows
        self.push: Push | None = None  # set by a pushdown: the ledger's record of it

    def partitions(self) -> list[ShardPartition]:
        shard = open_shard(self.opts.location, **self.opts.storage_options)
        state = shard.state()
        if state.schema is None:
            if not declared_table(self.schema):
                raise InvalidUpdates(
                    f"no shard at {shard.location}: nothing was ever written there"
                )
            # A created table nothing was written to yet is an empty table with its declared
            # columns: an explicit time is checked as an empty shard's, no task reads anything.
            if self.opts.as_of is not None or self.opts.reads_updates:
                check_query(shard, state, self.opts)
            return []
        check_table_columns(self.schema, state.schema, shard.location)
        q = check_query(shard, state, self.opts)
        if self.push is not None and self.row_filter is not None:
            return plan_pushed_partitions(shard, state, q, self.opts, self.row_filter)
        return plan_partitions(shard, state, q, self.opts, self.row_filter)

    def read(self, partition: ShardPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if not isinstance(partition, ShardPartition):
            return  # Spark's one empty partition when partitions() planned none
        q = partition.query
        target = arrow_schema_of(self.schema)
        task, result_filter = partition.task, self.result_filter
        if self.push is not None and not claimed_by(self.push, current_execution_id()):
            # Not this push's scan (pushes.py): read everything, Spark filters.
            task, result_filter = partition.unfiltered or unfiltered_task(partition.task), None
        blob = open_shard(partition.location, **partition.storage_options).blob
        multiset = DIFF not in target.names
        for table in iter_task(blob, task, as_multiset=multiset):
            if q.mode == "snapshot" and multiset:
                table = expand_rows(table, partition.location, q.as_of)
            if result_filter is not None:
                table = filter_table(with_snapshot_time(table, q), result_filter)
            elif TIME in target.names:
                table = with_snapshot_time(table, q)
            table = conform(table, target)
            yield from table.to_batches(max_chunksize=BATCH_ROWS)


class PersistShardPushdownReader(PersistShardReader):
    """`PersistShardReader` with ``pushFilters`` (only built while Spark plans pushdown).

    Spark 4.3 keeps the pushdown's read on the relation, not on the scan: two scans of one
    relation in a query (a table and a scalar subquery over it, TPC-H q22) run the *last*
    push's read, and a later query whose scan of the same DataFrame or view pushes nothing
    runs an earlier query's. So ``pushFilters`` returns every filter to Spark (Spark re-checks
    them all), filters with the OR of the pushes no execution has claimed yet, and a read
    applies them only in the execution that claimed the push (`persistshard.datasource.pushes`);
    otherwise it reads the unfiltered plan. Exactness of each filter still matters: the reader
    must never drop a row its scan keeps.
    """

    def __init__(self, options: dict[str, str], schema: StructType, instance_id: str) -> None:
        super().__init__(options, schema)
        self.instance_id = instance_id

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        state = open_shard(self.opts.location, **self.opts.storage_options).state()
        if state.schema is None or not self.instance_id:
            return filters  # partitions() reports the missing shard
        stored = state.schema
        output = set(self.schema.fieldNames())
        system = pa.schema([pa.field(name, pa.int64(), nullable=False) for name in SYSTEM_COLUMNS])
        rows: list[Pred] = []
        results: list[Pred] = []
        for f in filters:
            pred = translate_filter(f, stored)
            if pred is not None and pred.columns() <= set(stored.names):
                rows.append(pred)
                continue
            pred = translate_filter(f, system)
            if pred is not None and pred.columns() <= output:
                results.append(pred)
        self.push = record_push(self.instance_id, (conjunction(rows), conjunction(results)))
        entries = self.push.entries
        self.row_filter = disjunction([row for row, _ in entries])
        if all(result is None for _, result in entries):
            self.result_filter = None
        else:
            self.result_filter = disjunction(
                [conjunction([p for p in entry if p is not None]) for entry in entries]
            )
        return filters  # all of them: Spark re-checks (see the class docstring)
