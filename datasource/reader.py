"""Spark batch reads: a translation layer over `persistshard.core.read.plan`.

``partitions()`` runs once per DataFrame on the driver: it reads the shard state once (the
*pinned* version), turns the options into a core `Query` (which checks the times against since
and upper) and lets `persistshard.core.read.plan.plan_read` split it into tasks. Each task runs
`persistshard.core.read.plan.iter_task` (`read_task`'s answer, chunk by chunk when it can) and
yields Arrow batches that match Spark's read schema exactly. Read planning, key-range
splitting, change filtering and statistics-based skipping all live in core; nothing here
decides which rows a read returns.

Pruning, and why Spark's filter pushdown does none here. Spark 4.3 keeps the read that a
``pushFilters`` call planned (reader and partitions) on the *relation*'s data source object,
not on the scan, and plans a scan with nothing to push without asking Python. So every scan of
one DataFrame or view (a later ``count()`` after a filtered ``explain()``, the other side of a
union, a scalar subquery) may run the read planned for another scan's filters: any row a
reader dropped because of a pushed filter could be missing from a scan that never asked for
that filter (SPARK-HAZARDS.md 2). On such a Spark the source never overrides ``pushFilters``:
Spark evaluates every filter itself, with the switch on or off, and no row is ever dropped
because of pushed state.

Explicit pruning cannot go stale: the ``where`` option (``.option("where", "id < 10")``,
``SELECT * FROM t WITH ('where' = 'id < 10')``) is part of the relation's own options, so
every scan that could share its read has the same condition. It is parsed and bound by
`persistshard.core.read.filters` (`parse_where`, `bind_where`: the grammar is there and in
docs/design.md), and filters exactly: conditions on row columns filter the updates before
consolidation and skip chunks by their statistics; conditions on ``_time``/``_diff`` (or mixing
them with row columns) filter the final rows.

The stateless pushdown design stays for a Spark that keeps read info per scan
(`spark_scopes_read_info`, off for every release so far, pinned by a canary test):
`ScopedPushdownReader.pushFilters` keeps the exact filters on the reader, `partitions` plans
with them and carries them in each partition, and ``read`` applies only what its partition
carries. Spark refuses a reader that overrides ``pushFilters`` when the switch is off, so
that class is built only inside Spark's pushdown planning worker (`planning_with_pushdown`).

Column pruning. Spark 4.3 asks a Python source for no required columns, but a user-given
schema (``spark.read.schema("id long, name string")``) reaches ``reader(schema)`` unchecked:
`check_columns` checks it against the stored columns and the read returns just those columns.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
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

from persistshard.core.read.filters import (
    Pred,
    WhereSyntaxError,
    bind,
    bind_where,
    conjunction,
    filter_table,
    parse_where,
)
from persistshard.core.read.plan import (
    Query,
    ReadTask,
    expand_rows,
    read_task,
    snapshot_query,
    updates_query,
    with_snapshot_time,
)
from persistshard.core.read.race import pinned_read
from persistshard.core.rows import DIFF, TIME
from persistshard.core.shard import (
    Shard,
    ShardAddress,
    iter_read_task,
    plan_read_tasks,
    read_state,
    run_read_task,
)
from persistshard.core.statemachine.consumers import read_from
from persistshard.core.statemachine.state import ShardState
from persistshard.core.storage.blob import Blob
from persistshard.datasource.options import LOCATION_KEY, TABLE_KEY, ReadOptions
from persistshard.datasource.types import arrow_schema_of, conform, spark_schema_of
from persistshard.errors import InvalidOption, InvalidUpdates, NoShard

log = logging.getLogger("persistshard.datasource.reader")

__all__ = [
    "BATCH_ROWS",
    "SCAN_SCOPED_READ_INFO_SINCE",
    "PersistShardReader",
    "Query",
    "ScopedPushdownReader",
    "ShardPartition",
    "check_columns",
    "check_query",
    "check_table_columns",
    "plan_partitions",
    "planning_with_pushdown",
    "read_partition",
    "spark_scopes_read_info",
    "translate_filter",
    "with_snapshot_time",
]

#: Rows per Arrow batch handed to Spark.
BATCH_ROWS = 1 << 16


class ShardPartition(InputPartition):
    """One Spark task: a core `ReadTask` of the pinned version, plus where the shard is.

    Everything a read applies travels here, never on the reader: the task's ``row_filter``
    (applied to updates before consolidation, driving chunk skipping) and ``result_filter``
    (on ``_time``/``_diff`` or mixed conditions, applied to the final rows). Spark 4.3 may run
    a partition list planned for one scan under another scan of the same relation (module
    docstring), so what a partition carries must be right for every scan of the relation:
    filters from the relation's own options (``where``) are, pushed filters are not.
    """

    def __init__(
        self,
        location: str,
        version: int,
        task: ReadTask,
        address: ShardAddress | None = None,
        result_filter: Pred | None = None,
    ) -> None:
        super().__init__(version)
        self.location = location
        self.version = version
        self.task = task
        #: What opens the shard in the task (its repr hides the storage options' values).
        self.address = address if address is not None else ShardAddress(location)
        self.result_filter = result_filter

    @property
    def query(self) -> Query:
        return self.task.query


def check_query(shard: Shard, state: ShardState, opts: ReadOptions) -> Query:
    """The core query of ``opts`` against ``state``, or the API's error for bad times."""
    if opts.reads_updates:
        lo = opts.updates_from if opts.updates_from is not None else 0
        hi = opts.updates_to if opts.updates_to is not None else state.upper
        if opts.consumer is not None:
            lo = consumer_from(shard, state, opts.consumer, hi)
        if opts.updates_to is None and lo > hi:
            raise InvalidOption(
                f"updates_from {lo} is after the shard's upper {state.upper}: no update there "
                f"is sealed yet; read from {state.upper} at most",
                location=shard.location,
            )
        return updates_query(state, lo, hi, shard.location)
    as_of = opts.as_of if opts.as_of is not None else state.upper - 1
    return snapshot_query(state, as_of, shard.location, with_diff=opts.with_diff or opts.changes)


