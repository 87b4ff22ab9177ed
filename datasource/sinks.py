"""The Spark writer objects of the format: `PersistShardWriter` (batch) and
`PersistShardStreamWriter` (streaming), over the write protocol of
`persistshard.datasource.writer` (mint, write, append) and, for a ``remap`` option, the
reclocking sink of `persistshard.datasource.reclock`.

Kept apart from the protocol so that the reclocking sink can build on the protocol without an
import cycle: this module imports both, and neither imports it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.types import StructType

from persistshard.core.shard import Shard, write_transaction
from persistshard.core.statemachine.state import WriterBatch, WriterVerdict, judge_writer_batch
from persistshard.core.storage.layout import new_id
from persistshard.datasource import reclock
from persistshard.datasource.options import (
    TABLE_KEY,
    WriteOptions,
    find_location,
    storage_errors,
)
from persistshard.datasource.replay import (
    DigestedTask,
    Digesting,
    identity_of,
    stream_write_id,
    task_batch_id,
    task_query_id,
)
from persistshard.datasource.view import commit_complete
from persistshard.datasource.writer import (
    TaskWritten,
    check_location,
    commit_write,
    describe_write,
    sweep_write,
    tasks_saw_other_uppers,
    write_task,
)
from persistshard.errors import InvalidOption, InvalidUpdates

log = logging.getLogger("persistshard.datasource.sinks")


class PersistShardWriter(DataSourceArrowWriter):
    """A batch write (``df.write.format("persistshard")``); see the module docstring."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = WriteOptions.parse(options, schema)
        shard = self.opts.address.open()
        check_location(shard)
        # Option retention is set by the write's commit, with its data (describe_write).
        # A SQL table's location comes from its catalog columns (or, with the companion's
        # catalog, from the table's LOCATION: TABLE_KEY); catalog columns the shard lacks were
        # added by ALTER TABLE ... ADD COLUMNS, which the shard follows.
        from_table = find_location(options) is None or bool(options.get(TABLE_KEY))
        if from_table:
            stored = shard.inspect.state().schema
            if stored is not None:
                from persistshard.datasource.reader import check_table_columns

                check_table_columns(schema, stored, shard.location, options.get(TABLE_KEY))
        evolve = self.opts.merge_schema or from_table
        self.reclock: Any = None
        if self.opts.remap is not None:
            from persistshard.core.remap import open_remap

            if overwrite:
                raise InvalidOption(
                    "a reclocked write appends; mode('overwrite') takes no remap option",
                    location=shard.location,
                )
            spec = reclock.spec_of(self.opts, schema, shard.location)
            remap = open_remap(spec.remap, address=self.opts.address)
            self.reclock = (spec, remap.pinned())
        self.description = describe_write(self.opts, schema, overwrite, shard, evolve=evolve)

    def write(self, iterator: Any) -> TaskWritten:
        with storage_errors(self.description.location, "write the shard"):
            if self.reclock is not None:
                spec, bindings = self.reclock
                return reclock.reclock_task(self.description, spec, iterator, bindings)
            return write_task(self.description, iterator, self.description.lower)

    def commit(self, messages: list[Any]) -> None:
        with storage_errors(self.description.location, "commit the write"):
            if self.reclock is not None:
                reclock.commit_reclocked(
                    self.description,
                    self.reclock[0],
                    messages,
                    compact=self.opts.compact,
                    maintenance=self.opts.maintenance,
                )
                return
            commit_write(
                self.description,
                messages,
                compact=self.opts.compact,
                maintenance=self.opts.maintenance,
            )

    def abort(self, messages: list[Any]) -> None:
        log.info(
            "%s: write %s aborted; deleting its parts",
            self.description.location,
            self.description.write_id,
        )
        shard = self.description.address.open()
        sweep_write(shard, self.description.write_id, set())


# --- streaming -----------------------------------------------------------------------------


