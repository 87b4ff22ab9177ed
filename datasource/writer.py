"""Spark batch and streaming writes: mint on the driver, write in every task, append once.

The protocol, after Materialize's persist sink:
1. *Mint* (driver, in ``writer()``): read the shard state and fix the batch description:
   ``lower`` (the upper seen now, or ``expected_upper``), the new upper if the user gave one,
   the shard's columns (matched to the DataFrame's by name; widened by ``merge_schema`` or a
   SQL table's ``ALTER TABLE ... ADD COLUMNS``), and a fresh write id. It reaches the tasks
   inside the pickled writer. Everything checkable without the data (location, options,
   columns, column types) is refused here, so the user sees one error, not a failed task.
2. *Write* (every task): gather the task's Arrow batches, sort and consolidate them once
   (bounded by ``memory_budget``: a larger input is sorted externally, `ExternalSort`, its
   sorted runs spilled to local files and merged), then write sorted, consolidated parts under
   ``parts/<write id>/``: updates below the new upper as sealed parts, the rest as unsealed.
   The message back is the parts' metadata (a "hollow batch").
3. *Append* (driver, in ``commit()``): the tasks' parts are checked (`WriteTransaction.check`:
   each present with its reported size, its times inside the batch; one listing per write
   directory), then one compare-and-append of every task's parts. If it is refused
   (`UpperMismatch`, bad input), nothing becomes visible and the write's parts are deleted
   (a failed check deletes nothing: `CorruptData` or `InvalidUpdates`, nothing applied). A
   *plain* write (no time column, ``upper`` or ``expected_upper``) is committed with
   ``rebase``: if the upper moved since step 1 it lands at the new upper, its parts read
   at that time (`persistshard.core.statemachine.commits.append`), instead of failing.
   Parts of failed task attempts (Spark has no per-task abort) carry the write id and are
   swept at commit and abort, and by ``gc`` if the driver died.

Invariant: the shard changes only in step 3, atomically; a failed job leaves it as it was.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from persistshard.core.rows import DIFF, TIME, consolidation_indices, row_columns
from persistshard.core.shard import Shard, ShardAddress, WrittenUpdates, write_transaction
from persistshard.core.statemachine.retention import RetentionChange
from persistshard.core.statemachine.state import PartRef
from persistshard.core.storage import layout, metrics
from persistshard.core.storage.parts import PutsBehind
from persistshard.core.write.external import ExternalSort, distinct_ascending
from persistshard.core.write.transaction import WriteTransaction
from persistshard.core.write.validate import (
    evolve_schema,
    match_columns,
    normalize_updates,
    update_schema,
    user_schema,
)
from persistshard.datasource.options import (
    WriteOptions,
    storage_errors,
)
from persistshard.datasource.types import arrow_schema_of
from persistshard.errors import InvalidOption, InvalidUpdates, UpperMismatch

log = logging.getLogger("persistshard.datasource.writer")

#: Largest time a shard can hold; "no upper given" writes everything as sealed below it.
MAX_TIME = (1 << 63) - 2


@dataclass
class TaskWritten(WriterCommitMessage):
    """What one task wrote: its parts and the largest time among them."""

    sealed: list[PartRef] = field(default_factory=list)
    unsealed: list[PartRef] = field(default_factory=list)
    max_time: int | None = None
    rows_in: int = 0
    #: Store requests the task made (`persistshard.core.storage.metrics`); the driver's
    #: commit adds them to its entry's metrics.
    store_requests: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class BatchDescription:
    """The minted description every task of one write shares.

    ``target`` is the shard's schema after this write (its current columns, plus new ones
    under schema evolution); ``sources`` names, for each target column, the DataFrame column
    that feeds it (matched by name, in any order, case-insensitively). ``plain`` writes have
    no explicit times or frontiers: their commit lands at whatever the upper is by then.
    """

    location: str
    write_id: str
    lower: int
    upper: int | None
    shard_schema: pa.Schema | None
    incoming: pa.Schema
    time_column: str | None
    diff_column: str | None
    overwrite: bool
    memory_budget: int
    address: ShardAddress = field(repr=False)  # its storage options may hold credentials
    target: pa.Schema | None = None
    sources: tuple[str, ...] = ()
    plain: bool = False
    #: Option ``retention``, set by the write's own commit (None: the option was not given).
    retention: RetentionChange | None = None


def find_column(names: list[str], wanted: str | None) -> str | None:
    """The DataFrame column called ``wanted`` (exact, else the one equal but for case)."""
    if wanted is None:
        return None
    if wanted in names:
        return wanted
    folded = [n for n in names if n.lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


def describe_write(
    opts: WriteOptions,
    spark_schema: StructType,
    overwrite: bool,
    shard: Shard,
    *,
    evolve: bool = False,
) -> BatchDescription:
    """Mint: validate the DataFrame's columns against the shard and fix the description.

    ``evolve`` (a SQL table whose catalog gained columns by ``ALTER TABLE ... ADD COLUMNS``, or
    option ``merge_schema``) lets the write add nullable columns to the shard.
    """
    state = shard.inspect.state()
    txn = write_transaction(shard)  # mints the write id every task writes under
    if state.version == 0:
        txn.refuse_foreign_files()
    arrow = arrow_schema_of(spark_schema)
    names = arrow.names
    time_column = find_column(names, opts.time_column) or find_column(names, TIME)
    diff_column = find_column(names, opts.diff_column) or find_column(names, DIFF)
    for option, column in (("time_column", opts.time_column), ("diff_column", opts.diff_column)):
        if column is not None and find_column(names, column) is None:
            raise InvalidOption(
                f"option {option} names column {column!r}, which the DataFrame does not have "
                f"(columns: {', '.join(names)})",
                location=shard.location,
            )
    for column in (time_column, diff_column):
        if column is not None and not pa.types.is_integer(arrow.field(column).type):
            raise InvalidUpdates(
                f"column {column} must hold integers (BIGINT), got {arrow.field(column).type}",
                location=shard.location,
            )
    if overwrite and time_column is not None:
        raise InvalidUpdates(
            "mode('overwrite') writes the DataFrame as the table's contents at the new time; "
            f"it takes no time column (found {time_column!r}); drop it or use append",
            location=shard.location,
        )
    lower = state.upper if opts.expected_upper is None else opts.expected_upper
    if opts.upper is not None and opts.upper < lower:
        raise InvalidOption(
            f"option upper {opts.upper} is below the write's lower {lower}", location=shard.location
        )
    fields = [
        pa.field(f.name, f.type, f.nullable)
        for f in arrow
        if f.name not in (time_column, diff_column)
    ]
    incoming = user_schema(pa.schema(fields))
    if state.schema is None:
        target, sources = incoming, incoming.names
    else:
        target = state.schema
        if evolve:
            target = evolve_schema(state.schema, incoming, shard.location)
        sources = match_columns(incoming, target, shard.location)
    return BatchDescription(
        location=shard.location,
        write_id=txn.write_id,
        lower=lower,
        upper=opts.upper,
        shard_schema=state.schema,
        incoming=incoming,
        time_column=time_column,
        diff_column=diff_column,
        overwrite=overwrite,
        memory_budget=opts.memory_budget,
        address=shard.address,
        target=target,
        sources=tuple(sources),
        plain=opts.plain and time_column is None and not overwrite,
        retention=retention_change(opts.retention, shard.location),
    )


def as_updates(batch: pa.RecordBatch, d: BatchDescription, time: int) -> pa.Table:
    """A Spark batch as updates: the target's columns (by name), ``_time`` and ``_diff``."""
    table = pa.Table.from_batches([batch])
    n = table.num_rows
    target = d.target if d.target is not None else d.incoming
    sources = d.sources or tuple(target.names)
    columns = [table.column(name) for name in sources]
    names = list(target.names)
    if d.time_column is not None:
        columns.append(table.column(d.time_column))
    else:
        columns.append(pa.array(np.full(n, time, dtype=np.int64)))
    if d.diff_column is not None:
        columns.append(table.column(d.diff_column))
    else:
        columns.append(pa.array(np.ones(n, dtype=np.int64)))
    return pa.Table.from_arrays(columns, names=[*names, TIME, DIFF])


