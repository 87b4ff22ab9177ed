"""Read planning: which parts and chunks a read needs, how it splits into tasks, and how each
task turns stored updates into an answer.

One implementation serves `persistshard.core.shard.Shard` (`snapshot`, `updates`,
`read_range`) and the Spark readers (`persistshard.datasource.reader`, `.stream`), which only
translate options and filters into the terms used here.

What a read computes is a `Query` against one pinned `ShardState`: a snapshot at ``as_of``
(every update at a time ``<= as_of``, summed per row) or the updates in ``[lo, hi)`` (times
forwarded to since, then consolidated per (row, time)). `check_as_of` and
`check_updates_range` refuse the times at which such an answer would not be exact.

Invariants this module keeps:
- A task's answer depends only on the pinned state version and the query: parts are
  immutable, and nothing here consults the newest state.
- Consolidation needs every update of a row in one task. Tasks therefore split rows by *key
  range* over the first row column, using the chunk statistics in the part footers (all
  updates of a row share its first column). Nulls of that column go to the last task. When
  the first column has no usable statistics (floats, nested types) the read is one task. A
  multiset snapshot (rows repeated by their counts) whose chunk statistics prove every diff
  positive needs no consolidation, and splits by chunk instead (`plan_read`'s ``multiset``).
- A pushed filter (`persistshard.core.read.filters`) on row columns is applied to updates before
  consolidation. That is exact because every update of a row has the row's values, so a
  row-level predicate keeps all of a row's updates or none. Chunks and parts whose statistics
  show that no row can pass are never fetched or decompressed (only the footer is read).

What it relies on: parts are sorted by (row, time) and consolidated within themselves
(`persistshard.core.storage.parts`); chunk statistics bound the values they describe
(`persistshard.format.stats`); every part a pinned state references stays on storage while the
read runs (GC keeps what recent versions reference). A read that outlives that finds a part
missing (`CorruptData` with ``missing``); its caller, which knows how to read the newest state,
turns that into `VersionCollected` when gc collected it (`persistshard.core.read.race`).
"""

from __future__ import annotations

import functools
import logging
import mmap
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import DEFAULTS
from persistshard.core.read.filters import Pred, chunk_may_match, chunk_stats, filter_table
from persistshard.core.rows import DIFF, TIME, advance_times, consolidate, snapshot_of
from persistshard.core.statemachine.state import PartRef, ShardState
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.metrics import run_in_context
from persistshard.core.storage.parts import adapt_part_table, open_part, release_mapped
from persistshard.core.write.validate import update_schema
from persistshard.errors import InvalidOption, NegativeDiff, NotSealed, SinceViolation
from persistshard.format import PartReader
from persistshard.format.pool import WORKERS, SharedPool

_T = TypeVar("_T")

log = logging.getLogger("persistshard.core.read.plan")

# --- which times are exact -----------------------------------------------------------------


def check_as_of(state: ShardState, as_of: int, location: str | None) -> None:
    """A snapshot at ``as_of`` is exact only in ``[since, upper)``; else the API's error."""
    if as_of < state.since:
        raise SinceViolation(as_of, state.since, location=location)
    if as_of >= state.upper:
        raise NotSealed(as_of, state.upper, location=location)


def check_updates_range(state: ShardState, lo: int, hi: int, location: str | None) -> None:
    """The updates in ``[lo, hi)`` are exact only when sealed (``hi <= upper``) and when ``lo``
    is 0 or after since (else updates from before ``lo`` may have been forwarded into the
    range); else the API's error."""
    if lo > hi:
        raise InvalidOption(f"updates_from {lo} is after updates_to {hi}", location=location)
    if hi > state.upper:
        raise NotSealed(
            hi - 1,
            state.upper,
            location=location,
            message=f"updates up to {hi} are not sealed: the shard's upper is "
            f"{state.upper}; read to {state.upper} at most, or seal first",
        )
    if 0 < lo <= state.since:
        raise SinceViolation(
            lo,
            state.since,
            location=location,
            message=f"updates from {lo} are not exact: history up to the since "
            f"{state.since} has been compacted; read from 0 or from {state.since + 1}",
        )


# --- what a read computes ------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """What a read computes: a snapshot at ``as_of`` or the updates in ``[lo, hi)``."""

    mode: str  # "snapshot" | "updates"
    as_of: int = 0
    lo: int = 0
    hi: int = 0
    since: int = 0
    with_diff: bool = False

    @property
    def max_time(self) -> int:
        """The largest stored time the answer can depend on."""
        return self.as_of if self.mode == "snapshot" else self.hi - 1

    @property
    def min_time(self) -> int | None:
        """The smallest stored time the answer can depend on (None: from the beginning).

        A stored time is at most its forwarded time, so times below ``lo`` matter only when
        they may be forwarded into the range (``lo <= since``)."""
        if self.mode == "updates" and self.lo > self.since:
            return self.lo
        return None


