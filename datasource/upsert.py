"""Spark upsert writes by key: batch ``mode("append")`` and streaming writes with option
``key_columns`` (`persistshard.core.upsert` holds the semantics).

The protocol, a variant of the write protocol of `persistshard.datasource.writer`:
1. *Mint* (driver): the usual batch description (columns matched by name, a fresh write id),
   plus the upsert's options, all checked before any task runs: the key columns exist, have a
   type with exact equality and agree with the ones the shard recorded; the delete marker
   column exists and is boolean; options that make no sense for an upsert (``time_column``,
   ``upper``, ``remap``, ``mode("overwrite")``) are refused.
2. *Stage* (every task): the task's rows in normal form (user columns + ``_diff`` of +1 for
   an upsert, -1 for a delete), null keys and duplicate keys within the task refused, written
   sorted as *staged* parts under the write id. They are the incoming rows, not updates of
   the shard: no state ever references them.
3. *Apply* (driver, in ``commit``): read the staged rows, refuse a key staged by two tasks,
   look up the current rows of the incoming keys by chunk statistics, write desired minus
   current (consolidated in a Correction buffer) as parts at the shard's upper ``t`` and
   commit them with ``expected_upper = t``, ``new_upper = t + 1``. If another commit landed
   first, the delta is recomputed against the newer state (unless the user gave
   ``expected_upper``: then `UpperMismatch`). Staged parts are deleted whatever happens; delta
   parts of a refused commit are deleted too; parts left by a crashed driver are unreferenced
   and gc removes them.

Leases (`persistshard.core.statemachine.leases`): a staging task renews the write's lease while
it runs; the commit first checks that the staged writes' leases are live (else `LeaseExpired`:
gc may have swept staged rows, so nothing is read) and holds them, and the delta's own lease,
until its commit.

Exactly once. A streaming micro-batch commits with (writer id, batch id) and what identifies
the batch (the digest of its incoming rows and the query id, `persistshard.datasource.replay`);
the state records them. A replay of the recorded batch id by the same query or with the same
rows (after a crash between the tasks and the commit, or after the commit) is recognised
before the delta is computed, or by the commit itself if it raced, and writes nothing; a lower
batch id, or the recorded one with other rows from another query, is refused naming the
checkpoint (`persistshard.core.statemachine.state.judge_writer_batch`). A batch write inside
``foreachBatch`` gets the same with options ``writer_id`` and ``batch_id``.

Spark 4.3 refuses ``outputMode("update")`` for every Python data source before the source is
asked for a writer (``PythonWriteBuilder`` does not implement
``SupportsStreamingUpdateAsAppend``: "persistshard does not support Update mode"), so Python
cannot tell update from append mode. ``key_columns`` is the switch: a stream written in append
mode with ``key_columns`` upserts; without it, it appends. A streaming aggregation's update
output goes through ``foreachBatch`` (update mode is allowed there) with a batch upsert write.

Assumes: the incoming rows of one task fit in its memory (they are staged in one piece), and
the incoming rows of one write fit in the driver's memory together with the current rows of
their keys.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.types import BooleanType, StructType

from persistshard.core import upsert as up
from persistshard.core.rows import DIFF, TIME, consolidate
from persistshard.core.shard import WrittenUpdates, write_transaction
from persistshard.core.statemachine.state import WriterBatch, WriterVerdict, judge_writer_batch
from persistshard.core.write.transaction import WriteTransaction
from persistshard.core.write.validate import stored_columns, update_schema
from persistshard.datasource import replay
from persistshard.datasource.options import WriteOptions, storage_errors
from persistshard.datasource.replay import DigestedTask, Digesting, identity_of, task_query_id
from persistshard.datasource.writer import (
    BatchDescription,
    TaskWritten,
    as_updates,
    check_location,
    describe_write,
    find_column,
    sweep_write,
)
from persistshard.errors import InvalidOption, InvalidUpdates, UpperMismatch

log = logging.getLogger("persistshard.datasource.upsert")

#: How often a commit recomputes its delta after another commit came first.
COMMIT_RETRIES = 3


@dataclass(frozen=True)
class UpsertSpec:
    """An upsert write's own options: key columns (resolved to the shard's names), the delete
    marker column (its name in the DataFrame) and, for ``foreachBatch``, the batch id."""

    keys: tuple[str, ...]
    delete_column: str | None
    batch_id: int | None


def plan_upsert(
    options: dict[str, str], schema: StructType, overwrite: bool, *, streaming: bool
) -> tuple[WriteOptions, UpsertSpec, BatchDescription]:
    """Mint an upsert write (module docstring, step 1); every check runs here."""
    opts = WriteOptions.parse(options, schema)
    shard = opts.address.open()
    check_location(shard)
    location = shard.location
    keys = up.parse_key_columns(options["key_columns"], location)
    if overwrite:
        what = "outputMode('complete')" if streaming else "mode('overwrite')"
        raise InvalidOption(
            f"{what} replaces the whole table; an upsert (option key_columns) changes only "
            "the rows of its keys: use "
            + ("outputMode('append')" if streaming else "mode('append')")
            + " with key_columns, or drop "
            "key_columns",
            location=location,
        )
    for name, given in (
        ("time_column", opts.time_column),
        ("upper", opts.upper),
        ("remap", opts.remap),
    ):
        if given is not None:
            raise InvalidOption(
                f"an upsert writes every row at one new time (the shard's upper); it takes no "
                f"{name} option",
                location=location,
            )
    names = [f.name for f in schema.fields]
    delete_column = None
    if options.get("delete_column"):
        delete_column = find_column(names, options["delete_column"])
        if delete_column is None:
            raise InvalidOption(
                f"option delete_column names column {options['delete_column']!r}, which the "
                f"DataFrame does not have (columns: {', '.join(names)})",
                location=location,
            )
        if not isinstance(schema[delete_column].dataType, BooleanType):
            raise InvalidUpdates(
                f"delete_column {delete_column} must be BOOLEAN (true deletes the key), got "
                f"{schema[delete_column].dataType.simpleString()}",
                location=location,
            )
    batch_id = None
    if options.get("batch_id"):
        if streaming:
            raise InvalidOption(
                "option batch_id is for batch writes in foreachBatch; a stream numbers its "
                "micro-batches itself",
                location=location,
            )
        if opts.writer_id is None:
            raise InvalidOption(
                "option batch_id needs option writer_id (whose batches it numbers)",
                location=location,
            )
        try:
            batch_id = int(options["batch_id"])
        except ValueError:
            raise InvalidOption(
                f"option batch_id must be an integer, got {options['batch_id']!r}",
                location=location,
            ) from None
    rows_schema = StructType([f for f in schema.fields if f.name != delete_column])
    d = describe_write(opts, rows_schema, False, shard, evolve=opts.merge_schema)
    target = d.target if d.target is not None else d.incoming
    resolved = up.resolve_key_columns(target, keys, location)
    d = replace(d, plain=False)
    return opts, UpsertSpec(resolved, delete_column, batch_id), d


def stage_task(d: BatchDescription, spec: UpsertSpec, batches: Any) -> TaskWritten:
    """Step 2: one task's incoming rows, checked and written as staged parts."""
    with storage_errors(d.location, "write the shard"):
        shard = d.address.open()
        # A task still staging late in the write's lease renews it (core/statemachine/leases.py).
        with write_transaction(shard, d.write_id) as txn:
            return _stage(d, spec, batches, txn)