def stream_task(
    opts: WriteOptions,
    schema: StructType,
    complete: bool,
    batches: Any,
    batch_id: int,
    query_id: str | None,
) -> DigestedTask:
    """One task of micro-batch ``batch_id`` (not reclocked): its rows written as parts under a
    write id naming the writer and the batch, reported with their digest and the query id."""
    shard = opts.address.open()
    d = describe_write(opts, schema, complete, shard)
    d = replace(d, write_id=stream_write_id(opts.writer_id, batch_id))
    rows = Digesting(batches)
    try:
        out = write_task(d, rows, d.lower)
    except InvalidUpdates as e:
        if BELOW_LOWER not in e.detail:
            raise
        raise restarted_without_checkpoint(e, shard, opts.writer_id or "", batch_id) from None
    return DigestedTask.of(
        out, lower=d.lower, write_id=d.write_id, digest=rows.digest.text(), query_id=query_id
    )


def judge_micro_batch(shard: Shard, writer: WriterBatch, present: list[Any]) -> bool:
    """Whether ``writer``'s micro-batch must be committed (True) or is a replay (False: its
    staged ``present`` parts are deleted, and it is logged); a batch that is neither is
    refused (`InvalidUpdates` naming the checkpoint, `judge_writer_batch`) after its parts
    are deleted: nothing is written."""
    state = shard.inspect.state()
    try:
        verdict = judge_writer_batch(state, writer[0], writer[1], writer.identity, shard.location)
    except InvalidUpdates:
        for m in present:
            sweep_write(shard, m.write_id, set())
        raise
    if verdict == WriterVerdict.NEW:
        return True
    recorded = state.writer_batches.get(writer[0])
    if (
        recorded is not None
        and recorded.digest is not None
        and writer.identity.digest is not None
        and recorded.digest != writer.identity.digest
    ):
        log.warning(
            "%s: micro-batch %d of writer %s replayed by the same query with other rows (%s, "
            "recorded %s): a nondeterministic query; the committed rows stay",
            shard.location,
            writer[1],
            writer[0],
            writer.identity.digest,
            recorded.digest,
        )
    recorded_query = recorded.query_id if recorded is not None else None
    same_query = recorded_query is not None and recorded_query == writer.identity.query_id
    log.info(
        "%s: micro-batch %d of writer %s already committed (%s); a replay, nothing written",
        shard.location,
        writer[1],
        writer[0],
        "same query" if same_query else "same rows, or identity not recorded",
    )
    for m in present:
        sweep_write(shard, m.write_id, set())
    return False


