"""A self-correcting overwrite spread over Spark tasks: ``persistshard.overwrite(spark, df,
location)``.

After it, the snapshot at the new time equals the DataFrame, and only the difference was
written, as with ``mode("overwrite")``; but no process holds the shard or the DataFrame:

1. *Mint* (driver): pin the shard's state (its upper is the overwrite's time and the expected
   upper of the commit), fix the batch description (`persistshard.datasource.writer.
   describe_write`, columns matched and checked as for any write).
2. *Stage* (one Spark job, a task per DataFrame partition): each task gathers its rows up to
   a quarter of ``memory_budget``, sorts and consolidates them and writes them as one sorted
   run (a chain of parts) under the write id, and again until its rows run out
   (`stage_task`): an external sort's first phase; the diff's merge is its second.
3. *Plan* (driver): cut the key space into ranges by the chunk statistics in the footers of
   the staged and the current parts (`persistshard.core.write.diff.plan_key_ranges`).
4. *Diff* (one Spark job, a task per key range): each task merges, streaming, the staged
   chains against the pinned state's parts, reading only chunks that meet its range, and
   writes the difference (updates at the overwrite's time) under its own write id
   (`persistshard.core.write.diff.diff_parts`, memory within ``memory_budget``).
5. *Commit* (driver): one compare-and-append of every range's parts at ``expected_upper =
   the pinned upper``, new upper one past it.

The driver holds the write's lease (`persistshard.core.statemachine.leases`) from step 1 to
step 5; it covers the staged parts and every range's difference, so gc keeps them however
long the jobs run. What holds: the shard changes only in step 5, atomically. Whatever fails
(a task, the plan, a commit refused because another writer moved the upper), the staged
parts and every part of the diff are deleted before the error is raised; parts of task
attempts that died without a trace (Spark has no per-task abort) carry the write id and are
deleted by the same sweep, or by gc if the driver died. A task's failure that is a
persistshard error reaches the caller as its own class. Assumes every executor reaches the
storage under the same location and options.
"""

from __future__ import annotations

import base64
import logging
import pickle
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from persistshard import errors
from persistshard.core.config import MEMORY_BUDGET, ShardConfig
from persistshard.core.read.plan import KeyRange
from persistshard.core.rows import DIFF, TIME, consolidate
from persistshard.core.shard import WrittenUpdates, write_transaction
from persistshard.core.statemachine.state import PartRef
from persistshard.core.storage.blob import open_blob
from persistshard.core.storage.layout import release_unused_memory
from persistshard.core.storage.parts import write_parts
from persistshard.core.write.diff import DiffRun, DiffStats, current_runs, diff_parts
from persistshard.core.write.validate import normalize_updates
from persistshard.datasource.options import WriteOptions, storage_errors
from persistshard.datasource.writer import (
    FAULT_PROPERTY,
    BatchDescription,
    check_location,
    describe_write,
)

log = logging.getLogger("persistshard.datasource.overwrite")

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OverwriteReport", "overwrite"]

#: Bytes of parts (staged plus current) per diff task, before the task count is capped.
RANGE_BYTES = 64 << 20


@dataclass(frozen=True)
class OverwriteReport:
    """What an overwrite did: the time it wrote at, rows staged (the DataFrame's, after
    consolidation), rows written (the difference), key ranges (diff tasks), merge passes."""

    time: int
    rows_staged: int
    rows_written: int
    ranges: int
    passes: int


@dataclass(frozen=True)
class DiffTask:
    """One key range's diff, as shipped to a Spark task."""

    location: str
    storage_options: dict[str, Any] = field(repr=False)  # may hold credentials
    runs: tuple[DiffRun, ...]
    schema: pa.Schema
    key_range: KeyRange | None
    time: int
    write_id: str
    memory_budget: int
    config: ShardConfig


def _desired(batch: pa.RecordBatch, d: BatchDescription) -> pa.Table:
    """A DataFrame batch as updates at the overwrite's time: the target's columns (matched by
    name), ``_time``, ``_diff`` (the diff column's, else +1)."""
    table = pa.Table.from_batches([batch])
    n = table.num_rows
    target = d.target if d.target is not None else d.incoming
    sources = d.sources or tuple(target.names)
    columns = [table.column(name) for name in sources]
    columns.append(pa.array(np.full(n, d.lower, dtype=np.int64)))
    if d.diff_column is not None:
        columns.append(table.column(d.diff_column))
    else:
        columns.append(pa.array(np.ones(n, dtype=np.int64)))
    return pa.Table.from_arrays(columns, names=[*target.names, TIME, DIFF])


def stage_task(d: BatchDescription, batches: Any, memory_budget: int) -> list[list[PartRef]]:
    """Step 2 in one task: its rows as sorted runs, each a chain of parts, of about a quarter
    of ``memory_budget`` each (gather, sort and consolidate, write; the merge of the diff
    takes the runs apart again). Validates like any write; returns the chains."""
    from pyspark import TaskContext

    blob = open_blob(d.location, **d.address.storage_options)
    schema = d.target if d.target is not None else (d.shard_schema or d.incoming)
    limit = max(1 << 20, memory_budget // 4)
    chains: list[list[PartRef]] = []
    pending: list[pa.Table] = []
    size = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            run = consolidate(pa.concat_tables(pending))
            pending, size = [], 0
            chains.append(write_parts(blob, d.write_id, run, config=d.address.config))
            del run
            release_unused_memory()  # the run's sort and encode buffers, before the next

    with storage_errors(d.location, "write the shard"):
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = normalize_updates(
                _desired(batch, d), lower=d.lower, schema=schema, location=d.location
            )
            pending.append(table)
            size += table.nbytes
            if size >= limit:
                flush()
        flush()
    release_unused_memory()  # the worker runs the diff next: hand back what staging held
    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        if ctx.getLocalProperty(FAULT_PROPERTY) == "after_write":
            raise RuntimeError("injected failure at after_write (first attempt of this task)")
    return chains


def _encode(obj: Any) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode("ascii")


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))  # our own tasks' messages only