def snapshot_query(
    state: ShardState, as_of: int, location: str | None, *, with_diff: bool = False
) -> Query:
    """The snapshot at ``as_of`` of ``state``, after checking it is exact."""
    check_as_of(state, as_of, location)
    return Query("snapshot", as_of=as_of, since=state.since, with_diff=with_diff)


def updates_query(state: ShardState, lo: int, hi: int, location: str | None) -> Query:
    """The updates in ``[lo, hi)`` of ``state``, after checking they are exact."""
    check_updates_range(state, lo, hi, location)
    return Query("updates", lo=lo, hi=hi, since=state.since)


def relevant_parts(state: ShardState, q: Query) -> list[PartRef]:
    """The non-empty parts of ``state`` that may hold updates at the times ``q`` reads."""
    return parts_in_times(state, q.min_time, q.max_time)


def parts_in_times(state: ShardState, min_time: int | None, max_time: int | None) -> list[PartRef]:
    """The non-empty parts (trace and unsealed) that may hold times in ``[min_time, max_time]``."""
    refs: list[PartRef] = []
    for b in state.trace:
        if (max_time is None or b.lower <= max_time) and (min_time is None or b.upper > min_time):
            refs.extend(b.parts)
    for b in state.unsealed:
        refs.extend(b.parts)
    return [
        p
        for p in refs
        if p.num_rows
        and (max_time is None or p.min_time <= max_time)
        and (min_time is None or p.max_time >= min_time)
    ]


# --- tasks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartSlice:
    """The chunks of one part a task reads."""

    ref: PartRef
    chunks: tuple[int, ...] | None  # None: every chunk (statistics decide at read time)


@dataclass(frozen=True)
class KeyRange:
    """Rows whose first column is in ``[lo, hi)``; None bounds are open; nulls when last."""

    column: str
    lo: Any
    hi: Any
    nulls: bool


@dataclass(frozen=True)
class ReadTask:
    """One task's share of a read: part slices of a pinned version, a key range, a filter.

    Picklable (Spark ships it to executors). ``row_filter`` only names row columns.

    ``columns`` (None: all) are the row columns of the answer: only they, the filters'
    columns and the key range's column are decoded, and a snapshot or change read is then
    consolidated per distinct *projected* row. That is the projection of the full answer as
    a multiset (projection commutes with summing diffs), but a projected row may appear in
    two tasks when the first row column is left out. ``row_expression`` is a pyarrow compute
    expression over row columns (``expression_columns`` are the ones it reads), applied to
    updates after ``row_filter`` and before consolidation, exact for the same reason a
    ``row_filter`` is (it is a row-level predicate).
    """

    slices: tuple[PartSlice, ...]
    key_range: KeyRange | None
    query: Query
    stored_schema: pa.Schema
    row_filter: Pred | None = None
    columns: tuple[str, ...] | None = None
    row_expression: Any = None
    expression_columns: tuple[str, ...] = ()

    def output_schema(self) -> pa.Schema:
        """The stored schema restricted to the answer's row columns, plus ``_time``/``_diff``."""
        if self.columns is None:
            return self.stored_schema
        keep = {*self.columns, TIME, DIFF}
        return pa.schema([f for f in self.stored_schema if f.name in keep])

    def read_schema(self) -> pa.Schema:
        """The stored columns a task decodes: the answer's, the filters' and the key range's."""
        if self.columns is None:
            return self.stored_schema
        keep = {*self.columns, *self.expression_columns, TIME, DIFF}
        if self.row_filter is not None:
            keep |= self.row_filter.columns()
        if self.key_range is not None:
            keep.add(self.key_range.column)
        return pa.schema([f for f in self.stored_schema if f.name in keep])

    @property
    def projects(self) -> bool:
        """Whether the answer leaves out some row column (rows may then repeat)."""
        return self.columns is not None and len(self.output_schema()) < len(self.stored_schema)


#: Types of a first column whose chunk statistics split reads by key range.
_RANGE_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_binary,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_decimal,
    pa.types.is_boolean,
)


#: Part readers already opened, by part key: lets the tasks of one read (a `Scan`'s) parse
#: each footer once. Parts are immutable, so a cached reader never goes stale.
Readers = dict[str, PartReader]

#: Most parts one `MappedReaders` maps (each mapping holds a file descriptor while it lives).
MAP_MAX_PARTS = 64