def consumer_from(shard: Shard, state: ShardState, name: str, hi: int) -> int:
    """Where the read of consumer ``name``'s changes up to ``hi`` starts, in the pinned
    ``state`` (`persistshard.core.statemachine.consumers.read_from`); `InvalidOption` when
    the shard has no such consumer (a read never creates one) or ``hi`` is behind it."""
    found = state.consumers.get(name)
    if found is None:
        known = ", ".join(sorted(state.consumers)) or "none"
        raise InvalidOption(
            f"option consumer: the shard has no consumer {name!r} (it has: {known}); create "
            "it first with ps.open_shard(location).consumer(name); a read never creates one",
            location=shard.location,
        )
    if hi < found.position:
        raise InvalidOption(
            f"option updates_to {hi} is behind consumer {name!r}'s position {found.position}",
            location=shard.location,
        )
    return read_from(state, found.position)


def plan_partitions(
    shard: Shard,
    state: ShardState,
    q: Query,
    opts: ReadOptions,
    row_filter: Pred | None = None,
    result_filter: Pred | None = None,
    columns: Sequence[str] | None = None,
    *,
    multiset: bool = False,
) -> list[ShardPartition]:
    """Spark partitions of the pinned ``state`` for ``q`` (`core.read.plan_read`); each
    carries ``row_filter`` in its task and ``result_filter`` beside it. ``columns`` (None:
    all) are the row columns the read returns: tasks then decode only those (and the ones
    the filters read), and consolidate per distinct projected row (`core.read.ReadTask`).
    ``multiset``: the partitions' rows are repeated by their counts (no ``_diff`` column),
    so a snapshot whose diffs are all positive may split by chunk (`plan_read`)."""
    tasks = plan_read_tasks(
        shard,
        state,
        q,
        partition_bytes=opts.partition_bytes,
        max_partitions=opts.max_partitions,
        min_partitions=opts.min_partitions,
        row_filter=row_filter,
        multiset=multiset,
        min_task_bytes=shard.config.min_task_bytes,
    )
    assert state.schema is not None
    if columns is not None and set(columns) != set(state.schema.names):
        names = tuple(n for n in state.schema.names if n in set(columns))
        tasks = [dataclasses.replace(t, columns=names) for t in tasks]
    return [
        ShardPartition(shard.location, state.version, t, shard.address, result_filter)
        for t in tasks
    ]