def _check_case(d: BatchDescription) -> None:
    """Under ``spark.sql.caseSensitive=true`` columns must match the shard's exactly.

    Spark keeps that setting from the Python process that plans a write; it reaches only the
    tasks (as a local property, when the session set it), so this one check runs there.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or (ctx.getLocalProperty("spark.sql.caseSensitive") or "").lower() != "true":
        return
    target = d.target if d.target is not None else d.incoming
    differ = [f"{s} (shard: {t})" for s, t in zip(d.sources, target.names, strict=False) if s != t]
    if differ:
        raise InvalidUpdates(
            f"spark.sql.caseSensitive is true and columns {', '.join(differ)} differ from the "
            "shard's in case; rename them",
            location=d.location,
        )


def check_location(shard: Shard) -> None:
    """Refuse, on the driver, a location that is an existing file (not a directory or prefix):
    otherwise every task would fail on it with a raw ``NotADirectoryError``."""
    write_transaction(shard).refuse_file_location()


def write_task(d: BatchDescription, batches: Any, time: int) -> TaskWritten:
    """Step 2: sort and consolidate one task's batches and write its parts."""
    _check_case(d)
    with storage_errors(d.location, "write the shard"), metrics.operation("write task") as op:
        shard = d.address.open()
        # A task still running late in the write's lease renews it (core/statemachine/leases.py).
        with write_transaction(shard, d.write_id) as txn:
            written = _write_task(d, batches, time, txn)
        written.store_requests = op.requests
        return written


