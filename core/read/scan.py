"""Scans outside Spark: a lazy, streamed read of one pinned shard version for Python users.

A `Scan` is what `Shard.scan` (a snapshot) and `Shard.scan_updates` (a change read) return.
It holds a pinned `ShardState` and a `persistshard.core.read.plan.Query`; nothing is read until it
is consumed (`to_batches`, `to_arrow_batch_reader`, `to_arrow`, `to_pandas`, `to_polars`,
`to_duckdb`, or any consumer of the Arrow PyCapsule stream protocol, ``__arrow_c_stream__``:
DuckDB, Polars, ``pyarrow.table``). Every consumption re-reads the same pinned version, so a
scan can be consumed many times (DuckDB opens the stream once per query) and always answers
the same. What it relies on: the pinned version's parts are still on storage, which gc
guarantees only for its retention (an hour by default) after a newer version replaced them.
A scan consumed later than that may meet a part gc collected, at any point of the stream:
it then raises `VersionCollected` (a `StateConflict`: read again with a new scan) naming the
part, while a part the newest version still names that is missing stays `CorruptData`
(`persistshard.core.read.race`; a reader hold keeps since, not replaced parts).

What always holds:
- The answer is the one `Shard.snapshot` / `Shard.updates` give for the same times, restricted
  to ``filter`` and projected to ``columns``: the reads share `persistshard.core.read.plan`
  (planning, statistics skipping, consolidation), which the Spark reader uses too.
- A snapshot without ``with_diff`` repeats each row by its count (a multiset, as Spark's read
  does); a projected snapshot is the projection of that multiset. With ``with_diff`` (and in
  change reads) there is one row per distinct *projected* row (per projected row and time),
  its diffs summed: projection commutes with summing diffs.
- Filters are exact. A `persistshard.core.read.filters.Pred` is applied to updates before
  consolidation and drives chunk skipping, as Spark pushdown does. A pyarrow compute
  expression is evaluated by Arrow on every update that could pass (before consolidation when
  it reads only row columns, on the answer when it reads ``_time`` or ``_diff``); the parts
  of it that `persistshard.core.read.filters.bind` accepts also skip chunks by their statistics.
  An expression is read through its Substrait serialization
  (`persistshard.core.read.expression`); what it cannot translate skips nothing (slower,
  never wrong).

Memory (the ``scan_*`` knobs of the shard's configuration, `persistshard.core.config`).
`to_batches` plans the read in tasks of about ``scan_task_bytes`` of stored parts,
split by key range (`persistshard.core.read.plan.plan_read`); a snapshot of parts that need
no cross-chunk consolidation streams chunk by chunk (`persistshard.core.read.plan.chunk_jobs`),
any other task is read whole, and a scan holds at most ``scan_ahead`` + 1 such pieces. Large
local parts are memory-mapped; the pages a scan touched are given back each time it has read
``scan_release_bytes`` of stored parts. What it does
not bound: a task is never split inside one key value of the first row column (a shard whose
rows mostly share one first-column value reads as one task). A ``with_diff`` snapshot or a
change read projected *without* the first row column must consolidate across tasks: their
answers go through a `persistshard.core.write.correction.Correction` with a budget of
``scan_merge_budget``, which spills sorted runs to local files beyond it and merges them back
a bounded slice at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import ShardConfig
from persistshard.core.read.expression import ExpressionFilter, expression_filter
from persistshard.core.read.filters import Pred, evaluate
from persistshard.core.read.plan import (
    Job,
    MappedReaders,
    Query,
    Readers,
    ReadTask,
    chunk_jobs,
    expand_rows,
    iter_task,
    plan_read,
    read_task,
    run_ahead,
    with_snapshot_time,
)
from persistshard.core.read.race import Newest, pinned_read
from persistshard.core.rows import DIFF, TIME
from persistshard.core.statemachine.state import ShardState
from persistshard.core.write.correction import Correction
from persistshard.core.write.validate import update_schema
from persistshard.errors import InvalidOption, import_extra

log = logging.getLogger("persistshard.core.read.scan")

if TYPE_CHECKING:
    from persistshard.core.storage.blob import Blob

__all__ = ["Scan", "expression_filter"]

#: Most tasks a scan is split into.
SCAN_MAX_TASKS = 1 << 16


def _stored_bytes(task: ReadTask, readers: Readers) -> int:
    """The stored bytes of the parts' chunks ``task`` reads (whole parts where it names no
    chunks; its footers are in ``readers``)."""
    total = 0
    for s in task.slices:
        reader = readers.get(s.ref.key)
        if s.chunks is None or reader is None:
            total += s.ref.size
        else:
            total += sum(reader.chunks[c].length for c in s.chunks)
    return total


# --- the scan ------------------------------------------------------------------------------


def _checked_columns(
    columns: Sequence[str] | None, row_names: list[str], location: str
) -> tuple[str, ...] | None:
    """``columns`` as a tuple, after checking they are distinct row columns (`InvalidOption`
    naming the argument otherwise)."""
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
        raise InvalidOption(
            f"columns must be a list of column names, not {type(columns).__name__} "
            f"{columns!r}; write for example columns=[{row_names[0] if row_names else 'id'!r}]",
            location=location,
        )
    not_names = [c for c in columns if not isinstance(c, str)]
    if not_names:
        raise InvalidOption(
            f"columns {list(columns)}: {not_names} are not column names (strings); "
            f"choose among {row_names}",
            location=location,
        )
    unknown = [c for c in columns if c not in row_names]
    if unknown:
        raise InvalidOption(
            f"columns {list(columns)}: {unknown} are not columns of the shard (its columns: "
            f"{row_names}); choose among them",
            location=location,
        )
    if len(set(columns)) != len(columns):
        repeated = sorted({c for c in columns if list(columns).count(c) > 1})
        raise InvalidOption(
            f"columns {list(columns)} name {repeated} more than once; name each column once",
            location=location,
        )
    return tuple(columns)


def _check_pred(pred: Pred, stored: pa.Schema, row_names: list[str], location: str) -> None:
    """`InvalidOption` unless ``pred`` reads only row columns and Arrow can evaluate it on
    their types (checked on an empty table, so a wrong type fails now, not mid-read)."""
    missing = pred.columns() - set(row_names)
    if missing:
        raise InvalidOption(
            f"filter {pred} names columns {sorted(missing)} that the shard does not have "
            f"(its row columns: {row_names}); filter on those",
            location=location,
        )
    try:
        evaluate(pa.schema([stored.field(n) for n in row_names]).empty_table(), pred)
    except (pa.ArrowException, TypeError, ValueError, KeyError, IndexError) as e:
        raise InvalidOption(
            f"filter {pred} cannot be evaluated on the shard's columns "
            f"({_described(stored, pred.columns())}): {e}; compare each column with a value "
            "of its type",
            location=location,
        ) from e


def _check_expression(expr: pc.Expression, schema: pa.Schema, location: str) -> None:
    """`InvalidOption` unless Arrow can evaluate ``expr`` as a filter over ``schema`` (run on
    an empty table: an unknown column, a literal of the wrong type or a non-boolean
    expression fails here, naming the argument, instead of in the middle of a read)."""
    try:
        schema.empty_table().filter(expr)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise InvalidOption(
            f"filter {expr} cannot be evaluated on this scan's columns "
            f"({_described(schema, set(schema.names))}): {e}; filter with a boolean "
            "expression comparing columns with values of their types",
            location=location,
        ) from e


def _described(schema: pa.Schema, names: set[str]) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema if f.name in names) or "none"


class Scan:
    """A lazy read of a pinned shard version (module docstring). Build with `Shard.scan` or
    `Shard.scan_updates`. A snapshot at a time below 0 (nothing sealed yet) or an empty
    range of updates reads nothing."""

    def __init__(
        self,
        blob: Blob,
        location: str,
        state: ShardState,
        query: Query,
        *,
        columns: Sequence[str] | None = None,
        filter: Pred | pc.Expression | None = None,
        config: ShardConfig | None = None,
        newest: Newest | None = None,
    ) -> None:
        self._blob = blob
        self.location = location
        self._state = state
        #: Reads the shard's newest state: tells a part gc collected from a damaged shard
        #: (`persistshard.core.read.race`); None: every missing part is `CorruptData`.
        self._newest = newest
        self.query = query
        #: The shard's configuration: the ``scan_*`` knobs bound this scan's memory.
        self.config = config if config is not None else ShardConfig()
        stored = update_schema(state.schema if state.schema is not None else pa.schema([]))
        self._stored = stored
        row_names = stored.names[:-2]
        self._columns = _checked_columns(columns, row_names, location)
        kept = list(self._columns) if self._columns is not None else row_names
        mode = query.mode
        with_diff = query.with_diff or mode == "updates"
        extra = ([TIME] if mode == "updates" else []) + ([DIFF] if with_diff else [])
        self.schema = pa.schema([stored.field(n) for n in [*kept, *extra]])
        self._row_filter: Pred | None = None
        self._expression: ExpressionFilter | None = None
        self._pushed_expression = False
        if isinstance(filter, Pred):
            _check_pred(filter, stored, row_names, location)
            self._row_filter = filter
        elif isinstance(filter, pc.Expression):
            ef = expression_filter(filter, stored)
            self._expression = ef
            if ef.columns is not None and ef.columns <= set(row_names):
                self._pushed_expression = True
                self._row_filter = ef.skip
                _check_expression(filter, pa.schema([stored.field(n) for n in row_names]), location)
            elif ef.columns is not None and not ef.columns <= set(self.schema.names):
                raise InvalidOption(
                    f"filter {filter} reads {sorted(ef.columns - set(self.schema.names))}, "
                    "which are neither row columns of the shard nor columns of this scan's "
                    f"answer ({self.schema.names}); filter on those columns",
                    location=location,
                )
            elif ef.columns is None and self._columns is not None:
                raise InvalidOption(
                    f"filter {filter}: the columns it reads could not be told from the "
                    "expression, so it cannot run before the projection "
                    f"{list(self._columns)}; scan without columns, or filter with plain "
                    "column references",
                    location=location,
                )
            else:
                _check_expression(filter, self.schema, location)
        elif filter is not None:
            raise InvalidOption(
                "filter must be a pyarrow.compute.Expression or a persistshard Pred, not "
                f"{type(filter).__name__} {filter!r}; write for example "
                "filter=pyarrow.compute.field('id') > 3",
                location=location,
            )

    def __repr__(self) -> str:
        return f"Scan({self.location}, {self.query}, columns={self.schema.names})"

    # --- planning ---------------------------------------------------------------------

    def tasks(self, readers: Readers | None = None) -> list[ReadTask]:
        """The read tasks of this scan (footers are read when the read splits or filters;
        the readers opened are kept in ``readers`` for the tasks to reuse)."""
        q = self.query
        if self._state.schema is None or q.max_time < 0 or (q.mode == "updates" and q.lo == q.hi):
            return []
        tasks = plan_read(
            self._blob,
            self._state,
            self.query,
            partition_bytes=self.config.scan_task_bytes,
            min_task_bytes=self.config.min_task_bytes,
            max_partitions=SCAN_MAX_TASKS,
            row_filter=self._row_filter,
            readers=readers,
            multiset=self._multiset,
        )
        log.debug("%r: %d read tasks", self, len(tasks))
        ef = self._expression
        pushed = self._pushed_expression and ef is not None and not ef.exact
        extra: tuple[str, ...] = ()
        if pushed and ef is not None and ef.columns is not None:
            extra = tuple(sorted(ef.columns))
        return [
            dataclasses.replace(
                t,
                columns=self._columns,
                row_expression=ef.expression if pushed and ef is not None else None,
                expression_columns=extra,
            )
            for t in tasks
        ]

    @property
    def _multiset(self) -> bool:
        """Whether the answer repeats each row by its count (a snapshot without ``_diff``):
        tasks then never consolidate across one another's updates when diffs are positive."""
        return self.query.mode == "snapshot" and not self.query.with_diff

    def _merges_across_tasks(self, tasks: list[ReadTask]) -> bool:
        """Whether tasks' answers must be consolidated together: one row per distinct
        projected row is asked for and the projection drops the column tasks split on."""
        if len(tasks) < 2 or self._columns is None or self._multiset:
            return False
        split = tasks[0].key_range
        return split is not None and split.column not in self._columns

    # --- consuming --------------------------------------------------------------------

    def _pieces(self) -> Iterator[pa.Table]:
        """`_read_pieces`, where a part gc collected under the pinned version, met at any
        point of the stream, is `VersionCollected` (`persistshard.core.read.race`)."""
        with pinned_read(self._state.version, self._newest, self.location):
            yield from self._read_pieces()

    def _read_pieces(self) -> Iterator[pa.Table]:
        """The answer in consolidated pieces, shaped (`_shape`), in task order: a piece per
        chunk of a task that streams (`chunk_jobs`), the whole answer of one that does not,
        computed a few pieces ahead of the consumer (`run_ahead`)."""
        # Each part's footer is parsed once per consumption; large local parts are mapped.
        readers = MappedReaders(self.config.map_min_bytes)
        tasks = self.tasks(readers)
        if not tasks:
            return
        if self._merges_across_tasks(tasks):
            for piece in self._merged(tasks, readers):
                yield self._shape(piece)
            return
        multiset = self._multiset
        jobs: list[Job[pa.Table]] = []
        ends: dict[int, int] = {}  # the job that ends a task -> the task's stored bytes
        for task in tasks:
            pieces = chunk_jobs(
                self._blob, task, as_multiset=multiset, readers=readers, omit_unit_diffs=True
            )
            if pieces is None:
                pieces = [functools.partial(self._whole, task, readers)]
            if pieces:  # (a task whose chunks the statistics all skip has none: reads nothing)
                jobs.extend(functools.partial(self._shaped, piece) for piece in pieces)
                ends[len(jobs) - 1] = _stored_bytes(task, readers)
        read = 0  # stored bytes read since the mapped parts' pages were last given back
        for i, piece in enumerate(run_ahead(jobs, self.config.scan_ahead)):
            if piece.num_rows:
                yield piece
            read += ends.get(i, 0)
            if read >= self.config.scan_release_bytes:
                # The resident set holds the pages of about this much of the parts, not of
                # every part read (giving them back costs a system call per mapping).
                readers.release()
                read = 0

    def _whole(self, task: ReadTask, readers: Readers, in_thread: bool) -> pa.Table:
        """The answer of a task that does not stream, read whole (`read_task`)."""
        return read_task(self._blob, task, as_multiset=self._multiset, readers=readers)

    def _shaped(self, piece: Job[pa.Table], in_thread: bool) -> pa.Table:
        return self._shape(piece(in_thread))

    def _merged(self, tasks: list[ReadTask], readers: Readers) -> Iterator[pa.Table]:
        """The tasks' answers consolidated together, through a `Correction` of
        ``scan_merge_budget`` bytes that spills sorted runs to local files beyond it (a
        snapshot's pieces enter at time 0). Sorted by (time, row)."""
        q = self.query
        schema = tasks[0].output_schema()
        buffer = Correction(schema, budget_bytes=self.config.scan_merge_budget)
        try:
            for task in tasks:
                for piece in iter_task(self._blob, task, readers=readers):
                    if q.mode == "snapshot":
                        piece = with_snapshot_time(piece, Query("snapshot", as_of=0))
                    buffer.insert(piece.select(schema.names))
            upper = 1 if q.mode == "snapshot" else q.hi
            for batch in buffer.updates_before(upper):
                table = pa.Table.from_batches([batch])
                yield table.drop_columns([TIME]) if q.mode == "snapshot" else table
        finally:
            buffer.close()

    def _shape(self, table: pa.Table) -> pa.Table:
        """A piece of the answer as the user sees it: rows repeated by their counts (a
        snapshot without ``with_diff``), an expression that could not run before
        consolidation applied to the answer's columns (after the repeat, so it never sees an
        unconsolidated ``_diff``), the answer's columns in the order asked."""
        q = self.query
        ef = self._expression
        if q.mode == "snapshot" and not q.with_diff and DIFF in table.column_names:
            table = expand_rows(table, self.location, q.as_of)  # (no _diff: every count is 1)
        if ef is not None and not self._pushed_expression and table.num_rows:
            table = table.filter(ef.expression)
        table = table.select(self.schema.names)
        if table.schema != self.schema:
            table = table.cast(self.schema)
        return table

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The answer as record batches, read task by task (module docstring: Memory)."""
        for table in self._pieces():
            yield from table.to_batches()

    def to_arrow_batch_reader(self) -> pa.RecordBatchReader:
        """The answer as a `pyarrow.RecordBatchReader` (streamed like `to_batches`)."""
        return pa.RecordBatchReader.from_batches(self.schema, self.to_batches())

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream protocol: a fresh stream of the answer per call."""
        return self.to_arrow_batch_reader().__arrow_c_stream__(requested_schema)

    def to_arrow(self) -> pa.Table:
        """The whole answer as one `pyarrow.Table`."""
        return pa.Table.from_batches(list(self.to_batches()), schema=self.schema)

    def to_pandas(self, **kwargs: Any) -> Any:
        """The whole answer as a pandas DataFrame (``kwargs`` go to `pyarrow.Table.to_pandas`);
        needs the ``pandas`` extra."""
        return self.to_arrow().to_pandas(**kwargs)

    def to_polars(self) -> Any:
        """The whole answer as a polars DataFrame; needs the ``polars`` extra."""
        polars = import_extra("polars", "polars", "Scan.to_polars")
        return polars.from_arrow(self.to_arrow())

    def to_duckdb(self, con: Any = None, name: str = "scan") -> Any:
        """Register this scan in DuckDB connection ``con`` (default: a new in-memory one) as
        the view ``name`` and return its relation. Every query on it streams the pinned
        version again; needs the ``duckdb`` extra."""
        if con is None:
            con = import_extra("duckdb", "duckdb", "Scan.to_duckdb").connect()
        con.register(name, self)
        return con.table(name)