def read_partition(
    p: ShardPartition, blob: Blob | None = None, *, as_multiset: bool = False
) -> pa.Table:
    """The consolidated rows of one partition (`core.read.read_task`). A part gc collected
    after the driver pinned the partition's version is `VersionCollected` (run the query
    again), a part the newest version names that is missing `CorruptData`
    (`persistshard.core.read.race`)."""

    def newest() -> ShardState:
        return p.address.open().inspect.state()

    with pinned_read(p.version, newest, p.location):
        if blob is not None:
            return read_task(blob, p.task, as_multiset=as_multiset)
        shard = p.address.open()
        return run_read_task(shard, p.task, as_multiset=as_multiset)


# --- the where option ----------------------------------------------------------------------


def output_schema(stored: pa.Schema, schema: StructType) -> pa.Schema:
    """What a ``where`` may name: every stored row column (also one a subset schema leaves
    out: filters apply before projection) and the ``_time``/``_diff`` the read returns."""
    system = [pa.field(n, pa.int64(), nullable=False) for n in (TIME, DIFF) if n in schema.names]
    return pa.schema([*stored, *system])


def split_filter(pred: Pred, row_columns: set[str]) -> tuple[Pred | None, Pred | None]:
    """(row filter, result filter): the top-level conjuncts of ``pred`` that name only row
    columns, and the rest (``_time``/``_diff``, or mixed, evaluated on the final rows)."""
    conjuncts = list(pred.children) if pred.op == "and" else [pred]
    rows = [c for c in conjuncts if c.columns() <= row_columns]
    rest = [c for c in conjuncts if not c.columns() <= row_columns]
    return conjunction(rows), conjunction(rest)


def where_filters(
    opts: ReadOptions,
    parsed: Pred | None,
    stored: pa.Schema,
    schema: StructType,
    columns: Sequence[str] | None = None,
) -> tuple[Pred | None, Pred | None]:
    """The ``where`` option bound against the shard's stored columns, split by
    `split_filter`; an unknown column or an inexact test is refused naming the text.

    The row filter applies to the stored rows (any stored column); the result filter to the
    rows the read returns, so with a pruned schema (``columns``: the row columns returned)
    its row columns must be among them (a ``_diff`` is then the projected row's sum)."""
    if parsed is None:
        return None, None
    try:
        bound = bind_where(parsed, output_schema(stored, schema))
    except WhereSyntaxError as e:
        raise bad_where(opts.where, e, opts.location) from None
    rows, result = split_filter(bound, set(stored.names))
    returned = set(stored.names if columns is None else columns) | {TIME, DIFF}
    outside = sorted(result.columns() - returned) if result is not None else []
    if outside:
        raise bad_where(
            opts.where,
            WhereSyntaxError(
                f"a condition on {TIME}/{DIFF} applies to the rows the read returns, and "
                f"{', '.join(outside)} is not among the columns of .schema(...); add it, or "
                f"put the condition on {', '.join(outside)} in its own AND branch"
            ),
            opts.location,
        )
    return rows, result


def bad_where(text: str | None, error: Exception, location: str | None = None) -> Exception:
    """The error for a ``where`` option the reader cannot apply exactly."""
    return InvalidOption(
        f"option where {text!r} cannot be applied: {error}. The where option takes a SQL "
        "condition over the shard's columns: comparisons with literals, IS [NOT] NULL, "
        "[NOT] IN, [NOT] BETWEEN, [NOT] LIKE 'a%', joined with AND, OR, NOT and parentheses "
        "(docs/design.md, 'Filter pushdown'); filter anything else in Spark (df.where(...))",
        location=location,
    )


# --- filter pushdown (gated) ---------------------------------------------------------------

_PUSHDOWN_WORKER = os.path.join("worker", "data_source_pushdown_filters.py")

#: The first Spark release known to keep a pushdown's read info on the *scan* (SPARK-HAZARDS
#: 2: master keeps it on ``PythonScanBuilder``/``PythonScan``; 4.3.0 keeps it on the
#: relation's ``PythonDataSourceV2``). None: no release has it yet. Set it only together
#: with the canary in tests/test_spark_pushdown.py, which pins the behaviour of the installed
#: Spark: it fails when Spark stops reusing the last pushed read across scans.
SCAN_SCOPED_READ_INFO_SINCE: tuple[int, int, int] | None = None


