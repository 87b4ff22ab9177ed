"""The reclocking write path: source records get shard times from a remap shard (seed 003).

Used by the streaming sink and by batch writes (``foreachBatch``) with option ``remap``:

1. *Task* (`reclock_task`): pin the remap shard's bindings and the output's upper ``lower``;
   give each record ``(partition, offset)`` its into-time (`Bindings.reclock`). A record no
   binding covers yet gets the *provisional* time ``P`` = the remap shard's upper, which the
   commit binds. Records reclocked below ``lower`` are already in the output and are dropped.
   The task reports the frontier it reached (offset + 1 per partition, over every record it
   saw, dropped ones included) and ``P``.
2. *Commit* (`commit_reclocked`, driver): mint one binding for the frontier the write reached,
   joined with the bound one, with compare-and-append at ``P`` (it binds into-time ``P``, or
   nothing when the frontier is already bound). Then one compare-and-append of the output
   from ``lower`` to ``s + 1``, where ``s`` is the newest into-time whose frontier the output
   now holds: everything below its old upper plus every record this write saw.

Invariants:
- Every row an output holds at time ``t`` comes from a record the frontier bound at ``t``
  covers and the one at ``t - 1`` does not (its reclocked time), so outputs sharing a remap
  shard reflect the same source prefix at every into-time below their uppers.
- An output's upper only passes into-time ``s`` when it holds every record below ``F(s)``;
  a write holding rows beyond what it may seal is refused (`NotSealed`), never sealed short.
- A replay (same or older records, checkpoint kept or deleted) reclocks its records to the same
  times; those below the output's upper are dropped, so nothing is written twice.

Relies on: the write sees every record of the source from the output's resumption frontier
(`persistshard.resume_frontier`) on (a Spark query started there, or from its checkpoint); and
one minter per remap shard at a time (a second one racing it makes the loser's commit fail with
`UpperMismatch` and nothing of it is written).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.remap import Bindings, Frontier, join, open_remap
from persistshard.core.rows import TIME
from persistshard.datasource.writer import (
    BatchDescription,
    StreamTaskWritten,
    commit_write,
    tasks_saw_other_uppers,
    write_task,
)
from persistshard.errors import InvalidOption, InvalidUpdates, NotSealed, UpperMismatch

log = logging.getLogger("persistshard.datasource.reclock")

#: Test hook: called with the name of each crash point of `commit_reclocked` as it passes it
#: (``"after_remap_commit"``, ``"after_data_commit"``); raising there simulates a crash.
CRASH_HOOK: Callable[[str], None] | None = None


def _crash_point(name: str) -> None:
    if CRASH_HOOK is not None:
        CRASH_HOOK(name)


@dataclass(frozen=True)
class ReclockSpec:
    """Where the remap shard is and which columns carry a record's partition and offset."""

    remap: str
    partition_column: str = "partition"
    offset_column: str = "offset"
    #: A frontier the whole micro-batch reaches, for a DataFrame that is a filtered part of it.
    source_frontier: tuple[tuple[str, int], ...] = ()


@dataclass
class ReclockTaskWritten(StreamTaskWritten):
    """A reclocking task's parts, plus the frontier it reached and the remap upper it saw."""

    reached: dict[str, int] = field(default_factory=dict)
    remap_upper: int = 0
    provisional_rows: int = 0


def check_source_columns(spec: ReclockSpec, schema: pa.Schema, location: str) -> None:
    """The partition column (string or integer) and offset column (integer) must exist."""
    names = schema.names
    for option, column in (
        ("source_partition_column", spec.partition_column),
        ("source_offset_column", spec.offset_column),
    ):
        if column not in names:
            raise InvalidOption(
                f"option {option} names column {column!r}, which the DataFrame does not have "
                f"(columns: {', '.join(names)})",
                location=location,
            )
    ptype = schema.field(spec.partition_column).type
    if not (pa.types.is_string(ptype) or pa.types.is_integer(ptype)):
        raise InvalidUpdates(
            f"source partition column {spec.partition_column!r} must be a string or integer "
            f"column, got {ptype}",
            location=location,
        )
    if not pa.types.is_integer(schema.field(spec.offset_column).type):
        raise InvalidUpdates(
            f"source offset column {spec.offset_column!r} must be an integer column, got "
            f"{schema.field(spec.offset_column).type}",
            location=location,
        )
    if TIME in names:
        raise InvalidUpdates(
            f"a reclocked write takes its times from the remap shard; drop the {TIME} column",
            location=location,
        )