def _write_task(d: BatchDescription, batches: Any, time: int, txn: WriteTransaction) -> TaskWritten:
    schema = d.target if d.target is not None else (d.shard_schema or d.incoming)
    full = update_schema(schema)
    upper = d.upper if d.upper is not None else MAX_TIME
    max_time: int | None = None
    rows_in = 0
    # The task's memory: the input gathered up to a third of the budget (beyond that, sorted
    # runs of that size spill to local files and are merged at the end; a sort needs a
    # transient copy of about as much again) plus one part being gathered and encoded
    # (2 x 1/12). Measured peak: about the budget, whatever the input
    # (tests/test_writer_memory.py).
    part_bytes = max(1 << 20, min(d.memory_budget // 12, d.address.config.part_bytes))
    run_bytes = max(1 << 20, d.memory_budget // 3)
    # A task reads its input once and then writes it out: while the input fits in its share
    # of the budget it is only gathered, then sorted and consolidated once
    # (`write_gathered`); a larger input is sorted externally (`ExternalSort`: sorted runs
    # spilled to local files, merged into the parts).
    gathered: list[pa.Table] = []
    gathered_bytes = 0
    sorter: ExternalSort | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rows_in += batch.num_rows
            table = normalize_updates(
                as_updates(batch, d, time), lower=d.lower, schema=schema, location=d.location
            )
            biggest = pc.max(table.column(TIME)).as_py()
            max_time = biggest if max_time is None else max(max_time, biggest)
            if sorter is not None:
                sorter.insert(table)
                continue
            gathered.append(table)
            gathered_bytes += table.nbytes
            if gathered_bytes > run_bytes:
                sorter = _external_sort(full, run_bytes)
                for piece in gathered:
                    sorter.insert(piece)
                gathered = []
        if sorter is None:
            sealed_parts, unsealed_parts = write_gathered(txn, gathered, full, upper, part_bytes)
        else:
            sink = _OrderedParts(txn, full, upper, part_bytes)
            with sink.puts:  # every part stored on leaving; on a failure, the puts ended
                for out in sorter.sorted():
                    sink.add(out)
                sealed_parts, unsealed_parts = sink.flush()
        written = TaskWritten(sealed_parts, unsealed_parts, max_time, rows_in)
    finally:
        if sorter is not None:
            sorter.close()
    _fault_point("after_write")
    return written


def _external_sort(full: pa.Schema, run_bytes: int) -> ExternalSort:
    return ExternalSort(
        full, run_bytes=run_bytes, spill_dir=os.environ.get("PERSISTSHARD_SPILL_DIR")
    )


class _OrderedParts:
    """Cuts a stream of updates in (row, time) order, consolidated as a whole, into sealed
    parts (times below ``upper``) and unsealed parts (the rest) of about ``part_bytes``
    each. Each of the two sequences is a slice of the stream, so it is one sorted,
    consolidated chain, cut anywhere. Memory: one part's worth per sequence."""

    def __init__(self, txn: WriteTransaction, full: pa.Schema, upper: int, part_bytes: int) -> None:
        self._txn = txn
        self._full = full
        self._upper = upper
        self._part_bytes = part_bytes
        self._pending: dict[bool, list[pa.Table]] = {True: [], False: []}
        self._bytes = {True: 0, False: 0}
        self._parts: dict[bool, list[PartRef]] = {True: [], False: []}
        #: Puts the parts behind the encoder; the caller holds it open over the whole write.
        self.puts = txn.puts()

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        times = table.column(TIME)
        if pc.max(times).as_py() < self._upper:
            self._gather(True, table)
        elif pc.min(times).as_py() >= self._upper:
            self._gather(False, table)
        else:
            below = pc.less(times, self._upper)
            self._gather(True, table.filter(below))
            self._gather(False, table.filter(pc.invert(below)))

    def _gather(self, sealed: bool, table: pa.Table) -> None:
        row_bytes = max(1, table.nbytes // max(1, table.num_rows))
        start = 0
        while start < table.num_rows:
            room = max(1, (self._part_bytes - self._bytes[sealed]) // row_bytes)
            piece = table.slice(start, room)
            start += piece.num_rows
            self._pending[sealed].append(piece)
            self._bytes[sealed] += piece.num_rows * row_bytes
            if self._bytes[sealed] >= self._part_bytes:
                self._flush(sealed)

    def _flush(self, sealed: bool) -> None:
        pending = self._pending[sealed]
        if not pending:
            return
        table = pa.concat_tables(pending).combine_chunks()
        self._pending[sealed], self._bytes[sealed] = [], 0
        self._parts[sealed].append(self._txn.write_part(table, puts=self.puts))

    def flush(self) -> tuple[list[PartRef], list[PartRef]]:
        """Write the last parts; the sealed and unsealed parts (stored once `puts` closes)."""
        self._flush(True)
        self._flush(False)
        return self._parts[True], self._parts[False]


def write_gathered(
    txn: WriteTransaction,
    tables: list[pa.Table],
    full: pa.Schema,
    upper: int,
    part_bytes: int,
) -> tuple[list[PartRef], list[PartRef]]:
    """Write a task's whole input (``tables``, normalized updates; emptied here) as sealed
    parts (times below ``upper``) and unsealed parts (the rest): one sort and consolidation
    in (row, time) order, then parts of about ``part_bytes`` each, taken slice by slice so
    only one part's rows are copied at a time. The same parts `ExternalSort` would give."""
    if not tables:
        return [], []
    table = pa.concat_tables(tables)
    tables.clear()
    if not table.schema.equals(full):
        table = table.select(full.names).cast(full)
    if table.num_columns and table.column(0).num_chunks > 1:
        table = table.combine_chunks()  # Arrow's gather is much slower across many chunks
    columns = row_columns(full)
    if distinct_ascending(table, columns[0]):
        # Rows already in (row, time) order and pairwise distinct (a sorted source, such as
        # a range): nothing to sort or consolidate (diffs were checked non-zero).
        indices = np.arange(table.num_rows, dtype=np.int64)
        sums = np.asarray(table.column(DIFF).to_numpy(), dtype=np.int64)
    else:
        indices, sums = consolidation_indices(table, columns)
    times = table.column(TIME).to_numpy()[indices]
    rows_per_part = max(1, int(part_bytes // max(1.0, table.nbytes / max(1, table.num_rows))))
    diff_index = full.get_field_index(DIFF)

    def parts(keep: np.ndarray, puts: PutsBehind) -> list[PartRef]:
        idx, diffs = indices[keep], sums[keep]
        out = []
        for start in range(0, len(idx), rows_per_part):
            piece = table.take(pa.array(idx[start : start + rows_per_part]))
            piece = piece.set_column(
                diff_index,
                full.field(diff_index),
                pa.array(diffs[start : start + rows_per_part], pa.int64()),
            )
            out.append(txn.write_part(piece, puts=puts, inline=True))
        return out

    below = times < upper
    with txn.puts() as puts:  # a part's sync overlaps the next one's encoding
        return parts(below, puts), parts(~below, puts)


#: Spark local property that makes a write task's first attempt fail at a named point (for
#: tests of retried tasks: set with ``sparkContext.setLocalProperty(FAULT_PROPERTY, point)``).
FAULT_PROPERTY = "persistshard.fault.first_attempt"


def _fault_point(name: str) -> None:
    """Fail here if this task's first attempt was asked to (see `FAULT_PROPERTY`)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        if ctx.getLocalProperty(FAULT_PROPERTY) == name:
            raise RuntimeError(f"injected failure at {name} (first attempt of this task)")


def tasks_saw_other_uppers(lowers: set[int], upper: int, location: str) -> UpperMismatch:
    """The refusal of a write whose tasks started at different uppers of the shard (``lowers``;
    ``upper``: the shard's now): another writer committed while they ran, a lost race like any
    other (`UpperMismatch`, expected the oldest upper a task saw), never bad input. The caller
    sweeps the write's parts: nothing of it is applied."""
    expected = min(lowers)
    actual = max(upper, *lowers)
    return UpperMismatch(
        expected,
        actual,
        location=location,
        message=f"expected upper {expected}, shard upper is {actual}: the write's tasks saw "
        f"the uppers {', '.join(map(str, sorted(lowers)))}, so another writer committed while "
        "they ran; nothing of this write was applied, write it again",
    )


def sweep_write(shard: Shard, write_id: str, keep: set[str]) -> int:
    """Delete every part of ``write_id`` not in ``keep`` (failed attempts); return how many
    (`persistshard.core.write.transaction.WriteTransaction.sweep`)."""
    return write_transaction(shard, write_id).sweep_write(write_id, keep)


def commit_write(
    d: BatchDescription,
    messages: list[Any],
    *,
    writer: tuple[str, int] | None = None,
    compact: bool = True,
    maintenance: bool = True,
) -> None:
    """Step 3: one compare-and-append of every task's parts (see the module docstring),
    then (``maintenance``) the bounded after-commit maintenance of
    `persistshard.core.maintenance.auto`, its merges only when ``compact``."""
    shard = d.address.open(maintenance=maintenance)
    txn = write_transaction(shard, d.write_id)
    with txn, metrics.operation("spark write") as op:
        minted = layout.id_time_ms(d.write_id)
        if minted is not None:  # the write began when the driver minted it, tasks and all
            op.began_ago((layout.now_ms() - minted) / 1000)
        for m in messages:  # the tasks' reports go into the commit's metrics
            op.add("rows_in", getattr(m, "rows_in", 0) if m is not None else 0)
            op.add("task_store_requests", getattr(m, "store_requests", 0) if m is not None else 0)
        _commit_write(txn, d, messages, writer)
    log.debug("%s: write %s committed from %d task reports", d.location, d.write_id, len(messages))
    txn.maintain(compact=compact)


def retention_change(
    wanted: tuple[int | None, int | None] | None, location: str
) -> RetentionChange | None:
    """Option ``retention``'s ``(seconds, versions)``
    (`persistshard.datasource.options.parse_retention`) as the change a write's commit makes
    with its data (`WriteTransaction.commit`); None when the option was not given. An invalid
    one is `InvalidOption` here, when the write is minted, before anything is written."""
    if wanted is None:
        return None
    from persistshard.core.shard import retention_of

    return RetentionChange(retention_of(wanted[0], wanted[1], location))


def apply_retention(shard: Shard, wanted: tuple[int | None, int | None] | None) -> None:
    """Set the shard's retention to option ``retention``'s ``(seconds, versions)`` unless it
    already is, in a ``set_retention`` commit of its own: for a table created without a write
    (``CREATE TABLE ... OPTIONS (retention ...)``). A write sets it in its own commit instead
    (`BatchDescription.retention`)."""
    change = retention_change(wanted, shard.location)
    if wanted is not None and change is not None and change.to != shard.inspect.retention():
        shard.set_retention(seconds=wanted[0], versions=wanted[1])


def _commit_write(
    txn: WriteTransaction,
    d: BatchDescription,
    messages: list[Any],
    writer: tuple[str, int] | None,
) -> None:
    written = WrittenUpdates()
    max_time: int | None = None
    for m in messages:
        if m is None:
            continue
        written.sealed.extend(m.sealed)
        written.unsealed.extend(m.unsealed)
        if m.max_time is not None:
            max_time = m.max_time if max_time is None else max(max_time, m.max_time)
    try:
        if d.upper is not None:
            new_upper = d.upper
        elif max_time is not None:
            new_upper = max(max_time, d.lower) + 1
        else:
            new_upper = d.lower + 1
        # The tasks' parts came in messages: check them before anything reads or names them.
        txn.check(written, expected_upper=d.lower, new_upper=new_upper)
        state = txn.state()
        if d.overwrite:
            if state.upper != d.lower:
                raise UpperMismatch(d.lower, state.upper, location=txn.location)
            written = txn.self_correct(
                written,
                time=d.lower,
                write_id=d.write_id + "-delta",
                state=state,
                schema=d.target,
                # One task's parts are one sorted chain (every row at the lower, one time).
                runs=[list(m.sealed) for m in messages if m is not None and m.sealed],
                memory_budget=d.memory_budget,
            )
        schema = d.target if d.target is not None else (d.shard_schema or d.incoming)
        txn.commit(
            written,
            expected_upper=d.lower,
            new_upper=new_upper,
            schema=schema,
            commit_id=d.write_id,
            writer=writer,
            rebase=d.plain and writer is None,
            label="overwrite" if d.overwrite else None,
            retention=d.retention,
        )
    finally:
        txn.sweep_write(d.write_id, written.keys())
        if d.overwrite:
            txn.sweep_write(d.write_id + "-delta", written.keys())


@dataclass
class StreamTaskWritten(TaskWritten):
    """A streaming task's parts, with the lower it wrote at and its write id: the one report
    of every task that writes under its own write id (a micro-batch's, a reclocked write's,
    a staged upsert's); subclasses add what identifies or places the batch."""

    lower: int = 0
    write_id: str = ""

    @classmethod
    def of(cls, task: TaskWritten, *, lower: int, write_id: str, **extra: Any) -> Self:
        """``task``'s report (its parts, largest time and rows in) as written at ``lower``
        under ``write_id``, with a subclass's ``extra`` fields."""
        return cls(
            task.sealed,
            task.unsealed,
            task.max_time,
            task.rows_in,
            lower,
            write_id,
            **extra,
        )