def _stage(
    d: BatchDescription, spec: UpsertSpec, batches: Any, txn: WriteTransaction
) -> TaskWritten:
    """The body of `stage_task`, under the write's lease."""
    target = d.target if d.target is not None else d.incoming
    pieces = []
    rows_in = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        rows_in += batch.num_rows
        table = as_updates(batch, d, d.lower).drop_columns([TIME])
        if spec.delete_column is not None:
            table = table.append_column(
                spec.delete_column, pa.Table.from_batches([batch]).column(spec.delete_column)
            )
        table = up.upsert_input(table, delete_column=spec.delete_column, location=d.location)
        up.check_keys(table, spec.keys, d.location)
        pieces.append(table)
    if not pieces:
        return TaskWritten(rows_in=rows_in)
    incoming = pa.concat_tables(pieces)
    up.check_unique_keys(incoming, spec.keys, d.location)
    staged = _at_time(incoming, target, d.lower, d.location)
    parts = txn.write_parts(consolidate(staged))
    return TaskWritten(sealed=parts, rows_in=rows_in)


def _at_time(incoming: pa.Table, schema: pa.Schema, time: int, location: str | None) -> pa.Table:
    """``incoming`` (``schema``'s columns by name + ``_diff``) as updates at ``time``, its
    columns cast to the stored types (`stored_columns`), so staged keys compare with the
    shard's."""
    times = pa.array(np.full(incoming.num_rows, time, dtype=np.int64))
    user = stored_columns(incoming, schema.names, schema, location)
    return pa.Table.from_arrays(
        [*user, times, incoming.column(DIFF).cast(pa.int64())],
        schema=update_schema(schema),
    )


