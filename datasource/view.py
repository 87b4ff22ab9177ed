"""The complete-mode streaming sink: a self-correcting materialized view.

In ``outputMode("complete")`` every micro-batch's output is the whole desired contents of
the table (a streaming aggregation's full result). The sink keeps the shard equal to it,
after persist's materialized-view sink: it never rewrites the table, it writes the
*difference* between the desired contents and what the shard holds, at one new time per
micro-batch.

1. *Stage* (every task, `PersistShardStreamWriter.write`): the task's rows are sorted and
   consolidated in a Correction buffer and written as one sorted chain of parts under a
   write id naming the writer and the batch (`persistshard.datasource.writer.write_task`).
2. *Commit* (`commit_complete`, once per micro-batch): if the shard records this writer at
   this very batch id, with the same query id or the same digest of the desired rows
   (`persistshard.datasource.replay`), the micro-batch was committed before (Spark replays a
   batch whose commit it did not see): nothing is written. A lower batch id, or this one with
   other rows from another query, means the checkpoint was lost: refused naming it, nothing
   written (`persistshard.core.statemachine.state.judge_writer_batch`). Otherwise the staged
   chains are merged, streaming and within ``memory_budget``, against the parts of the newest
   state (`persistshard.core.write.diff`), the difference is written at ``t = upper``, and one
   compare-and-append moves the upper to ``t + 1`` and records ``(writer_id, batchId)`` with
   the batch's identity. If another writer moved the upper in between, the diff is computed
   again against the newer contents (the desired contents do not depend on the shard's time).

Invariants: after the commit of micro-batch ``b`` at time ``t``, the snapshot at ``t`` is
exactly ``b``'s output; ``updates(t_a + 1, t_b + 1)`` between two micro-batches holds only
the rows that changed (a retraction of the old row, an insertion of the new one); each
``(writer_id, batchId)`` is committed at most once (the record is part of the same atomic
commit as the rows). Staged parts are never referenced by the state and are deleted after
every commit attempt. The commit holds the staged tasks' leases (after checking them live:
else `LeaseExpired`, nothing read) and each diff's own, so a long diff is not refused; parts
of a diff whose commit was refused are deleted by its commit
(`persistshard.core.write.transaction`); anything a crashed process left is unreferenced
and gc's.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql.types import StructType

from persistshard.core.shard import WrittenUpdates, write_transaction
from persistshard.core.statemachine.state import WriterBatch, WriterVerdict, judge_writer_batch
from persistshard.core.write.diff import DiffRun, current_runs
from persistshard.datasource.options import WriteOptions, storage_errors
from persistshard.datasource.replay import identity_of
from persistshard.datasource.writer import describe_write
from persistshard.errors import UpperMismatch

log = logging.getLogger("persistshard.datasource.view")

#: How many times a micro-batch's diff is recomputed after losing the upper to another writer.
MAX_ATTEMPTS = 8


def commit_complete(
    opts: WriteOptions, spark_schema: StructType, messages: list[Any], batch_id: int
) -> None:
    """Commit one complete-mode micro-batch exactly once (module docstring)."""
    shard = opts.address.open()
    present = [m for m in messages if m is not None]
    writer = WriterBatch(opts.writer_id or "", batch_id, identity_of(present))
    chains = [DiffRun(tuple(m.sealed), 1) for m in present if m.sealed]
    committed = False
    txn = write_transaction(shard)
    try:
        with (
            storage_errors(shard.location, "commit the micro-batch"),
            # The staged chains are read below: their tasks' leases must still be live (else
            # LeaseExpired, not missing files), and are kept so until the commit is done.
            txn.holding([m.write_id for m in present], check=True),
        ):
            # The staged chains came in the tasks' messages: present with their sizes before
            # the diff reads them (their times are dropped: the diff is at the commit's time).
            txn.check_parts([(m.sealed, None, None) for m in present])
            last: UpperMismatch | None = None
            for _ in range(MAX_ATTEMPTS):
                state = shard.inspect.state()
                verdict = judge_writer_batch(
                    state, writer[0], batch_id, writer.identity, shard.location
                )
                if verdict == WriterVerdict.REPLAY:
                    log.info(
                        "%s: complete-mode batch %d of writer %s already committed; a replay, "
                        "nothing written",
                        shard.location,
                        batch_id,
                        writer[0],
                    )
                    return  # a replay of a committed micro-batch: nothing is written twice
                d = describe_write(opts, spark_schema, True, shard)
                target = d.target if d.target is not None else d.incoming
                time = state.upper
                diff = txn.again()  # each attempt's difference is a write of its own
                runs = [*chains, *current_runs(state)] if state.schema is not None else chains
                try:
                    with diff:  # a long diff renews its lease
                        parts = diff.diff(runs, target, time=time, memory_budget=opts.memory_budget)
                        diff.commit(
                            WrittenUpdates(sealed=parts),
                            expected_upper=time,
                            new_upper=time + 1,
                            schema=target,
                            commit_id=diff.write_id,
                            writer=writer,
                            label="overwrite",
                            retention=d.retention,
                        )
                except UpperMismatch as e:  # another writer moved the upper: diff again
                    log.info(
                        "%s: complete-mode batch %d lost the upper; diffing again",
                        shard.location,
                        batch_id,
                    )
                    last = e
                    continue
                committed, txn = True, diff
                break
            if not committed and last is not None:
                raise last
    finally:
        txn.sweep([f"{m.write_id}/" for m in present], txn.state().part_keys())
    if committed and opts.maintenance:
        txn.maintain(compact=opts.compact)  # core/maintenance/auto.py