class MappedReaders(Readers):
    """A `Readers` cache that opens parts of at least ``map_min_bytes`` (the configuration's)
    in a local directory
    memory-mapped (`persistshard.core.storage.parts.open_part` with ``mapped``), up to
    `MAP_MAX_PARTS` of them; the rest read by ranged gets. The mappings live as long as the
    cache (and the views taken of them), so a cache serves one consumption of a read."""

    def __init__(self, map_min_bytes: int = DEFAULTS.map_min_bytes) -> None:
        super().__init__()
        self.map_min_bytes = map_min_bytes
        self.mapped = 0
        self.mappings: list[mmap.mmap] = []

    def release(self) -> None:
        """Give back the pages of every mapping so far (`release_mapped`): a streamed scan
        calls it as it goes (the configuration's ``scan_release_bytes``), so its
        resident set stays near that much of the parts, not the shard's."""
        release_mapped(list(self.mappings))

    def claim(self, ref: PartRef) -> bool:
        """Whether ``ref`` is to be opened mapped (counted when it is)."""
        if ref.size < self.map_min_bytes or self.mapped >= MAP_MAX_PARTS:
            return False
        self.mapped += 1
        return True


def _mapped(readers: Readers | None, ref: PartRef) -> bool:
    return isinstance(readers, MappedReaders) and readers.claim(ref)


def _open(blob: Blob, ref: PartRef, readers: Readers | None) -> PartReader:
    if readers is None:
        return open_part(blob, ref)
    reader = readers.get(ref.key)
    if reader is None:
        reader = readers[ref.key] = open_part(
            blob, ref, mapped=_mapped(readers, ref), on_map=_on_map(readers)
        )
    return reader


def _local(blob: Blob, ref: PartRef) -> bool:
    """Whether ``blob`` keeps its parts (``ref``'s among them) in a local directory."""
    local = getattr(blob, "local_file", None)
    return local is not None and local(ref.key) is not None


def _on_map(readers: Readers | None) -> Any:
    return readers.mappings.append if isinstance(readers, MappedReaders) else None


def _open_all(
    blob: Blob, refs: Sequence[PartRef], readers: Readers | None = None
) -> list[PartReader]:
    cached = readers if readers is not None else {}
    missing = list({r.key: r for r in refs if r.key not in cached}.values())
    on_map = _on_map(readers)
    if len(missing) == 1 or (missing and _local(blob, missing[0])):
        # One part, or local files (a footer read is a page-cache copy, nothing to overlap:
        # starting threads would cost more than the reads, about 0.4 ms each).
        for ref in missing:
            cached[ref.key] = open_part(blob, ref, mapped=_mapped(readers, ref), on_map=on_map)
    elif missing:
        flags = {r.key: _mapped(readers, r) for r in missing}
        with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
            opened = pool.map(
                run_in_context(lambda r: open_part(blob, r, mapped=flags[r.key], on_map=on_map)),
                missing,
            )
            for ref, reader in zip(missing, opened, strict=True):
                cached[ref.key] = reader
    return [cached[r.key] for r in refs]


def _wanted_chunks(
    reader: PartReader,
    ref: PartRef,
    candidates: Sequence[int] | None,
    q: Query,
    row_filter: Pred | None,
) -> list[int]:
    """The chunks of ``reader`` (among ``candidates``) whose times and statistics may match.

    A part whose reference rewrites its times (a rebased plain append) is at
    ``ref.rewrite_time`` throughout, whatever its chunks' stored times say, so only its
    reference's times count (they were checked when the part was chosen)."""
    chunks = range(len(reader.chunks)) if candidates is None else candidates
    lo, hi = q.min_time, q.max_time
    rewritten = ref.rewrite_time is not None
    out = []
    for c in chunks:
        info = reader.chunks[c]
        if not rewritten and info.min_time is not None and info.min_time > hi:
            continue
        if not rewritten and lo is not None and info.max_time is not None and info.max_time < lo:
            continue
        if row_filter is not None and not chunk_may_match(row_filter, reader, c):
            continue
        out.append(c)
    return out