def spark_version() -> tuple[int, int, int]:
    """The installed PySpark's (major, minor, patch); a pre-release counts as its release."""
    import re

    import pyspark

    numbers = [int(n) for n in re.findall(r"\d+", pyspark.__version__)[:3]]
    numbers += [0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


def spark_scopes_read_info(
    version: tuple[int, int, int] | None = None,
    since: tuple[int, int, int] | None = SCAN_SCOPED_READ_INFO_SINCE,
) -> bool:
    """Whether Spark ``version`` (default the installed one) keeps the read planned by
    ``pushFilters`` per scan, so a reader may prune by what was pushed to it
    (`ScopedPushdownReader`): from release ``since`` on (default
    `SCAN_SCOPED_READ_INFO_SINCE`, a fixed fact about Spark; None: no release). False on every
    release so far."""
    if since is None:
        return False
    return (version or spark_version()) >= since


def planning_with_pushdown() -> bool:
    """Whether Spark's filter-pushdown planning worker is building this reader.

    Spark runs that worker (and so calls ``pushFilters``) only when
    ``spark.sql.python.filterPushdown.enabled`` is true, and refuses a reader that overrides
    ``pushFilters`` when it is false: only that worker may get `ScopedPushdownReader`.
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
    it cannot be evaluated exactly (`persistshard.core.read.filters.bind` decides)."""
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
        asked = (
            "changes"
            if opts.changes
            else "consumer"
            if opts.consumer is not None
            else "updates_from / updates_to"
        )
        raise InvalidOption(
            f"option {asked} reads changes, but this table's columns have no {TIME} and "
            f"{DIFF}, so every change would come back as a plain row. Create a change table "
            f"over the same shard and read that: CREATE TABLE t_changes USING persistshard "
            f"LOCATION '{location}' OPTIONS (changes 'true'); SELECT * FROM t_changes WITH "
            "('updates_from' = '1')"
        )
    if opts.with_diff and DIFF not in names:
        raise InvalidOption(
            f"option with_diff reads {DIFF}, but this table's columns have none. Create a table "
            f"that has it: CREATE TABLE t_diffs USING persistshard LOCATION '{location}' "
            "OPTIONS (with_diff 'true')"
        )


def check_columns(
    schema: StructType, stored: pa.Schema, location: str, declared: bool = False
) -> list[str]:
    """The stored row columns a read of Spark schema ``schema`` returns, after checking them.

    A SQL table's schema (its fields carry the location, `LOCATION_KEY`, or ``declared``: the
    companion's catalog says it is the table's, `TABLE_KEY`) must hold every
    stored column, plus (after ``ALTER TABLE ... ADD COLUMNS``) nullable columns the shard does
    not have yet, which read as nulls; a dropped or renamed column is refused. Any other schema
    (``spark.read.schema("a long, b double")``: Spark hands it to ``reader()`` unchecked) may
    name any subset of the stored columns, in any order, with their stored types: that is
    column pruning (docs/design.md). An unknown column or another type is refused, naming the
    stored columns; NOT NULL for a nullable column is checked on the rows (`check_not_null`)."""
    wanted = [f for f in schema.fields if f.name not in (TIME, DIFF)]
    if declared or declared_table(schema):
        check_table_columns(schema, stored, location)
        return [f.name for f in stored]
    spark_stored = {f.name: f for f in spark_schema_of(stored).fields}
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in spark_stored.values())
    for f in wanted:
        have = spark_stored.get(f.name)
        if have is None:
            raise InvalidOption(
                f"the read schema names column {f.name}, which the shard does not have; its "
                f"columns are: {columns}. Name a subset of them in .schema(...), or leave "
                ".schema(...) out to read them all",
                location=location,
            )
        if have.dataType != f.dataType:
            raise InvalidOption(
                f"the read schema gives column {f.name} the type {f.dataType.simpleString()}, "
                f"but the shard stores {have.dataType.simpleString()}; its columns are: "
                f"{columns}. Use the stored type (cast in Spark afterwards)",
                location=location,
            )
    return [f.name for f in wanted]