def spec_of(opts: Any, schema: Any, location: str) -> ReclockSpec:
    """The `ReclockSpec` of parsed write options, its columns checked against the DataFrame's
    Spark schema (before any task runs)."""
    from persistshard.datasource.types import arrow_schema_of

    spec = ReclockSpec(
        remap=opts.remap,
        partition_column=opts.source_partition_column,
        offset_column=opts.source_offset_column,
        source_frontier=opts.source_frontier,
    )
    if opts.time_column is not None:
        raise InvalidOption(
            "a reclocked write takes its times from the remap shard; it takes no time_column",
            location=location,
        )
    check_source_columns(spec, arrow_schema_of(schema), location)
    return spec


def partition_keys(table: pa.Table | pa.RecordBatch, spec: ReclockSpec) -> pa.Array:
    """Each record's partition key: ``topic:partition`` for an integer partition column when
    the rows have a string ``topic`` column (Kafka's), else the partition as a string."""
    col = table.column(spec.partition_column)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_integer(col.type):
        text = pc.cast(col, pa.string())
        names = table.schema.names
        if "topic" in names and pa.types.is_string(table.schema.field("topic").type):
            topic = table.column("topic")
            if isinstance(topic, pa.ChunkedArray):
                topic = topic.combine_chunks()
            return pc.binary_join_element_wise(topic, text, ":")
        return text
    return col


def reached_frontier(keys: pa.Array, offsets: pa.Array) -> Frontier:
    """Offset + 1 of the largest offset of each partition among the records."""
    if len(keys) == 0:
        return {}
    grouped = pa.table({"k": keys, "o": offsets}).group_by("k").aggregate([("o", "max")])
    return {
        k: int(o) + 1
        for k, o in zip(
            grouped.column("k").to_pylist(), grouped.column("o_max").to_pylist(), strict=True
        )
        if k is not None and o is not None
    }


def reclock_task(
    d: BatchDescription, spec: ReclockSpec, batches: Any, bindings: Bindings
) -> ReclockTaskWritten:
    """Step 1 (see the module docstring): reclock, drop what the output holds, write parts."""
    reached: dict[str, int] = {}
    provisional = [0]

    def reclocked() -> Iterator[pa.RecordBatch]:
        nonlocal reached
        for batch in batches:
            if batch.num_rows == 0:
                continue
            keys = partition_keys(batch, spec)
            offsets = batch.column(spec.offset_column)
            times = bindings.reclock(keys, offsets, beyond=bindings.upper)
            reached = join(reached, reached_frontier(keys, pc.cast(offsets, pa.int64())))
            provisional[0] += int(pc.sum(pc.equal(times, bindings.upper)).as_py() or 0)
            keep = pc.greater_equal(times, d.lower)
            out = batch.append_column(pa.field(TIME, pa.int64(), False), times)
            if not pc.all(keep).as_py():
                out = out.filter(keep)
            if out.num_rows:
                yield out

    out = write_task(replace(d, time_column=TIME), reclocked(), d.lower)
    return ReclockTaskWritten.of(
        out,
        lower=d.lower,
        write_id=d.write_id,
        reached=reached,
        remap_upper=bindings.upper,
        provisional_rows=provisional[0],
    )


def commit_reclocked(
    d: BatchDescription,
    spec: ReclockSpec,
    messages: list[Any],
    *,
    compact: bool = True,
    maintenance: bool = True,
) -> int:
    """Step 2 (see the module docstring); returns the output's upper afterwards. The output's
    commit is followed (``maintenance``, the write option) by the bounded after-commit
    maintenance."""
    present = [m for m in messages if m is not None]
    from persistshard.core.shard import write_transaction

    shard = d.address.open()
    txn = write_transaction(shard)
    try:
        # Each task renewed its write's lease while it ran; the driver keeps them to the commit.
        with txn.holding([m.write_id for m in present]):
            return _commit(d, spec, present, shard, compact, maintenance)
    finally:
        keep = txn.state().part_keys()
        txn.sweep([f"{m.write_id}/" for m in present], keep)