class PersistShardStreamWriter(DataSourceStreamArrowWriter):
    """A streaming write: each micro-batch is one compare-and-append, exactly once.

    Each commit records (writer id, batch id) in the shard state, with what identifies the
    batch (`persistshard.datasource.replay`: the digest of its rows and the query id kept in
    Spark's checkpoint). Only the recorded batch id can be a replay, and only of the same
    query or the same rows: then it is a no-op and its parts are deleted. A lower id, or the
    recorded one with other rows from another query, means the checkpoint was lost: the
    commit is refused naming it, nothing written (`judge_writer_batch`). Rows without a time
    column are written at the shard's upper as seen by the micro-batch's tasks (micro-batches
    run one after the other).

    In ``outputMode("complete")`` each micro-batch's output is the desired contents of the
    table: its rows are staged, and the commit writes only the difference from the shard's
    contents, at one new time, exactly once (`persistshard.datasource.view`).

    With option ``remap`` the micro-batch is reclocked instead (`persistshard.datasource.reclock`):
    rows go to their into-times, and no batch id is recorded, since Spark numbers batches from 0
    again after the checkpoint is deleted and the reclocked times already make replays no-ops.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = WriteOptions.parse(options, schema)
        if self.opts.writer_id is None:
            raise InvalidOption(
                "a streaming write needs option writer_id: a stable name for this writer, "
                "so that a replayed micro-batch is committed exactly once"
            )
        self.complete = overwrite  # outputMode("complete"): a self-correcting view
        if overwrite and self.opts.remap is not None:
            raise InvalidOption(
                "outputMode('complete') writes each micro-batch's whole result as the table's "
                "contents; it takes no remap option (reclocking appends)"
            )
        self.options = dict(options)
        self.schema = schema
        self.reclock: Any = None
        if self.opts.remap is not None:
            self.reclock = reclock.spec_of(self.opts, schema, self.opts.location)

    def write(self, iterator: Any) -> TaskWritten:
        batch_id = task_batch_id()
        if self.reclock is None:
            return stream_task(
                self.opts, self.schema, self.complete, iterator, batch_id, task_query_id()
            )
        from persistshard.core.remap import open_remap

        shard = self.opts.address.open()
        d = describe_write(self.opts, self.schema, self.complete, shard)
        d = replace(d, write_id=stream_write_id(self.opts.writer_id, batch_id))
        bindings = open_remap(self.reclock.remap, address=self.opts.address).pinned()
        return reclock.reclock_task(d, self.reclock, iterator, bindings)

    def commit(self, messages: list[Any], batchId: int) -> None:
        if self.reclock is not None:
            # No batch-id bookkeeping: Spark restarts batch ids when the checkpoint is deleted;
            # the reclocked times themselves make a replay a no-op.

            shard = self.opts.address.open()
            d = replace(describe_write(self.opts, self.schema, False, shard), write_id=new_id())
            reclock.commit_reclocked(
                d,
                self.reclock,
                messages,
                compact=self.opts.compact,
                maintenance=self.opts.maintenance,
            )
            return
        if self.complete:
            commit_complete(self.opts, self.schema, messages, batchId)
            return
        shard = self.opts.address.open()
        present = [m for m in messages if m is not None]
        lowers = {m.lower for m in present}
        writer = WriterBatch(self.opts.writer_id or "", batchId, identity_of(present))
        if not judge_micro_batch(shard, writer, present):
            return
        state = shard.inspect.state()
        lower = min(lowers) if lowers else state.upper
        d = describe_write(self.opts, self.schema, False, shard)
        d = replace(d, lower=lower, write_id=new_id())  # unique: batch ids must never repeat
        try:
            if len(lowers) > 1:  # a lost race: another writer committed while the tasks ran
                raise tasks_saw_other_uppers(lowers, state.upper, shard.location)
            # Each task renewed its own write's lease while it ran; from here the driver
            # keeps them all until the commit (which refuses one that ran out: LeaseExpired).
            with write_transaction(shard).holding([m.write_id for m in present]):
                commit_write(
                    d,
                    present,
                    writer=writer,
                    compact=self.opts.compact,
                    maintenance=self.opts.maintenance,
                )
        finally:
            for m in present:
                sweep_write(shard, m.write_id, shard.inspect.state().part_keys())

    def abort(self, messages: list[Any], batchId: int) -> None:
        shard = self.opts.address.open()
        keep = shard.inspect.state().part_keys()
        for m in messages:
            if m is not None:
                sweep_write(shard, m.write_id, keep)


#: The text of core.validate's refusal of a time below the write's lower (the shard's upper).
BELOW_LOWER = "is below the write's lower"


def restarted_without_checkpoint(
    error: InvalidUpdates, shard: Any, writer_id: str, batch_id: int
) -> InvalidUpdates:
    """The refusal of a micro-batch whose times the shard already holds, saying why that
    happens to a stream and what to do: its rows are updates at times below the shard's upper,
    which only a replay of already written updates produces once the checkpoint that said
    where the stream was is gone (Spark then numbers micro-batches from 0 again and the source
    starts over). Nothing was written."""
    state = shard.inspect.state()
    last = state.writers.get(writer_id)
    before = (
        f"writer {writer_id!r} already committed micro-batches up to {last}"
        if last is not None
        else f"the shard already holds every time below {state.upper}"
    )
    return InvalidUpdates(
        f"{error.detail}. Micro-batch {batch_id} of the streaming write {writer_id!r} replays "
        f"updates the shard already holds ({before}): the query was restarted without its "
        "checkpoint (deleted, or a new checkpointLocation), so Spark numbers micro-batches "
        "from 0 again and the source starts over. Nothing was written. To go on: restore the "
        "checkpoint; or start the source after what the shard holds (a persistshard source: "
        f".option('updates_from', {state.upper}); Kafka: reclock with option remap and start at "
        "persistshard.resume_offsets(...)); reclocked writes (option remap) drop such replays "
        "instead of refusing them",
        location=shard.location,
    )