def check_table_columns(
    schema: StructType, stored: pa.Schema, location: str, table: str | None = None
) -> None:
    """A SQL table's columns must be the shard's, plus (after ``ALTER TABLE ... ADD COLUMNS``)
    nullable columns the shard does not have yet, which read as nulls. Anything else (a
    dropped or renamed column) is refused, saying what differs and how to re-create the table
    (named ``table``, the companion catalog's name of it, when given: e.g. a REPLACE TABLE
    whose query drops a column)."""
    wanted = [f for f in schema.fields if f.name not in (TIME, DIFF)]
    names = {f.name for f in wanted}
    lost = [f.name for f in stored if f.name not in names]
    if lost:
        t = table or "t"
        raise InvalidOption(
            f"the table's columns ({', '.join(names_in_order(wanted))}) no longer include the "
            f"shard's column{'s' if len(lost) > 1 else ''} {', '.join(lost)}: persistshard "
            "can only add nullable columns (ALTER TABLE ... ADD COLUMNS); dropping or renaming "
            f"is not supported. Re-create the table over the shard: DROP TABLE {t}; CREATE "
            f"TABLE {t} USING persistshard LOCATION '{location}'",
            location=location,
        )


def declared_table(schema: StructType) -> bool:
    """Whether ``schema`` is a SQL table's catalog schema (its fields carry the location):
    such a table exists, with these columns, before anything is written to its shard."""
    return any(LOCATION_KEY in (f.metadata or {}) for f in schema.fields)


def names_in_order(fields: list[Any]) -> list[str]:
    return [f.name for f in fields]