def commit_upserts(
    d: BatchDescription,
    spec: UpsertSpec,
    messages: list[Any],
    *,
    staged_ids: list[str],
    writer: WriterBatch | None = None,
    expected_upper: int | None = None,
    compact: bool = True,
    maintenance: bool = True,
) -> None:
    """Step 3 (module docstring): apply the staged rows to the shard in one commit, then
    (``maintenance``, the write option) the bounded after-commit maintenance."""
    with storage_errors(d.location, "write the shard"):
        shard = d.address.open(maintenance=maintenance)
        txn = write_transaction(shard)
        try:
            # The staged rows are read here: their writes' leases must still be live (else
            # LeaseExpired, not missing files), and are kept so until the commit is done.
            with txn.holding(staged_ids, check=True):
                txn = _apply(txn, d, spec, messages, writer=writer, expected_upper=expected_upper)
        finally:
            txn.sweep([f"{write_id}/" for write_id in staged_ids])
        txn.maintain(compact=compact)  # bounded compaction and gc (core/maintenance/auto.py)


def _apply(
    txn: WriteTransaction,
    d: BatchDescription,
    spec: UpsertSpec,
    messages: list[Any],
    *,
    writer: WriterBatch | None,
    expected_upper: int | None,
) -> WriteTransaction:
    """Apply the staged rows (module docstring, step 3); the transaction that committed (a
    retry writes its delta under a fresh write id), or ``txn`` when nothing was committed."""
    location = txn.location
    target = d.target if d.target is not None else d.incoming
    staged = [ref for m in messages if m is not None for ref in m.sealed]
    # The tasks' staged parts came in messages: present with their sizes before they are read
    # (their times are dropped: the delta is written at the commit's time).
    txn.check_parts([(staged, None, None)])
    incoming = txn.read_parts(staged, update_schema(target)).drop_columns([TIME])
    up.check_unique_keys(incoming, spec.keys, location, diffs=True)
    for attempt in range(COMMIT_RETRIES + 1):
        state = txn.state()
        if writer is not None:
            verdict = judge_writer_batch(state, writer[0], writer[1], writer.identity, location)
            if verdict == WriterVerdict.REPLAY:
                log.info(
                    "%s: upsert batch %d of writer %s already committed; a replay, nothing written",
                    location,
                    writer[1],
                    writer[0],
                )
                return txn  # a replay of a committed batch: nothing to do
        if expected_upper is not None and state.upper != expected_upper:
            raise UpperMismatch(expected_upper, state.upper, location=location)
        schema = state.schema if state.schema is not None else target
        if len(target) > len(schema):
            schema = target  # merge_schema widened the columns
        keys = up.resolve_key_columns(schema, spec.keys, location)
        delta = txn.again()  # the delta's own write, under a fresh id
        try:
            with delta:  # a delta longer than the lease renews it
                parts = delta.upsert_delta(state, incoming, keys, schema)
                delta.commit(
                    WrittenUpdates(sealed=parts),
                    expected_upper=state.upper,
                    new_upper=state.upper + 1,
                    schema=up.with_key_columns(schema, keys),
                    commit_id=delta.write_id,
                    writer=writer,
                    label="upsert",
                    retention=d.retention,
                )
            return delta
        except UpperMismatch:
            if expected_upper is not None or attempt == COMMIT_RETRIES:
                raise
            log.info("%s: upsert lost the upper to another writer; diffing again", location)
    raise AssertionError("unreachable")