def _commit(
    d: BatchDescription,
    spec: ReclockSpec,
    present: list[Any],
    shard: Any,
    compact: bool,
    maintenance: bool,
) -> int:
    remap = open_remap(spec.remap, address=d.address)
    uppers = {m.remap_upper for m in present}
    if len(uppers) > 1:
        raise UpperMismatch(
            min(uppers), max(uppers), location=remap.location
        )  # the remap shard moved while the tasks ran: another minter
    reached = join(*(m.reached for m in present), dict(spec.source_frontier))
    provisional = sum(m.provisional_rows for m in present)
    pinned = remap.pinned()
    seen = uppers.pop() if uppers else pinned.upper
    if pinned.upper != seen and provisional:
        raise UpperMismatch(seen, pinned.upper, location=remap.location)
    if reached:
        into = remap.mint_at(reached, expected_upper=pinned.upper, join_current=True)
        _crash_point("after_remap_commit")
        pinned = remap.pinned()
    else:
        into = pinned.last_time if pinned.last_time is not None else -1
    lowers = {m.lower for m in present}
    state = shard.inspect.state()
    if len(lowers) > 1:  # a lost race: another writer committed while the tasks ran
        raise tasks_saw_other_uppers(lowers, state.upper, shard.location)
    lower = lowers.pop() if lowers else d.lower
    if state.upper != lower:
        raise UpperMismatch(lower, state.upper, location=shard.location)
    held = join(pinned.frontier_at(lower), reached)
    sealed = pinned.sealable(held, into)
    max_time = max((m.max_time for m in present if m.max_time is not None), default=None)
    if max_time is not None and max_time > sealed:
        missing = sorted(
            k for k, v in pinned.frontier_at(max_time + 1).items() if held.get(k, 0) < v
        )
        raise NotSealed(
            max_time,
            sealed + 1,
            location=shard.location,
            message=f"this write holds rows at into-time {max_time} but not every record "
            f"below its frontier (partitions {', '.join(map(repr, missing))} are bound further "
            "than this write read): was the query started after the output's resumption "
            "frontier (persistshard.resume_offsets), or is another query minting into the same "
            "remap shard?",
        )
    new_upper = max(lower, sealed + 1)
    if new_upper == lower:
        log.debug("%s: nothing sealable at %d yet; the data commit waits", shard.location, lower)
        return lower
    commit_write(
        replace(d, lower=lower, upper=new_upper),
        present,
        compact=compact,
        maintenance=maintenance,
    )
    _crash_point("after_data_commit")
    return new_upper


def frontier_of(df: Any, partition_column: str = "partition", offset_column: str = "offset") -> str:
    """The frontier a Spark DataFrame of source records reaches, as the JSON that the write
    option ``source_frontier`` takes: for writing filtered parts of one micro-batch to several
    outputs from ``foreachBatch`` (each part then seals what the whole micro-batch covers)."""
    import json

    from pyspark.sql import functions as F

    spec = ReclockSpec("", partition_column, offset_column)
    group = ["topic"] if "topic" in df.columns and partition_column != "topic" else []
    rows = (
        df.groupBy(*group, partition_column)
        .agg(F.max(offset_column).alias(offset_column))
        .collect()
    )
    if not rows:
        return "{}"
    partitions = [r[partition_column] for r in rows]
    ptype = pa.string() if isinstance(partitions[0], str) else pa.int64()
    columns = {
        partition_column: pa.array(partitions, ptype),
        offset_column: pa.array([r[offset_column] for r in rows], pa.int64()),
    }
    if group:
        columns["topic"] = pa.array([r["topic"] for r in rows], pa.string())
    table = pa.table(columns)
    bindings = Bindings("", 0, 0)
    keys = partition_keys(table, spec)
    offsets = table.column(offset_column).combine_chunks()
    bindings.reclock(keys, offsets, beyond=0)  # the same checks as a write: nulls, negatives
    return json.dumps(reached_frontier(keys, offsets), sort_keys=True)


__all__ = [
    "CRASH_HOOK",
    "ReclockSpec",
    "ReclockTaskWritten",
    "check_source_columns",
    "commit_reclocked",
    "frontier_of",
    "partition_keys",
    "reached_frontier",
    "reclock_task",
    "spec_of",
]