class PersistShardReader(DataSourceReader):
    """A batch read (``spark.read.format("persistshard")``); see the module docstring.

    No ``pushFilters``: on Spark 4.3 nothing pushed may drop a row (module docstring), so
    Spark evaluates every filter. The ``where`` option is checked here (its syntax) and bound
    in `partitions` (its columns and types, against the pinned state's schema).
    """

    def __init__(
        self, options: dict[str, str], schema: StructType, table_schema: StructType | None = None
    ) -> None:
        self.opts = ReadOptions.parse(options, schema)
        check_read_schema(self.opts, table_schema or schema)
        self.schema = schema
        #: Whether the relation is a SQL table's catalog columns: their fields carry the
        #: location, or the companion's catalog names the table (`TABLE_KEY`). Such a table
        #: exists before anything is written to it, and its columns are checked as a table's.
        self.declared = declared_table(table_schema or schema) or bool(options.get(TABLE_KEY))
        #: The relation's whole schema when ``schema`` is a pruned part of it (the JVM
        #: companion's scans, `persistshard.datasource.bridge`): its columns are checked as
        #: a read of all of them would be, so pruning changes no error.
        self.table_schema = table_schema
        self.where: Pred | None = None  # unbound (`parse_where`)
        if self.opts.where is not None:
            try:
                self.where = parse_where(self.opts.where)
            except WhereSyntaxError as e:
                raise bad_where(self.opts.where, e, self.opts.location) from None

    def filters(
        self, stored: pa.Schema, columns: Sequence[str] | None = None
    ) -> tuple[Pred | None, Pred | None]:
        """(row filter, result filter) of this read against the stored columns, returning
        the row columns ``columns`` (None: all)."""
        return where_filters(self.opts, self.where, stored, self.schema, columns)

    def partitions(self) -> list[ShardPartition]:
        shard = self.opts.address.open()
        state = read_state(shard)  # a registered shard's: its pending writes too
        if state.schema is None:
            if not self.declared:
                if state.version == 0:  # a mistyped path must not read as an empty table
                    raise NoShard(
                        f"no shard at {shard.location}: nothing was ever written there (a "
                        "mistyped path, or the wrong storage options?); write to it first"
                    )
                raise InvalidUpdates(
                    f"the shard at {shard.location} has no columns yet: nothing but seals "
                    "was written there; write rows to it first"
                )
            # A created table nothing was written to yet is an empty table with its declared
            # columns: an explicit time is checked as an empty shard's, no task reads anything.
            if self.opts.as_of is not None or self.opts.reads_updates:
                check_query(shard, state, self.opts)
            return []
        if self.table_schema is not None:
            check_columns(self.table_schema, state.schema, shard.location, self.declared)
        if self.table_schema is not None and self.declared:
            # A pruned read of a table: the columns asked for, those the shard lacks (added
            # by ALTER TABLE ... ADD COLUMNS) read as nulls (`conform`).
            columns = [f.name for f in self.schema.fields if f.name in state.schema.names]
        else:
            columns = check_columns(self.schema, state.schema, shard.location, self.declared)
        q = check_query(shard, state, self.opts)
        row_filter, result_filter = self.filters(state.schema, columns)
        multiset = DIFF not in self.schema.fieldNames()
        parts = plan_partitions(
            shard, state, q, self.opts, row_filter, result_filter, columns, multiset=multiset
        )
        log.debug(
            "%s: read of version %d, %s: %d partitions",
            shard.location,
            state.version,
            q,
            len(parts),
        )
        return parts

    def read(self, partition: ShardPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        for table in self.read_tables(partition):
            yield from table.to_batches(max_chunksize=BATCH_ROWS)

    def read_tables(self, partition: ShardPartition) -> Iterator[pa.Table]:
        """`read`'s answer as tables in Spark's read schema (a table of no columns keeps
        its row count, which its batches would not)."""
        if not isinstance(partition, ShardPartition):
            return  # Spark's one empty partition when partitions() planned none
        q = partition.query
        target = arrow_schema_of(self.schema)
        result_filter = partition.result_filter
        shard = partition.address.open()
        multiset = DIFF not in target.names
        # The driver pinned the version in partitions(): a part gc collected since is
        # VersionCollected (the text Spark shows starts with it: run the query again).
        with pinned_read(partition.version, shard.inspect.state, partition.location):
            for table in iter_read_task(shard, partition.task, as_multiset=multiset):
                if result_filter is not None:
                    table = filter_table(with_snapshot_time(table, q), result_filter)
                if q.mode == "snapshot" and multiset:
                    table = expand_rows(table, partition.location, q.as_of)
                if TIME in target.names:
                    table = with_snapshot_time(table, q)
                check_not_null(table, target, partition.location)
                yield conform(table, target)


def check_not_null(table: pa.Table, target: pa.Schema, location: str) -> None:
    """A read schema that declares a column NOT NULL (Spark trusts it) gets no null there:
    a null is refused, naming the column, rather than handed to Spark as a non-null."""
    for f in target:
        if not f.nullable and f.name in table.column_names and table.column(f.name).null_count:
            raise InvalidOption(
                f"column {f.name} holds nulls, but the read schema declares it NOT NULL; drop "
                "NOT NULL from .schema(...)",
                location=location,
            )


class ScopedPushdownReader(PersistShardReader):
    """`PersistShardReader` with ``pushFilters``, for a Spark that keeps read info per scan
    (`spark_scopes_read_info`; never on 4.3, where the source does not build it).

    Stateless: ``pushFilters`` keeps the filters it can evaluate exactly on ``self``,
    `partitions` plans with them (with the ``where`` option's) and puts them into every
    partition, and `read` applies only what its partition carries. Accepted filters are not
    returned, so Spark does not evaluate them again: each must be exact
    (`persistshard.core.read.filters.bind`).
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.pushed: tuple[Pred, ...] = ()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        state = read_state(self.opts.address.open())
        if state.schema is None:
            return filters  # partitions() reports the missing shard
        visible = output_schema(state.schema, self.schema)
        accepted: list[Pred] = []
        rejected: list[Filter] = []
        for f in filters:
            pred = translate_filter(f, visible)
            if pred is None:
                rejected.append(f)
            else:
                accepted.append(pred)
        self.pushed = tuple(accepted)
        return rejected

    def filters(
        self, stored: pa.Schema, columns: Sequence[str] | None = None
    ) -> tuple[Pred | None, Pred | None]:
        row, result = super().filters(stored, columns)
        if not self.pushed:
            return row, result
        rows, results = split_filter(
            Pred("and", children=self.pushed) if len(self.pushed) > 1 else self.pushed[0],
            set(stored.names),
        )
        return (
            conjunction([p for p in (row, rows) if p is not None]),
            conjunction([p for p in (result, results) if p is not None]),
        )