class UpsertWriter(DataSourceArrowWriter):
    """A batch upsert write: ``mode("append")`` with option ``key_columns``."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts, self.spec, self.description = plan_upsert(
            options, schema, overwrite, streaming=False
        )

    def write(self, iterator: Any) -> TaskWritten:
        if self.spec.batch_id is None:
            return stage_task(self.description, self.spec, iterator)
        # A numbered batch (foreachBatch): its rows' digest identifies it (module docstring).
        rows = Digesting(iterator)
        out = stage_task(self.description, self.spec, rows)
        return _digested(out, self.description.write_id, rows, task_query_id())

    def commit(self, messages: list[Any]) -> None:
        writer = None
        if self.spec.batch_id is not None and self.opts.writer_id is not None:
            writer = WriterBatch(self.opts.writer_id, self.spec.batch_id, identity_of(messages))
        commit_upserts(
            self.description,
            self.spec,
            messages,
            staged_ids=[self.description.write_id],
            writer=writer,
            expected_upper=self.opts.expected_upper,
            compact=self.opts.compact,
            maintenance=self.opts.maintenance,
        )

    def abort(self, messages: list[Any]) -> None:
        shard = self.description.address.open()
        sweep_write(shard, self.description.write_id, set())


class UpsertStreamWriter(DataSourceStreamArrowWriter):
    """A streaming upsert write (option ``key_columns``): each micro-batch is one upsert,
    committed exactly once per (writer id, batch id)."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = dict(options)
        self.schema = schema
        self.opts, self.spec, _ = plan_upsert(options, schema, overwrite, streaming=True)
        if self.opts.writer_id is None:
            raise InvalidOption(
                "a streaming write needs option writer_id: a stable name for this writer, "
                "so that a replayed micro-batch is committed exactly once"
            )

    def write(self, iterator: Any) -> DigestedTask:
        return upsert_stream_task(
            self.options, self.schema, iterator, replay.task_batch_id(), task_query_id()
        )

    def commit(self, messages: list[Any], batchId: int) -> None:
        _, spec, d = plan_upsert(self.options, self.schema, False, streaming=True)
        present = [m for m in messages if m is not None]
        commit_upserts(
            d,
            spec,
            present,
            staged_ids=[m.write_id for m in present if m.write_id],
            writer=WriterBatch(self.opts.writer_id or "", batchId, identity_of(present)),
            compact=self.opts.compact,
            maintenance=self.opts.maintenance,
        )

    def abort(self, messages: list[Any], batchId: int) -> None:
        shard = self.opts.address.open()
        for m in messages:
            if m is not None and m.write_id:
                sweep_write(shard, m.write_id, set())


def upsert_stream_task(
    options: dict[str, str],
    schema: StructType,
    batches: Any,
    batch_id: int,
    query_id: str | None,
) -> DigestedTask:
    """One task of streaming upsert micro-batch ``batch_id``: its rows staged under a write id
    naming the writer and the batch, reported with their digest and the query id."""
    opts, spec, d = plan_upsert(options, schema, False, streaming=True)
    d = replace(d, write_id=replay.stream_write_id(opts.writer_id, batch_id))
    rows = Digesting(batches)
    return _digested(stage_task(d, spec, rows), d.write_id, rows, query_id, lower=d.lower)


def _digested(
    out: TaskWritten, write_id: str, rows: Digesting, query_id: str | None, lower: int = 0
) -> DigestedTask:
    return DigestedTask.of(
        out, lower=lower, write_id=write_id, digest=rows.digest.text(), query_id=query_id
    )
