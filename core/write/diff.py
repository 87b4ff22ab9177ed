"""Difference of sorted runs: the updates that turn a shard's contents into desired contents.

A self-correcting write (``mode("overwrite")``, a complete-mode streaming sink) stages the
desired rows as sorted parts, then needs ``desired - current``: a retraction for every row
that goes away, an insertion for every row that comes, nothing for rows that stay. This
module computes that difference as a *streaming merge of sorted runs*, never holding either
side whole:

- A *run* (`DiffRun`) is a chain of parts whose rows, read in order, are sorted by row in
  the total order of `persistshard.core.rows` (each part sorted by (row, time); a chain is
  parts written one after the other from one sorted stream). It carries a sign: ``+1`` for
  desired rows, ``-1`` for the current contents (whose diffs are negated as they are read).
  Times are dropped as rows are read: the current contents at ``upper - 1`` are the sum of
  the diffs of every stored update (all sealed updates are below upper), whatever its time.
- `merge_diff` merges runs slice by slice. Each run holds one decoded chunk and hands out
  slices of it; the *frontier* of a run is the last row it handed out. Every buffered row
  strictly below the smallest frontier among runs with rows left is final (no run can still
  deliver it), so it is consolidated and emitted; the rest stays buffered, and the run with
  the smallest frontier delivers next. The buffer therefore holds at most one slice per run.
- `chain_runs` first joins runs of one sign whose first-column bounds (footer statistics)
  are strictly apart into one chain, and drops runs with nothing in the key range: input
  partitioned by key, and a trace batch cut into parts, merge as one run per side.
- `diff_parts` bounds the number of runs merged at once (the *fan-in*) by the memory budget:
  with more runs than that, groups of runs are merged first into intermediate runs (parts
  under a temporary write id, deleted at the end, success or not), like an external sort.
- A `KeyRange` (first row column in ``[lo, hi)``) restricts a diff to a slice of the key
  space: only chunks whose footer statistics meet the range are read, and rows outside it are
  dropped. Ranges from `plan_key_ranges` partition the key space (the last takes nulls), so
  the diffs of all ranges together are the diff of the whole table, and each can run in its
  own process (`persistshard.datasource.overwrite`).

Memory (checked by tests/test_diff.py with pyarrow's memory pool): at most ``fan_in`` decoded
chunks (the configuration's ``chunk_bytes`` each) plus one slice per run in the merge buffer
(twice while sorting) plus the output part being gathered (``part_bytes``). `fan_in_for`
chooses the fan-in so that this stays within ``memory_budget``; it never depends on the
table's size.

What it relies on: parts are sorted by (row, time) and their chunk key statistics bound the
first row column of their rows (`persistshard.format.stats`); the current parts are those of
a pinned state, which gc keeps while recent versions reference them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import ShardConfig
from persistshard.core.read.plan import KeyRange, in_range
from persistshard.core.rows import (
    DIFF,
    TIME,
    consolidate,
    row_columns,
    settle_below_bound,
    sort_indices,
)
from persistshard.core.statemachine.state import PartRef, ShardState
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.layout import new_id, release_unused_memory
from persistshard.core.storage.parts import PartSink, adapt_part_table, open_part
from persistshard.core.write.validate import update_schema
from persistshard.format import ChunkInfo, PartReader

log = logging.getLogger("persistshard.core.write.diff")

__all__ = [
    "DiffRun",
    "DiffStats",
    "KeyRange",
    "chain_runs",
    "current_runs",
    "diff_parts",
    "fan_in_for",
    "merge_diff",
    "plan_key_ranges",
]


#: Types of a first row column whose statistics can split a diff into key ranges.
_RANGE_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_binary,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_boolean,
)


@dataclass(frozen=True)
class DiffRun:
    """A chain of parts read as one sorted run of rows, with the sign of its diffs."""

    parts: tuple[PartRef, ...]
    sign: int = 1


@dataclass
class DiffStats:
    """What a diff did: rows read per side, rows written, merge passes, peak buffer bytes."""

    rows_read: int = 0
    rows_written: int = 0
    chunks_read: int = 0
    passes: int = 0
    peak_buffered_bytes: int = 0

    def add(self, other: DiffStats) -> None:
        self.rows_read += other.rows_read
        self.rows_written += other.rows_written
        self.chunks_read += other.chunks_read
        self.passes = max(self.passes, other.passes)
        self.peak_buffered_bytes = max(self.peak_buffered_bytes, other.peak_buffered_bytes)


def fan_in_for(memory_budget: int, chunk_bytes: int) -> int:
    """How many runs one merge may read at once within ``memory_budget`` bytes.

    Each run holds one decoded chunk (up to ``chunk_bytes``, and half as much again while it
    is converted and filtered); a quarter of the budget is left for the merge buffer and the
    output part.
    """
    return max(2, int(memory_budget * 3 // 4) // (3 * chunk_bytes // 2))


def output_part_bytes(memory_budget: int) -> int:
    """The size at which an output part is cut (a sixteenth of the budget, 1..64 MiB)."""
    return max(1 << 20, min(memory_budget // 16, 64 << 20))


# --- key ranges ----------------------------------------------------------------------------


def _chunk_meets(info: ChunkInfo, kr: KeyRange | None) -> bool:
    """Whether a chunk (its footer statistics) may hold rows of ``kr``."""
    if kr is None:
        return True
    if kr.nulls and info.key_null_count > 0:
        return True
    if info.key_min is None:
        return info.key_null_count < info.num_rows  # no statistics: it may hold anything
    return bool(
        (kr.lo is None or info.key_max >= kr.lo) and (kr.hi is None or info.key_min < kr.hi)
    )


def plan_key_ranges(
    blob: Blob, refs: Sequence[PartRef], schema: pa.Schema, count: int
) -> list[KeyRange | None]:
    """At most ``count`` key ranges that partition the key space, cut where the chunk
    statistics of ``refs`` put about equal bytes on each side. ``[None]`` (one range: all)
    when ``count <= 1``, when the first column's type has no usable order, or when a chunk
    lacks statistics.
    """
    if count <= 1 or len(schema) == 0 or not refs:
        return [None]
    first = schema.field(0)
    if not any(test(first.type) for test in _RANGE_TYPES):
        return [None]
    stats: list[tuple[Any, int]] = []
    for ref in refs:
        if not ref.num_rows:
            continue
        reader = open_part(blob, ref)
        for c in reader.chunks:
            if c.key_min is None:
                if c.key_null_count < c.num_rows:
                    return [None]
                continue
            stats.append((c.key_min, c.length))
    if not stats:
        return [None]
    stats.sort(key=lambda s: s[0])
    total = sum(s[1] for s in stats)
    splits: list[Any] = []
    acc = 0
    for key, length in stats:
        if acc >= total * (len(splits) + 1) / count and key > stats[0][0]:
            if not splits or key > splits[-1]:
                splits.append(key)
        acc += length
    bounds: list[Any] = [None, *splits, None]
    return [
        KeyRange(first.name, bounds[i], bounds[i + 1], i == len(bounds) - 2)
        for i in range(len(bounds) - 1)
    ]


# --- runs and the merge --------------------------------------------------------------------


class _RunReader:
    """Delivers a `DiffRun`'s rows (row columns + signed ``_diff``) slice by slice, in order,
    holding one decoded chunk at a time."""

    def __init__(
        self,
        blob: Blob,
        run: DiffRun,
        schema: pa.Schema,
        key_range: KeyRange | None,
        stats: DiffStats,
        slice_rows: int,
    ) -> None:
        self.blob = blob
        self.run = run
        self.slice_rows = slice_rows
        self.schema = schema  # rows + _time + _diff
        self.key_range = key_range
        self.stats = stats
        self._parts = list(run.parts)
        self._reader: PartReader | None = None
        self._ref: PartRef | None = None
        self._chunks: list[int] = []
        self._table: pa.Table | None = None
        self._offset = 0
        self.frontier: pa.Table | None = None
        self.done = False

    def _next_table(self) -> pa.Table | None:
        while True:
            if self._reader is not None and self._chunks:
                index = self._chunks.pop(0)
                assert self._ref is not None
                release_unused_memory()  # hand back the previous chunk's buffers (worker RSS)
                batch = self._reader.read_chunk(index)
                self.stats.chunks_read += 1
                table = adapt_part_table(pa.Table.from_batches([batch]), self._ref, self.schema)
                table = in_range(table, self.key_range).drop_columns([TIME])
                if self.run.sign < 0:
                    i = table.schema.get_field_index(DIFF)
                    table = table.set_column(i, table.schema.field(i), pc.negate(table.column(i)))
                if table.num_rows:
                    self.stats.rows_read += table.num_rows
                    return table.combine_chunks()
                continue
            if not self._parts:
                return None
            ref = self._parts.pop(0)
            if not ref.num_rows:
                continue
            self._ref = ref
            self._reader = open_part(self.blob, ref)
            self._chunks = [
                i for i, c in enumerate(self._reader.chunks) if _chunk_meets(c, self.key_range)
            ]

    def deliver(self) -> pa.Table | None:
        """The next slice (sorted by row), or None when the run has no rows left."""
        if self.done:
            return None
        if self._table is None or self._offset >= self._table.num_rows:
            self._table = self._next_table()
            self._offset = 0
            if self._table is None:
                self.done = True
                return None
        piece = self._table.slice(self._offset, self.slice_rows)
        self._offset += piece.num_rows
        if self._offset >= self._table.num_rows:
            self._table = None  # release the chunk before the next is read
        last = piece.slice(piece.num_rows - 1, 1)
        self.frontier = last.set_column(
            last.schema.get_field_index(DIFF), last.schema.field(DIFF), pa.array([0], pa.int64())
        )
        return piece


def merge_diff(
    blob: Blob,
    runs: Sequence[DiffRun],
    schema: pa.Schema,
    *,
    key_range: KeyRange | None = None,
    stats: DiffStats | None = None,
    slice_rows: int,
) -> Iterator[pa.Table]:
    """The signed sum of ``runs`` per row (rows + ``_diff``, zero sums dropped), in row
    order, in pieces; ``schema`` is the shard's user schema (the runs' parts are read as it
    says: columns they lack are nulls), each run read ``slice_rows`` rows at a time. See the
    module docstring for the bound."""
    stats = stats if stats is not None else DiffStats()
    full = update_schema(schema)
    columns = row_columns(full)
    readers = [_RunReader(blob, r, full, key_range, stats, slice_rows) for r in runs]
    empty = pa.schema([*schema, pa.field(DIFF, pa.int64(), nullable=False)]).empty_table()
    pending = empty
    arriving = [t for t in (r.deliver() for r in readers) if t is not None]
    while True:
        active = [r for r in readers if not r.done and r.frontier is not None]
        pieces = [pending, *arriving]
        if not active:
            table = pa.concat_tables(pieces)
            stats.peak_buffered_bytes = max(stats.peak_buffered_bytes, table.nbytes)
            out = consolidate(table, columns)
            if out.num_rows:
                yield out
            return
        frontiers = pa.concat_tables([r.frontier for r in active if r.frontier is not None])
        first = int(sort_indices(frontiers, columns).to_numpy()[0])
        slowest = active[first]
        table = pa.concat_tables([frontiers.slice(first, 1), *pieces])
        stats.peak_buffered_bytes = max(stats.peak_buffered_bytes, table.nbytes)
        # Desired and current rows mostly coincide: the first column is rarely distinct.
        # Only the final rows that do not cancel are gathered (an overwrite keeps a few
        # percent of them).
        done, rest = settle_below_bound(table, columns, expect_ties=True)
        if done.num_rows:
            yield done
        pending = rest if rest is not None else empty
        nxt = slowest.deliver()
        arriving = [nxt] if nxt is not None else []


def _with_time(rows: pa.Table, time: int) -> pa.RecordBatch:
    """Rows + ``_diff`` as updates at ``time`` (rows, ``_time``, ``_diff``), one batch."""
    n = rows.num_rows
    diff = rows.column(DIFF)
    table = rows.drop_columns([DIFF])
    table = table.append_column(
        pa.field(TIME, pa.int64(), nullable=False), pa.array(np.full(n, time, dtype=np.int64))
    )
    table = table.append_column(pa.field(DIFF, pa.int64(), nullable=False), diff)
    return table.combine_chunks().to_batches()[0] if n else table.to_batches()[0]


def _write_merge(
    blob: Blob,
    runs: Sequence[DiffRun],
    schema: pa.Schema,
    key_range: KeyRange | None,
    time: int,
    write_id: str,
    part_bytes: int,
    stats: DiffStats,
    config: ShardConfig,
) -> list[PartRef]:
    sink = PartSink(blob, write_id, config=config, part_bytes=part_bytes)
    rows = config.slice_rows
    merged = merge_diff(blob, runs, schema, key_range=key_range, stats=stats, slice_rows=rows)
    for piece in merged:
        stats.rows_written += piece.num_rows
        for start in range(0, piece.num_rows, rows * 4):
            sink.add(_with_time(piece.slice(start, rows * 4), time))
    return sink.close()


def _run_bounds(
    blob: Blob, run: DiffRun, first: str, key_range: KeyRange | None
) -> tuple[Any, Any] | bool | None:
    """The least and greatest first-column value of ``run``'s chunks that meet
    ``key_range``, by their footer statistics; False when no chunk meets it (the run adds
    nothing to this range); None when some meeting chunk has no bound or holds nulls."""
    lo: Any = None
    hi: Any = None
    for ref in run.parts:
        if not ref.num_rows:
            continue
        reader = open_part(blob, ref)
        if reader.sort_column != first:
            return None
        for c in reader.chunks:
            if not _chunk_meets(c, key_range):
                continue
            if c.key_min is None or c.key_null_count:
                return None
            lo = c.key_min if lo is None or c.key_min < lo else lo
            hi = c.key_max if hi is None or c.key_max > hi else hi
    return (lo, hi) if lo is not None else False


def chain_runs(
    blob: Blob, runs: Sequence[DiffRun], schema: pa.Schema, key_range: KeyRange | None = None
) -> list[DiffRun]:
    """``runs`` with those that add nothing to ``key_range`` dropped, and runs of one sign
    whose first-column bounds do not overlap joined into chains, fewest chains first fit.

    Invariant: a run joins a chain only when its least first-column value is strictly above
    the chain's greatest, so the joined parts, read in order, are still sorted by row; runs
    without bounds (no statistics, null keys, another sort column) stay alone. Sorted input
    (a DataFrame partitioned by key, a compacted trace batch cut into parts) then merges as
    one run per side, whatever its size: one pass, whatever the fan-in.
    """
    if len(schema) == 0:
        return list(runs)
    first = schema.field(0).name
    alone: list[DiffRun] = []
    bounded: list[tuple[Any, Any, DiffRun]] = []
    for run in runs:
        bounds = _run_bounds(blob, run, first, key_range)
        if bounds is False:
            continue
        if bounds is None or isinstance(bounds, bool):
            alone.append(run)
        else:
            bounded.append((bounds[0], bounds[1], run))
    chains: list[tuple[int, Any, list[PartRef]]] = []  # (sign, greatest key, parts)
    for lo, hi, run in sorted(bounded, key=lambda b: b[0]):
        best = -1
        for i, (sign, top, _) in enumerate(chains):
            if sign == run.sign and top < lo and (best < 0 or top > chains[best][1]):
                best = i
        if best < 0:
            chains.append((run.sign, hi, list(run.parts)))
        else:
            sign, _, parts = chains[best]
            chains[best] = (sign, hi, parts + list(run.parts))
    return [DiffRun(tuple(parts), sign) for sign, _, parts in chains] + alone


def diff_parts(
    blob: Blob,
    runs: Sequence[DiffRun],
    schema: pa.Schema,
    *,
    time: int,
    write_id: str,
    memory_budget: int,
    config: ShardConfig,
    key_range: KeyRange | None = None,
    stats: DiffStats | None = None,
) -> list[PartRef]:
    """Write the signed sum of ``runs`` (restricted to ``key_range``) as parts of
    ``write_id``: updates at ``time``, sorted, consolidated, one sorted run. Merges at most
    `fan_in_for` ``(memory_budget)`` runs at once, through intermediate runs (deleted before
    returning, also on failure); parts and slices as ``config`` says. Commits nothing."""
    stats = stats if stats is not None else DiffStats()
    fan_in = fan_in_for(memory_budget, config.chunk_bytes)
    part_bytes = output_part_bytes(memory_budget)
    pending = chain_runs(
        blob, [r for r in runs if any(p.num_rows for p in r.parts)], schema, key_range
    )
    temporary: list[str] = []
    passes = 0
    try:
        while len(pending) > fan_in:
            passes += 1
            group, pending = pending[:fan_in], pending[fan_in:]
            tmp_id = f"{write_id}-m{new_id()[:8]}"
            parts = _write_merge(
                blob, group, schema, key_range, time, tmp_id, part_bytes, stats, config
            )
            stats.rows_written -= sum(p.num_rows for p in parts)  # only the final pass counts
            temporary.extend(p.key for p in parts)
            if parts:
                pending.append(DiffRun(tuple(parts), 1))
        stats.passes = max(stats.passes, passes + 1)
        log.debug("diff of %d runs for write %s: %d passes", len(runs), write_id, passes + 1)
        return _write_merge(
            blob, pending, schema, key_range, time, write_id, part_bytes, stats, config
        )
    finally:
        for key in temporary:
            blob.delete(key)


def current_runs(state: ShardState) -> list[DiffRun]:
    """The sealed contents of ``state`` as negated runs: one per trace part (parts of one
    batch need not form a chain, so each stands alone). Unsealed updates are at times
    ``>= upper`` and are not part of the contents at ``upper - 1``."""
    return [DiffRun((p,), -1) for b in state.trace for p in b.parts if p.num_rows]