def plan_read(
    blob: Blob,
    state: ShardState,
    q: Query,
    *,
    partition_bytes: int = 24 << 20,
    max_partitions: int = 64,
    min_partitions: int = 1,
    row_filter: Pred | None = None,
    readers: Readers | None = None,
    multiset: bool = False,
    min_task_bytes: int = DEFAULTS.min_task_bytes,
) -> list[ReadTask]:
    """Tasks of the pinned ``state`` for ``q``, split by key range (module docstring).

    ``multiset``: the reader repeats each row of a snapshot by its count and never
    consolidates across tasks (`iter_task` with ``as_multiset``). When, besides, the chunks'
    statistics prove every diff positive, no update needs another's to be counted, so the
    read splits by chunk instead (`_chunk_tasks`): each chunk is decoded by one task, where a
    key-range split decodes every chunk whose range meets a task's in each of those tasks (all
    of them, for parts written by many small appends of shuffled keys).

    Aims at one task per ``partition_bytes`` of relevant parts, at most ``max_partitions``,
    and at least ``min_partitions`` (the cores a read should keep busy) as long as each task
    gets ``min_task_bytes``; a split never cuts a chunk, so fewer chunks mean fewer tasks.
    When the read splits, or when a filter is given, the part footers are read here and
    chunks that cannot match are left out of every task (parts left with no chunk are not
    read at all).
    """
    assert state.schema is not None
    stored = update_schema(state.schema)
    refs = relevant_parts(state, q)
    total = sum(r.size for r in refs)
    want = max(1, min(max_partitions, -(-total // max(1, partition_bytes))))
    if min_partitions > want:
        want = max(want, min(max_partitions, min_partitions, total // min_task_bytes))
    first = state.schema.field(0)
    rangeable = any(test(first.type) for test in _RANGE_TYPES)

    def single(slices: list[PartSlice]) -> list[ReadTask]:
        return [ReadTask(tuple(slices), None, q, stored, row_filter)]

    if not refs:
        return single([])
    multiset = multiset and q.mode == "snapshot"
    if (want == 1 or not (rangeable or multiset)) and row_filter is None:
        return single([PartSlice(r, None) for r in refs])
    opened = _open_all(blob, refs, readers)
    wanted = [
        _wanted_chunks(r, ref, None, q, row_filter) for r, ref in zip(opened, refs, strict=True)
    ]
    kept = [PartSlice(ref, tuple(w)) for ref, w in zip(refs, wanted, strict=True) if w]
    if want > 1 and multiset and all(map(_positive_diffs, opened, wanted)):
        return _chunk_tasks(opened, refs, wanted, want, q, stored, row_filter)
    if want == 1 or not rangeable:
        return single(kept)
    chunk_stats = []  # (key_min, key_max, has_nulls, bytes, part index, chunk index)
    for pi, (reader, chunks) in enumerate(zip(opened, wanted, strict=True)):
        for ci in chunks:
            c = reader.chunks[ci]
            if c.key_min is None and c.key_null_count < c.num_rows:
                return single(kept)
            chunk_stats.append((c.key_min, c.key_max, c.key_null_count > 0, c.length, pi, ci))
    valued = sorted((s for s in chunk_stats if s[0] is not None), key=lambda s: s[0])
    if not valued:
        return single(kept)
    total_bytes = sum(s[3] for s in valued)
    splits: list[Any] = []
    acc = 0
    for s in valued:
        if acc >= total_bytes * (len(splits) + 1) / want and (not splits or s[0] > splits[-1]):
            if s[0] > valued[0][0]:
                splits.append(s[0])
        acc += s[3]
    bounds = [None, *splits, None]
    out = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        last = i == len(bounds) - 2
        per_part: dict[int, list[int]] = {}
        for kmin, kmax, has_nulls, _, pi, ci in chunk_stats:
            meets = kmin is not None and (lo is None or kmax >= lo) and (hi is None or kmin < hi)
            if meets or (last and has_nulls):
                per_part.setdefault(pi, []).append(ci)
        slices = tuple(PartSlice(refs[pi], tuple(cis)) for pi, cis in sorted(per_part.items()))
        out.append(ReadTask(slices, KeyRange(first.name, lo, hi, last), q, stored, row_filter))
    log.debug(
        "read of version %d: %d parts, %d bytes, split %d ways",
        state.version,
        len(refs),
        total,
        len(out),
    )
    return out


def _chunk_tasks(
    opened: Sequence[PartReader],
    refs: Sequence[PartRef],
    wanted: Sequence[Sequence[int]],
    want: int,
    q: Query,
    stored: pa.Schema,
    row_filter: Pred | None,
) -> list[ReadTask]:
    """About ``want`` tasks of consecutive chunks (in part order) with about equal stored
    bytes and no key range: every wanted chunk in exactly one task. Only for answers that
    need no consolidation across chunks (`plan_read`'s ``multiset``)."""
    chunks = [(pi, ci, opened[pi].chunks[ci].length) for pi, cs in enumerate(wanted) for ci in cs]
    total = sum(length for _, _, length in chunks)
    out: list[ReadTask] = []
    group: dict[int, list[int]] = {}
    acc = 0
    for pi, ci, length in chunks:
        group.setdefault(pi, []).append(ci)
        acc += length
        if acc >= total * (len(out) + 1) / want:
            out.append(_chunk_task(refs, group, q, stored, row_filter))
            group = {}
    if group:
        out.append(_chunk_task(refs, group, q, stored, row_filter))
    log.debug(
        "snapshot read split by chunk: %d chunks, %d bytes, %d tasks", len(chunks), total, len(out)
    )
    return out


def _chunk_task(
    refs: Sequence[PartRef],
    group: dict[int, list[int]],
    q: Query,
    stored: pa.Schema,
    row_filter: Pred | None,
) -> ReadTask:
    slices = tuple(PartSlice(refs[pi], tuple(cis)) for pi, cis in sorted(group.items()))
    return ReadTask(slices, None, q, stored, row_filter)


# --- executing a task ----------------------------------------------------------------------


def in_range(table: pa.Table, kr: KeyRange | None) -> pa.Table:
    """The rows of ``table`` whose first row column lies in ``kr`` (all of them for None)."""
    if kr is None or table.num_rows == 0:
        return table
    col = table.column(kr.column)
    mask = None
    if kr.lo is not None:
        mask = pc.greater_equal(col, pa.scalar(kr.lo, col.type))
    if kr.hi is not None:
        upper = pc.less(col, pa.scalar(kr.hi, col.type))
        mask = upper if mask is None else pc.and_(mask, upper)
    if mask is None:
        return table if kr.nulls else table.filter(pc.is_valid(col))
    mask = pc.fill_null(mask, False)
    if kr.nulls:
        mask = pc.or_(mask, pc.is_null(col))
    return table.filter(mask)


def _chunks_within(reader: PartReader, chunks: Sequence[int], kr: KeyRange) -> bool:
    """Whether every row of ``chunks`` is in ``kr`` by the chunks' key statistics (then the
    range filter, a copy of every column, is skipped)."""
    for c in chunks:
        info = reader.chunks[c]
        if info.key_null_count and not kr.nulls:
            return False
        if info.key_null_count == info.num_rows:
            continue  # only nulls, and nulls belong here
        if info.key_min is None or info.key_max is None:
            return False
        if kr.lo is not None and not info.key_min >= kr.lo:
            return False
        if kr.hi is not None and not info.key_max < kr.hi:
            return False
    return True


def _restrict(
    table: pa.Table, task: ReadTask, ref: PartRef, reader: PartReader, chunks: Sequence[int]
) -> pa.Table:
    """Rows of ``chunks`` of one part (adapted) kept by ``task``: the query's times, the key
    range and the row filter."""
    q = task.query
    lo, hi = q.min_time, q.max_time
    if ref.max_time > hi or (lo is not None and ref.min_time < lo):
        times = table.column(TIME)
        mask = pc.less_equal(times, hi)
        if lo is not None:
            mask = pc.and_(mask, pc.greater_equal(times, lo))
        table = table.filter(mask)
    if task.key_range is not None and not _chunks_within(reader, chunks, task.key_range):
        table = in_range(table, task.key_range)
    if task.row_filter is not None:
        table = filter_table(table, task.row_filter)
    if task.row_expression is not None and table.num_rows:
        table = table.filter(task.row_expression)
    return table


def load_updates(blob: Blob, task: ReadTask, readers: Readers | None = None) -> pa.Table:
    """The stored updates a task reads: its chunks, at the query's times, in its key range and
    passing its row filter; unconsolidated, times not forwarded, in the stored schema."""
    q = task.query
    out_names = task.output_schema().names

    def load(s: PartSlice) -> pa.Table:
        reader = _open(blob, s.ref, readers)
        chunks = _wanted_chunks(reader, s.ref, s.chunks, q, task.row_filter)
        schema = _slice_schema(task, reader, s.ref, chunks)
        table = adapt_part_table(
            reader.read(_present(reader, schema), chunks=chunks), s.ref, schema
        )
        table = _restrict(table, task, s.ref, reader, chunks)
        return _with_time(table, s.ref).select(out_names)

    if not task.slices:
        return task.output_schema().empty_table()
    if len(task.slices) == 1:
        return load(task.slices[0])
    with ThreadPoolExecutor(max_workers=min(4, len(task.slices))) as pool:
        return pa.concat_tables(list(pool.map(run_in_context(load), task.slices)))


def _slice_schema(
    task: ReadTask, reader: PartReader, ref: PartRef, chunks: Sequence[int]
) -> pa.Schema:
    """The columns to decode for ``chunks`` of one part: `ReadTask.read_schema`, less, in a
    snapshot, ``_time`` when every time of the part is in the query's (no time filter runs:
    a snapshot's answer has no times), and, in a projected snapshot, the key range's column
    when the chunks' statistics put every row in the range (no range filter runs) and nothing
    else reads it. `_with_time` restores ``_time`` where a caller needs the column."""
    schema = task.read_schema()
    q = task.query
    if q.mode != "snapshot":
        return schema
    drop = set()
    if not (ref.max_time > q.max_time or (q.min_time is not None and ref.min_time < q.min_time)):
        drop.add(TIME)
    kr = task.key_range
    if (
        task.columns is not None
        and kr is not None
        and kr.column not in {*task.columns, *task.expression_columns}
    ):
        filtered = task.row_filter is not None and kr.column in task.row_filter.columns()
        if not filtered and _chunks_within(reader, chunks, kr):
            drop.add(kr.column)
    return pa.schema([f for f in schema if f.name not in drop]) if drop else schema


def _with_time(table: pa.Table, ref: PartRef) -> pa.Table:
    """``table`` with a ``_time`` column: its own, or (left undecoded by `_slice_schema`, whose
    snapshot answers drop it) the part's time, so every slice of a task has one schema."""
    if TIME in table.column_names:
        return table
    time = ref.rewrite_time if ref.rewrite_time is not None else ref.max_time
    times = pa.array(np.full(table.num_rows, time, dtype=np.int64))
    return table.append_column(pa.field(TIME, pa.int64(), nullable=False), times)


def _present(reader: PartReader, schema: pa.Schema) -> list[str] | None:
    """The columns of ``schema`` that part ``reader`` stores (None: all of its columns, when
    ``schema`` asks for them all); columns added to the shard later read as nulls."""
    names = set(reader.schema.names)
    wanted = [f.name for f in schema if f.name in names]
    return None if len(wanted) == len(names) else wanted


def read_task(
    blob: Blob, task: ReadTask, *, as_multiset: bool = False, readers: Readers | None = None
) -> pa.Table:
    """The answer of one task: for a snapshot, rows + ``_diff`` (one row per distinct row,
    zero sums dropped); for updates, rows + ``_time`` + ``_diff`` consolidated per
    (row, forwarded time), sorted.

    With ``as_multiset`` (a snapshot whose rows will be repeated by their diffs), rows may
    repeat when every diff is positive: repeating each update by its diff gives the same
    multiset as repeating each consolidated row by its summed diff, so the sort is skipped.
    """
    q = task.query
    table = load_updates(blob, task, readers)
    if q.mode == "snapshot":
        s = task.slices
        distinct = not task.projects
        if distinct and len(s) == 1 and s[0].ref.min_time == s[0].ref.max_time:
            # One consolidated part at one time: rows are already distinct and sorted.
            return table.drop_columns([TIME])
        if as_multiset and (table.num_rows == 0 or pc.min(table.column(DIFF)).as_py() > 0):
            return table.drop_columns([TIME])
        return snapshot_of(table)
    table = advance_times(table, q.since)
    times = table.column(TIME)
    table = table.filter(pc.and_(pc.greater_equal(times, q.lo), pc.less(times, q.hi)))
    return consolidate(table)


def _positive_diffs(reader: PartReader, chunks: Sequence[int]) -> bool:
    """Whether every update of ``chunks`` has a positive diff, by their statistics."""
    for c in chunks:
        st = chunk_stats(reader, c, DIFF)
        if st is None or st[0] is None or st[2] or not st[0] > 0:
            return False
    return True


def _unit_diffs(reader: PartReader, chunks: Sequence[int]) -> bool:
    """Whether every update of ``chunks`` has diff exactly 1, by their statistics."""
    for c in chunks:
        st = chunk_stats(reader, c, DIFF)
        if st is None or st[2] or st[0] != 1 or st[1] != 1:
            return False
    return True


def iter_task(
    blob: Blob,
    task: ReadTask,
    *,
    as_multiset: bool = False,
    readers: Readers | None = None,
    omit_unit_diffs: bool = False,
) -> Iterator[pa.Table]:
    """`read_task`'s answer in pieces, one per chunk (`chunk_jobs`, decoded a few chunks
    ahead of the consumer by `run_ahead`), when no row of one chunk needs another chunk's rows
    to be consolidated; otherwise the whole answer as one piece. Pieces carry no ``_time``,
    like `read_task`'s snapshots, and empty pieces are not yielded."""
    jobs = chunk_jobs(
        blob, task, as_multiset=as_multiset, readers=readers, omit_unit_diffs=omit_unit_diffs
    )
    if jobs is None:
        yield read_task(blob, task, as_multiset=as_multiset, readers=readers)
        return
    for table in run_ahead(jobs):
        if table.num_rows:
            yield table


#: One piece of a read's answer, computed when called: with ``True`` in a thread that decodes
#: the piece itself (the caller runs several at once), with ``False`` alone (it may then
#: decode a chunk's columns in the format's pool).
Job = Callable[[bool], _T]


def chunk_jobs(
    blob: Blob,
    task: ReadTask,
    *,
    as_multiset: bool = False,
    readers: Readers | None = None,
    omit_unit_diffs: bool = False,
) -> list[Job[pa.Table]] | None:
    """`read_task`'s answer as one job per chunk, in answer order, when no row of one chunk
    needs another chunk's rows to be consolidated: a snapshot of one part at one time
    (consolidated when written), or (with ``as_multiset``) a snapshot whose chunks' statistics
    say every diff is positive. None when the task must be read whole (`read_task`). Opens the
    task's footers now (in ``readers``); each job fetches and decodes its chunk when called,
    so memory stays near one chunk per job under way. A job's piece has no ``_time`` and may
    be empty (the chunk's rows all filtered out).

    With ``omit_unit_diffs`` (and ``as_multiset``), the pieces of a part slice whose chunks'
    statistics prove every diff is exactly 1 come *without* ``_diff``: that column is then
    never fetched nor decoded, and the caller reads a missing ``_diff`` as all ones."""
    q = task.query
    if q.mode != "snapshot" or not task.slices:
        return None
    opened = _open_all(blob, [s.ref for s in task.slices], readers)
    chunks = [
        _wanted_chunks(r, s.ref, s.chunks, q, task.row_filter)
        for r, s in zip(opened, task.slices, strict=True)
    ]
    one = (
        not task.projects
        and len(task.slices) == 1
        and task.slices[0].ref.min_time == task.slices[0].ref.max_time
    )
    if not one and not (
        as_multiset and all(_positive_diffs(r, c) for r, c in zip(opened, chunks, strict=True))
    ):
        return None
    out_names = [n for n in task.output_schema().names if n != TIME]
    jobs: list[Job[pa.Table]] = []
    for s, reader, wanted in zip(task.slices, opened, chunks, strict=True):
        schema = _slice_schema(task, reader, s.ref, wanted)
        names = out_names
        if omit_unit_diffs and as_multiset and _unit_diffs(reader, wanted):
            schema = pa.schema([f for f in schema if f.name != DIFF])
            names = [n for n in out_names if n != DIFF]
        columns = _present(reader, schema)
        jobs.extend(
            functools.partial(_chunk_piece, task, s.ref, reader, index, columns, schema, names)
            for index in wanted
        )
    return jobs


def _chunk_piece(
    task: ReadTask,
    ref: PartRef,
    reader: PartReader,
    index: int,
    columns: list[str] | None,
    schema: pa.Schema,
    names: list[str],
    in_thread: bool,
) -> pa.Table:
    """One chunk of a `chunk_jobs` job: decoded, adapted to ``schema``, restricted to the
    task's times, range and filters, ``names`` selected."""
    batch = reader.read_chunk(index, columns, in_thread=in_thread)
    table = adapt_part_table(pa.Table.from_batches([batch]), ref, schema)
    return _restrict(table, task, ref, reader, [index]).select(names)


#: Threads that compute the pieces of streamed reads (`run_ahead`).
READ_THREADS = WORKERS
#: Pieces `run_ahead` computes ahead of its consumer by default: twice its threads, so a
#: thread that finishes a small chunk starts the next one while a large one before it is
#: still decoding (with one per thread it waited for that). A streamed read holds at most one
#: more decoded piece than this.
READ_AHEAD = 2 * READ_THREADS
#: Threads that compute the jobs of streamed reads. Its work may wait on the format's pool
#: (a task read whole decodes there), never on this pool.
_READ_POOL = SharedPool("persistshard-read", READ_THREADS)


def run_ahead(jobs: Sequence[Job[_T]], ahead: int = READ_AHEAD) -> Iterator[_T]:
    """Each job's result, in the jobs' order, computed up to ``ahead`` jobs ahead of the
    consumer in the read pool (each in a copy of the caller's context, so the requests it
    makes count into the caller's operation). A single job runs in the calling thread. A job's
    error reaches the consumer when its result is due; when the consumer stops early (or a
    job fails), the jobs not yet started are cancelled and those under way are waited for, so
    no work of the read outlives it."""
    if len(jobs) == 1:
        yield jobs[0](False)
        return
    pool = _READ_POOL.get()
    window: deque[Future[_T]] = deque()
    try:
        for job in jobs:
            window.append(pool.submit(run_in_context(job), True))
            if len(window) > ahead:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    finally:
        for future in window:
            future.cancel()
        wait(window)


@dataclass(frozen=True)
class DirectSlice:
    """A part slice whose stored rows *are* its share of a snapshot read's answer: what a
    reader without consolidation (the JVM companion) may decode and hand over as is.
    Exactly one of: ``path``, the part's file on this machine; ``url``, the part's URL for
    Hadoop's file systems (`FsspecBlob.hadoop_url`, never with credentials); ``inline``, the
    bytes of an inline part. ``chunks`` the chunks to read, in file order."""

    key: str
    path: str | None
    inline: bytes | None
    chunks: tuple[int, ...]
    url: str | None = None


def direct_slices(
    blob: Blob,
    task: ReadTask,
    accepts: Callable[[pa.Schema], bool],
    hadoop_schemes: Collection[str] = (),
) -> list[DirectSlice] | None:
    """The slices of ``task`` as `DirectSlice`s when its answer, rows repeated by their
    counts, is exactly the rows its chunks store (restricted to its output columns); None
    when it needs anything more. That holds for a snapshot without ``with_diff``, key range,
    filter or expression, whose every part is at or before the snapshot's time (no time
    filter), a local file, inline, or at a Hadoop URL whose scheme is in ``hadoop_schemes``
    (the schemes the reader can open; a part of another shard: None), and whose chunks'
    statistics prove every diff is exactly 1 (no repetition, no consolidation). ``accepts``
    decides, from a part's stored schema, whether its columns can be handed over as stored
    (the task's output columns must all be in the part: a column added later reads as
    nulls, which only the Python reader does). Opens the task's footers (in ``blob``) only
    when every part can be opened by the reader: a read that goes to Python anyway costs no
    request more."""
    q = task.query
    if (
        q.mode != "snapshot"
        or q.with_diff
        or task.key_range is not None
        or task.row_filter is not None
        or task.row_expression is not None
    ):
        return None
    local = getattr(blob, "local_file", None)
    hadoop = getattr(blob, "hadoop_url", None)
    where: list[tuple[str | None, str | None]] = []
    for s in task.slices:
        ref = s.ref
        if ref.max_time > q.as_of or ref.source is not None:
            return None
        path = url = None
        if ref.inline is None:
            path = local(ref.key) if local is not None else None
            url = hadoop(ref.key) if path is None and hadoop is not None else None
            if url is not None and url.partition(":")[0] not in hadoop_schemes:
                log.debug("part %s: no Hadoop file system for %s here", ref.key, url)
                return None
            if path is None and url is None:
                return None
        where.append((path, url))
    out: list[DirectSlice] = []
    for s, (path, url) in zip(task.slices, where, strict=True):
        ref = s.ref
        reader = _open(blob, ref, None)
        chunks = _wanted_chunks(reader, ref, s.chunks, q, None)
        if not _unit_diffs(reader, chunks) or not accepts(reader.schema):
            return None
        out.append(DirectSlice(ref.key, path, ref.inline, tuple(chunks), url))
    return out


def read_query(blob: Blob, state: ShardState, q: Query) -> pa.Table:
    """The whole answer of ``q`` in this process (one task)."""
    return read_task(blob, plan_read(blob, state, q, max_partitions=1)[0])


def read_times(
    blob: Blob, state: ShardState, *, min_time: int | None, max_time: int | None
) -> pa.Table:
    """Every stored update of ``state`` with time in ``[min_time, max_time]`` (inclusive,
    optional bounds; never past ``upper - 1``), unconsolidated, times not forwarded."""
    assert state.schema is not None
    hi = state.upper - 1 if max_time is None else min(max_time, state.upper - 1)
    refs = parts_in_times(state, min_time, max_time)
    q = Query("updates", lo=min_time or 0, hi=hi + 1, since=-1)
    slices = tuple(PartSlice(r, None) for r in refs)
    return load_updates(blob, ReadTask(slices, None, q, update_schema(state.schema)))


# --- shaping answers -----------------------------------------------------------------------


def expand_rows(table: pa.Table, location: str | None, as_of: int) -> pa.Table:
    """Repeat each row by its diff (a snapshot without ``_diff``); negative is an error."""
    diffs = table.column(DIFF).to_numpy()
    rows = table.drop_columns([DIFF])
    if diffs.size == 0 or bool((diffs == 1).all()):
        return rows
    negative = np.flatnonzero(diffs < 0)
    if negative.size:
        first = table.slice(int(negative[0]), 1).to_pylist()[0]
        raise NegativeDiff(
            f"{negative.size} rows have a negative count at as_of {as_of}, for example "
            f"{first}; read with option('with_diff', True) to see the diffs",
            location=location,
        )
    repeat = pa.array(np.repeat(np.arange(len(diffs), dtype=np.int64), diffs))
    if rows.num_columns == 0:  # a read of no columns (a count): rows without columns keep
        return table.take(repeat).drop_columns([DIFF])  # their number only this way
    return rows.take(repeat)


def with_snapshot_time(table: pa.Table, q: Query) -> pa.Table:
    """A snapshot's rows as updates at ``as_of`` (adds ``_time``); other results unchanged."""
    if q.mode != "snapshot" or TIME in table.column_names:
        return table
    times = pa.array(np.full(table.num_rows, q.as_of, dtype=np.int64))
    return table.append_column(pa.field(TIME, pa.int64(), nullable=False), times)


# --- statistics for people -----------------------------------------------------------------


def column_statistics(blob: Blob, state: ShardState) -> dict[str, dict[str, Any]]:
    """Per column of ``state``'s parts (trace and unsealed): ``min`` and ``max`` over the
    chunks that keep bounds, ``null_count``, ``chunks`` and ``chunks_with_bounds`` (for
    `persistshard inspect`). Reads one footer per part. Version 1 parts contribute only the
    sort column; a column whose bounds no chunk keeps has min and max None."""
    if state.schema is None:
        return {}
    refs = [p for b in (*state.trace, *state.unsealed) for p in b.parts if p.num_rows]

    out: dict[str, dict[str, Any]] = {
        name: {"min": None, "max": None, "null_count": 0, "chunks": 0, "chunks_with_bounds": 0}
        for name in update_schema(state.schema).names
    }
    for reader in _open_all(blob, refs) if refs else []:
        for index in range(len(reader.chunks)):
            for name, entry in out.items():
                entry["chunks"] += 1
                st = chunk_stats(reader, index, name)
                if st is None:
                    continue
                lo, hi, nulls = st
                entry["null_count"] += nulls
                if lo is None:
                    continue
                entry["chunks_with_bounds"] += 1
                entry["min"] = lo if entry["min"] is None else min(entry["min"], lo)
                entry["max"] = hi if entry["max"] is None else max(entry["max"], hi)
    return out
