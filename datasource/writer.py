"""Spark batch and streaming writes: mint on the driver, write in every task, append once.

The protocol, after Materialize's persist sink:
1. *Mint* (driver, in ``writer()``): read the shard state and fix the batch description:
   ``lower`` (the upper seen now, or ``expected_upper``), the new upper if the user gave one,
   the shard's columns, and a fresh write id. It reaches the tasks inside the pickled writer.
2. *Write* (every task): feed the task's Arrow batches into a `Correction` buffer (bounded
   by ``memory_budget``, spilling beyond it), then write sorted, consolidated parts under
   ``parts/<write id>/``: updates below the new upper as sealed parts, the rest as unsealed.
   The message back is the parts' metadata (a "hollow batch").
3. *Append* (driver, in ``commit()``): one compare-and-append of every task's parts. If it is
   refused (`UpperMismatch`, bad input), nothing becomes visible and the write's parts are
   deleted. Parts of failed task attempts (Spark has no per-task abort) carry the write id and
   are swept at commit and abort, and by ``gc`` if the driver died.

Invariant: the shard changes only in step 3, atomically; a failed job leaves it as it was.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from persistshard.core.correction import Correction
from persistshard.core.parts import PARTS_PREFIX, PartSink
from persistshard.core.rows import DIFF, TIME
from persistshard.core.shard import Shard, WrittenUpdates, new_id, open_shard
from persistshard.core.state import PartRef
from persistshard.core.validate import (
    check_columns,
    normalize_updates,
    update_schema,
    user_schema,
)
from persistshard.datasource.options import LOCATION_KEY, WriteOptions
from persistshard.datasource.types import arrow_schema_of
from persistshard.errors import InvalidUpdates, UpperMismatch

#: Largest time a shard can hold; "no upper given" writes everything as sealed below it.
MAX_TIME = (1 << 63) - 2


@dataclass
class TaskWritten(WriterCommitMessage):
    """What one task wrote: its parts and the largest time among them."""

    sealed: list[PartRef] = field(default_factory=list)
    unsealed: list[PartRef] = field(default_factory=list)
    max_time: int | None = None
    rows_in: int = 0


@dataclass(frozen=True)
class BatchDescription:
    """The minted description every task of one write shares."""

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
    storage_options: dict[str, Any]


def describe_write(
    opts: WriteOptions, spark_schema: StructType, overwrite: bool, shard: Shard
) -> BatchDescription:
    """Mint: validate the DataFrame's columns against the shard and fix the description."""
    state = shard.state()
    arrow = arrow_schema_of(spark_schema)
    names = arrow.names
    time_column = opts.time_column or (TIME if TIME in names else None)
    diff_column = opts.diff_column or (DIFF if DIFF in names else None)
    for option, column in (("time_column", opts.time_column), ("diff_column", opts.diff_column)):
        if column is not None and column not in names:
            raise InvalidUpdates(
                f"option {option} names column {column!r}, which the DataFrame does not have "
                f"(columns: {', '.join(names)})",
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
        raise InvalidUpdates(
            f"option upper {opts.upper} is below the write's lower {lower}", location=shard.location
        )
    fields = [
        pa.field(f.name, f.type, f.nullable)
        for f in arrow
        if f.name not in (time_column, diff_column)
    ]
    incoming = user_schema(pa.schema(fields))
    if state.schema is not None:
        check_columns(incoming, state.schema, shard.location)
    return BatchDescription(
        location=shard.location,
        write_id=new_id(),
        lower=lower,
        upper=opts.upper,
        shard_schema=state.schema,
        incoming=incoming,
        time_column=time_column,
        diff_column=diff_column,
        overwrite=overwrite,
        memory_budget=opts.memory_budget,
        storage_options=dict(shard.storage_options),
    )


def _as_updates(batch: pa.RecordBatch, d: BatchDescription, time: int) -> pa.Table:
    """A Spark batch as updates: user columns, ``_time`` and ``_diff``."""
    table = pa.Table.from_batches([batch])
    n = table.num_rows
    columns = [table.column(f.name) for f in d.incoming]
    names = [f.name for f in d.incoming]
    if d.time_column is not None:
        columns.append(table.column(d.time_column))
    else:
        columns.append(pa.array(np.full(n, time, dtype=np.int64)))
    if d.diff_column is not None:
        columns.append(table.column(d.diff_column))
    else:
        columns.append(pa.array(np.ones(n, dtype=np.int64)))
    return pa.Table.from_arrays(columns, names=[*names, TIME, DIFF])


def write_task(d: BatchDescription, batches: Any, time: int) -> TaskWritten:
    """Step 2: consolidate one task's batches in a Correction buffer and write its parts."""
    shard = open_shard(d.location, **d.storage_options)
    schema = d.shard_schema or d.incoming
    full = update_schema(schema)
    upper = d.upper if d.upper is not None else MAX_TIME
    max_time: int | None = None
    rows_in = 0
    # The task's memory: the Correction buffer (a third of the budget, spilling beyond it;
    # its sorts and merges need transient copies of about as much again) plus one part being
    # gathered and sorted (2 x 1/12). Measured peak: about the budget, whatever the input
    # (tests/test_writer_memory.py).
    part_bytes = max(1 << 20, min(d.memory_budget // 12, 256 << 20))
    correction_bytes = max(1 << 20, d.memory_budget // 3)
    spill_dir = os.environ.get("PERSISTSHARD_SPILL_DIR")
    # Large chunks: a write task inserts everything, then reads once, so fewer, bigger sorted
    # runs (fewer chain merges) are cheaper; Correction caps chunks at an eighth of the budget.
    with Correction(
        full, chunk_bytes=correction_bytes // 8, budget_bytes=correction_bytes, spill_dir=spill_dir
    ) as correction:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rows_in += batch.num_rows
            table = normalize_updates(
                _as_updates(batch, d, time), lower=d.lower, schema=schema, location=d.location
            )
            biggest = pc.max(table.column(TIME)).as_py()
            max_time = biggest if max_time is None else max(max_time, biggest)
            correction.insert(table)
        sealed = PartSink(shard.blob, d.write_id, part_bytes=part_bytes)
        for out in correction.updates_before(upper):
            sealed.add(out)
        unsealed = PartSink(shard.blob, d.write_id, part_bytes=part_bytes)
        if d.upper is not None:
            for out in correction.updates_from(upper):
                unsealed.add(out)
        written = TaskWritten(sealed.close(), unsealed.close(), max_time, rows_in)
    _fault_point("after_write")
    return written


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


def sweep_write(shard: Shard, write_id: str, keep: set[str]) -> int:
    """Delete every part of ``write_id`` not in ``keep`` (failed attempts); return how many."""
    doomed = [m.key for m in shard.blob.list(f"{PARTS_PREFIX}{write_id}/") if m.key not in keep]
    shard.delete_parts(doomed)
    return len(doomed)


def commit_write(
    d: BatchDescription,
    messages: list[Any],
    *,
    writer: tuple[str, int] | None = None,
    compact: bool = True,
) -> None:
    """Step 3: one compare-and-append of every task's parts (see the module docstring)."""
    shard = open_shard(d.location, **d.storage_options)
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
        state = shard.state()
        if d.overwrite:
            if state.upper != d.lower:
                raise UpperMismatch(d.lower, state.upper, location=shard.location)
            written = shard.self_correct(
                written, time=d.lower, write_id=d.write_id + "-delta", state=state
            )
        schema = d.shard_schema or d.incoming
        shard.commit_written(
            written,
            expected_upper=d.lower,
            new_upper=new_upper,
            schema=schema,
            commit_id=d.write_id,
            writer=writer,
        )
    finally:
        sweep_write(shard, d.write_id, set(written.keys()))
        if d.overwrite:
            sweep_write(shard, d.write_id + "-delta", set(written.keys()))
    if compact:
        shard.maybe_compact()


class PersistShardWriter(DataSourceArrowWriter):
    """A batch write (``df.write.format("persistshard")``); see the module docstring."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = WriteOptions.parse(options, schema)
        shard = open_shard(self.opts.location)
        self.reclock: Any = None
        if self.opts.remap is not None:
            from persistshard.core.remap import open_remap
            from persistshard.datasource import reclock

            if overwrite:
                raise InvalidUpdates(
                    "a reclocked write appends; mode('overwrite') takes no remap option",
                    location=shard.location,
                )
            spec = reclock.spec_of(self.opts, schema, shard.location)
            self.reclock = (spec, open_remap(spec.remap).pinned())
        self.description = describe_write(self.opts, schema, overwrite, shard)

    def write(self, iterator: Any) -> TaskWritten:
        if self.reclock is not None:
            from persistshard.datasource.reclock import reclock_task

            spec, bindings = self.reclock
            return reclock_task(self.description, spec, iterator, bindings)
        return write_task(self.description, iterator, self.description.lower)

    def commit(self, messages: list[Any]) -> None:
        if self.reclock is not None:
            from persistshard.datasource.reclock import commit_reclocked

            commit_reclocked(self.description, self.reclock[0], messages, compact=self.opts.compact)
            return
        commit_write(self.description, messages, compact=self.opts.compact)

    def abort(self, messages: list[Any]) -> None:
        shard = open_shard(self.description.location, **self.description.storage_options)
        sweep_write(shard, self.description.write_id, set())


# --- streaming -----------------------------------------------------------------------------


def _batch_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    if value is None:
        raise InvalidUpdates("streaming write task without a batch id")
    return int(value)


@dataclass
class StreamTaskWritten(TaskWritten):
    """A streaming task's parts, with the lower it wrote at and its write id."""

    lower: int = 0
    write_id: str = ""


class PersistShardStreamWriter(DataSourceStreamArrowWriter):
    """A streaming write: each micro-batch is one compare-and-append, exactly once.

    Each commit records (writer id, batch id) in the shard state; a replayed batch (same
    writer id, batch id not above the recorded one) is recognised and becomes a no-op, and its
    parts are deleted. Rows without a time column are written at the shard's upper as seen by
    the micro-batch's tasks (micro-batches run one after the other).

    With option ``remap`` the micro-batch is reclocked instead (`persistshard.datasource.reclock`):
    rows go to their into-times, and no batch id is recorded, since Spark numbers batches from 0
    again after the checkpoint is deleted and the reclocked times already make replays no-ops.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = WriteOptions.parse(options, schema)
        if self.opts.writer_id is None:
            raise InvalidUpdates(
                "a streaming write needs option writer_id: a stable name for this writer, "
                "so that a replayed micro-batch is committed exactly once"
            )
        if overwrite:
            raise InvalidUpdates("streaming writes append; outputMode('complete') is not supported")
        self.options = dict(options)
        self.schema = schema
        self.reclock: Any = None
        if self.opts.remap is not None:
            from persistshard.datasource import reclock

            self.reclock = reclock.spec_of(self.opts, schema, self.opts.location)

    def write(self, iterator: Any) -> StreamTaskWritten:
        shard = open_shard(self.opts.location)
        d = describe_write(self.opts, self.schema, False, shard)
        batch_id = _batch_id()
        write_id = f"{new_id()[:12]}{self.opts.writer_id}-{batch_id}-{uuid.uuid4().hex[:8]}"
        d = replace(d, write_id=_safe_id(write_id))
        if self.reclock is not None:
            from persistshard.core.remap import open_remap
            from persistshard.datasource.reclock import reclock_task

            bindings = open_remap(self.reclock.remap).pinned()
            return reclock_task(d, self.reclock, iterator, bindings)
        out = write_task(d, iterator, d.lower)
        return StreamTaskWritten(
            out.sealed, out.unsealed, out.max_time, out.rows_in, d.lower, d.write_id
        )

    def commit(self, messages: list[Any], batchId: int) -> None:
        if self.reclock is not None:
            # No batch-id bookkeeping: Spark restarts batch ids when the checkpoint is deleted;
            # the reclocked times themselves make a replay a no-op.
            from persistshard.datasource.reclock import commit_reclocked

            shard = open_shard(self.opts.location)
            d = replace(describe_write(self.opts, self.schema, False, shard), write_id=new_id())
            commit_reclocked(d, self.reclock, messages, compact=self.opts.compact)
            return
        shard = open_shard(self.opts.location)
        present = [m for m in messages if m is not None]
        lowers = {m.lower for m in present}
        state = shard.state()
        if state.writers.get(self.opts.writer_id or "", -1) >= batchId:
            for m in present:
                sweep_write(shard, m.write_id, set())
            return
        if len(lowers) > 1:
            raise InvalidUpdates(
                f"micro-batch {batchId} was written at different uppers; the shard changed "
                "under the stream (another writer?)",
                location=shard.location,
            )
        lower = lowers.pop() if lowers else state.upper
        d = describe_write(self.opts, self.schema, False, shard)
        d = replace(d, lower=lower, write_id=new_id())  # unique: batch ids must never repeat
        try:
            commit_write(
                d, present, writer=(self.opts.writer_id or "", batchId), compact=self.opts.compact
            )
        finally:
            for m in present:
                sweep_write(shard, m.write_id, shard.state().part_keys())

    def abort(self, messages: list[Any], batchId: int) -> None:
        shard = open_shard(self.opts.location)
        keep = shard.state().part_keys()
        for m in messages:
            if m is not None:
                sweep_write(shard, m.write_id, keep)


def _safe_id(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def location_metadata(location: str) -> dict[str, str]:
    """Field metadata that carries a SQL table's location (see `options`)."""
    return {LOCATION_KEY: location}