def _run_diff(task: DiffTask) -> tuple[list[PartRef], DiffStats] | dict[str, str]:
    """On an executor: one key range's diff, its parts and stats (or the error, as data)."""
    from persistshard.core.storage.blob import open_blob

    try:
        with storage_errors(task.location, "write the overwrite's difference"):
            blob = open_blob(task.location, **task.storage_options)
            stats = DiffStats()
            parts = diff_parts(
                blob,
                task.runs,
                task.schema,
                time=task.time,
                write_id=task.write_id,
                memory_budget=task.memory_budget,
                config=task.config,
                key_range=task.key_range,
                stats=stats,
            )
            return parts, stats
    except Exception as e:
        detail = e.detail if isinstance(e, errors.PersistShardError) else f"{type(e).__name__}: {e}"
        return {"class": type(e).__name__, "detail": detail}
    finally:
        release_unused_memory()


def _task_error(error: dict[str, str], location: str) -> errors.PersistShardError:
    from persistshard.datasource.compact import task_error

    return task_error(error, location)


def overwrite(
    spark: SparkSession,
    df: DataFrame,
    location: str,
    *,
    memory_budget: int = MEMORY_BUDGET,
    merge_schema: bool = False,
    max_ranges: int | None = None,
    range_bytes: int = RANGE_BYTES,
    compact: bool = True,
    **storage_options: Any,
) -> OverwriteReport:
    """Make the shard at ``location`` hold exactly ``df`` at a new time, writing only the
    difference, with the work spread over Spark tasks (module docstring). Each task keeps to
    about ``memory_budget`` bytes; ``merge_schema`` lets the DataFrame add nullable columns;
    ``max_ranges`` caps the diff tasks (default four per default parallelism); there is one per
    ``range_bytes`` of parts (staged and current) below the cap. ``compact``: run the small
    compaction a writer may run after its commit (`persistshard.core.maintenance.auto`)."""
    options = {"path": location, "memory_budget": str(memory_budget)}
    options.update({f"storage.{k}": str(v) for k, v in storage_options.items()})
    opts = WriteOptions.parse(options, df.schema)
    shard = opts.address.open()
    check_location(shard)
    state = shard.inspect.state()
    d = describe_write(opts, df.schema, True, shard, evolve=merge_schema)
    d = replace(d, lower=state.upper, upper=state.upper + 1)
    txn = write_transaction(shard, d.write_id)
    time = state.upper
    log.debug("%s: overwrite at time %d (write %s)", shard.location, time, d.write_id)

    def stage(batches: Any) -> Any:
        chains = stage_task(d, batches, memory_budget)
        yield pa.record_batch({"message": pa.array([_encode(chains)], pa.string())})

    delta_ids: list[str] = []
    committed: set[str] = set()
    # The driver holds the write's lease from the mint to the commit: the staged parts (under
    # the write id) and every range's difference (under ids derived from it) are kept by gc
    # however long the two jobs run, and the commit is not refused for being late.
    with txn:
        try:
            rows = df.mapInArrow(stage, "message string").collect()
            staged = [_decode(r["message"]) for r in rows]
            chains = [DiffRun(tuple(c), 1) for m in staged for c in m if c]
            current = current_runs(state) if state.schema is not None else []
            schema = d.target if d.target is not None else d.incoming
            refs = [p for r in (*chains, *current) for p in r.parts]
            total = sum(p.size for p in refs)
            cap = max_ranges or 4 * spark.sparkContext.defaultParallelism
            count = max(1, min(cap, -(-total // max(1, range_bytes))))
            ranges = txn.key_ranges(refs, schema, count)
            tasks = []
            for i, kr in enumerate(ranges):
                delta_ids.append(f"{d.write_id}-d{i}")
                tasks.append(
                    DiffTask(
                        shard.location,
                        dict(shard.address.storage_options),
                        (*chains, *current),
                        schema,
                        kr,
                        time,
                        delta_ids[-1],
                        memory_budget,
                        shard.config,
                    )
                )
            outcomes = spark.sparkContext.parallelize(tasks, len(tasks)).map(_run_diff).collect()
            written = WrittenUpdates()
            stats = DiffStats()
            for outcome in outcomes:
                if isinstance(outcome, dict):
                    raise _task_error(outcome, shard.location)
                parts, task_stats = outcome
                written.sealed.extend(parts)
                stats.add(task_stats)
            txn.check(written, expected_upper=time, new_upper=time + 1)  # the tasks' parts
            # From here the commit may land: its parts are deleted only by its own certain
            # refusal, never by the sweep (an unknown outcome keeps them for gc).
            committed = set(written.keys())
            txn.commit(
                written,
                expected_upper=time,
                new_upper=time + 1,
                schema=schema,
                commit_id=d.write_id,
                label="overwrite",
            )
        finally:
            # Staged parts are never referenced; failed attempts' and unchecked diffs' neither.
            txn.sweep([f"{d.write_id}/", *(f"{i}/" for i in delta_ids)], committed)
    txn.maintain(compact=compact)  # bounded compaction and gc (core/maintenance/auto.py)
    return OverwriteReport(
        time=time,
        rows_staged=sum(p.num_rows for r in chains for p in r.parts),
        rows_written=stats.rows_written,
        ranges=len(ranges),
        passes=stats.passes,
    )
