"""Correction: the buffer in which a write task stashes and consolidates its updates.

A Spark write task (or a streaming writer) inserts ``(row, time, diff)`` updates in any order
and later asks for the consolidated updates before some ``upper`` (to write them out) and the
ones from that ``upper`` on (still unsealed). Updates are never removed directly: a
retraction is inserted and the two consolidate away.

Where updates live. Every stored update belongs to exactly one place:

- the *stage*: small inserts, unsorted, fewer than ``chunk_bytes`` of them. Once a chunk's
  worth has gathered they are sorted, consolidated and routed to the places below.
- the *buckets*: times at or beyond the ``boundary`` (the largest ``upper`` read so far).
  The buckets cover ``[boundary, 2**63)`` without gaps; each covers an aligned power-of-two
  range of times and the ranges never shrink going up, so they grow exponentially away from
  the boundary. Each bucket holds a list of chains.
- ``pending_low``: chains of times below the boundary (inserts arriving late, and whatever
  of the previous read lay at or beyond a later, smaller ``upper``).
- ``emitted``: one chain, the result of the last read (times below that read's upper).
- the *spilled* runs: chains written to local Arrow IPC files once the in-memory size passed
  ``budget_bytes``; they may hold any times.

A *chain* is a list of chunks (Arrow record batches of at most about ``chunk_bytes``); all the
updates of a chain are sorted by (time, row) and consolidated (no two share (row, time), no
diff is zero). Order and equality of rows are those of `persistshard.core.rows` (the one
rule: NaNs equal, ``-0.0 != 0.0``, nulls equal, nested values by canonical encoding).

Invariants kept after every public call (`Correction.check_invariants` verifies them):

- the chain invariant: in every bucket, in ``pending_low`` and among the spilled runs, each
  chain holds at least ``chain_proportionality`` times as many updates as the next one
  (counted in updates, not chunks). Inserting a chain merges chains at the tail until it
  holds again, so an update takes part in O(log N) merges: inserts are amortized O(log N).
- placement: bucket chains hold only times inside their bucket's range, ``pending_low`` and
  ``emitted`` only times below the boundary.
- the stage holds fewer than ``chunk_bytes`` bytes.
- the stored collection, with every time below ``since`` advanced to ``since``, equals the
  inserted collection advanced the same way. Stored times may lag behind ``since``; reads
  advance them (merging one sub-chain per stale time when there are few such times, and
  advancing, sorting and consolidating the stale updates in one pass when there are many).

Reads. ``updates_before(upper)`` peels the buckets below ``upper`` (splitting the one that
straddles it into aligned halves), splits ``pending_low``, ``emitted`` and the spilled runs at
``upper`` and merges the parts below into the new ``emitted``. Chains are sorted by time
first, so a split only looks at chunk boundaries and one chunk; buckets at or beyond
``upper`` are not touched at all, however many updates (far-future retractions) they hold.

Memory. Without a budget everything stays in memory. With ``budget_bytes``, when the
in-memory size passes the budget the largest chains are written to Arrow IPC files under
``spill_dir`` (a fresh temporary directory inside it, or inside the system's temporary
directory) until it is back under half the budget. Reads merge spilled runs back with a
streaming k-way merge that holds a bounded slice of each run at a time; a read whose result
is larger than half the budget writes that result (the new ``emitted``) to a file too.
``size_bytes`` counts the updates held; a merge needs working memory on top (its output,
about the size of its inputs), and a read of spilled runs with many distinct stale times
loads their stale part into memory. Spill files are deleted once no chain refers to them, on
`Correction.close`, and when the object is garbage collected; the spill directories of
processes that were killed (the pid in the directory's name no longer runs) are deleted by
the next process that spills there (`sweep_stale_spill_dirs`).

Merging. Chains are merged by concatenating them, sorting with `rows.consolidation_indices`
(Arrow's sort, fast on input made of sorted runs) and summing equal updates; the streaming
merge does the same a bounded slice at a time. When merging inside ``pending_low`` or a
bucket, times below ``since`` are advanced as far as the place allows (to ``since``, or to
just below the end of the place's range), which consolidates more and stays exact.

A read ``updates_before(upper)`` with ``upper <= since`` returns nothing: once advanced,
every update is at ``since`` or later.

Assumes: times are non-negative int64, diffs non-zero int64 whose sums fit in int64. Not
thread-safe. Iterators returned by reads see the state at the time of the call and stay
valid after later calls.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core import rows
from persistshard.errors import InvalidUpdates

log = logging.getLogger("persistshard.core.write.correction")

TIME_END = 1 << 63
"""One past the largest time: buckets cover ``[boundary, TIME_END)``."""

#: Spill directories are named ``<prefix><pid of their process>-<random>``.
SPILL_PREFIX = "persistshard-correction-"

_swept: set[str] = set()


def _pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` runs on this host (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_spill_dir(owner: object, parent: str | None) -> tuple[str, weakref.finalize[Any, Any]]:
    """A new spill directory for ``owner`` under ``parent`` (the system's temporary directory
    when None), named after this process so a later sweep knows whose it is, after sweeping
    the directories of dead processes there; removed by the returned finalizer, or when
    ``owner`` is collected."""
    sweep_stale_spill_dirs(parent)
    path = tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=parent)
    return path, weakref.finalize(owner, shutil.rmtree, path, ignore_errors=True)


def sweep_stale_spill_dirs(parent: str | None = None) -> list[str]:
    """Delete the spill directories under ``parent`` (default: the system's temporary
    directory) whose process no longer runs on this host: a process killed mid-write leaves
    its spill files, nothing else ever deletes them. Runs once per directory per process (on
    the first spill); returns what it deleted. A directory whose pid is reused by a live
    process is kept (safe side), and names without a pid are never touched."""
    parent = parent if parent is not None else tempfile.gettempdir()
    if parent in _swept:
        return []
    _swept.add(parent)
    deleted: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return deleted
    for name in names:
        if not name.startswith(SPILL_PREFIX):
            continue
        pid_text = name[len(SPILL_PREFIX) :].partition("-")[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    if deleted:
        log.info("deleted %d spill directories of processes that died: %s", len(deleted), deleted)
    return deleted


STALE_SUBCHAIN_LIMIT = 8
"""Up to this many distinct stale times, reads merge one sub-chain per stale time."""


def _delete_file(path: str, holder: list[pa.NativeFile | None]) -> None:
    source = holder[0]
    holder[0] = None
    if source is not None:
        source.close()
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class _SpillFile:
    """One Arrow IPC file holding one spilled chain; deleted once nothing refers to it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._source: list[pa.NativeFile | None] = [None]
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self._finalizer = weakref.finalize(self, _delete_file, path, self._source)

    def batch(self, index: int) -> pa.RecordBatch:
        if self._reader is None:
            source = pa.memory_map(self.path)
            self._source[0] = source
            self._reader = pa.ipc.open_file(source)
        return self._reader.get_batch(index)


@dataclass(slots=True, eq=False)
class _Seg:
    """One chunk of a chain: a record batch in memory, or rows of a batch in a spill file."""

    first: int
    last: int
    rows: int
    size: int
    batch: pa.RecordBatch | None = None
    file: _SpillFile | None = None
    index: int = 0
    start: int = 0

    @staticmethod
    def of(batch: pa.RecordBatch) -> _Seg:
        times = batch.column(rows.TIME).to_numpy()
        return _Seg(int(times[0]), int(times[-1]), batch.num_rows, batch.nbytes, batch)

    def load(self) -> pa.RecordBatch:
        if self.batch is not None:
            return self.batch
        assert self.file is not None
        return self.file.batch(self.index).slice(self.start, self.rows)

    def cut(self, k: int, times: np.ndarray) -> tuple[_Seg, _Seg]:
        """The first ``k`` rows and the rest; ``times`` are this segment's times."""
        share = self.size * k // self.rows
        if self.batch is not None:
            return _Seg.of(self.batch.slice(0, k)), _Seg.of(self.batch.slice(k))
        low = _Seg(self.first, int(times[k - 1]), k, share, None, self.file, self.index, self.start)
        high = _Seg(
            int(times[k]),
            self.last,
            self.rows - k,
            self.size - share,
            None,
            self.file,
            self.index,
            self.start + k,
        )
        return low, high


@dataclass(slots=True, eq=False)
class _Chain:
    """Updates sorted by (time, row) and consolidated, as a list of chunks.

    ``advance`` (when set) forwards every time below it as the chunks are loaded; it is only
    set on sub-chains whose times are all equal, so they stay sorted.
    """

    segs: list[_Seg] = field(default_factory=list)
    advance: int | None = None

    def __len__(self) -> int:
        return sum(s.rows for s in self.segs)

    @property
    def first(self) -> int:
        return self.segs[0].first

    @property
    def last(self) -> int:
        return self.segs[-1].last

    @property
    def nbytes(self) -> int:
        """Bytes held in memory."""
        return sum(s.size for s in self.segs if s.batch is not None)

    @property
    def size(self) -> int:
        """Bytes of the data, in memory or on disk."""
        return sum(s.size for s in self.segs)

    @property
    def on_disk(self) -> bool:
        return any(s.batch is None for s in self.segs)

    def split_at(self, t: int) -> tuple[_Chain, _Chain]:
        """The updates at times below ``t`` and the rest; loads at most one chunk."""
        i = bisect.bisect_left([s.last for s in self.segs], t)
        low, high = self.segs[:i], self.segs[i:]
        if high and high[0].first < t:
            seg = high[0]
            times = seg.load().column(rows.TIME).to_numpy()
            k = int(np.searchsorted(times, t, side="left"))
            a, b = seg.cut(k, times)
            low = [*low, a]
            high = [b, *high[1:]]
        return _Chain(low, self.advance), _Chain(high, self.advance)

    def times_below(self, t: int) -> np.ndarray:
        """The distinct times below ``t`` (loads the chunks that start below it)."""
        found = []
        for seg in self.segs:
            if seg.first >= t:
                break
            times = seg.load().column(rows.TIME).to_numpy()
            found.append(np.unique(times[times < t]))
        if not found:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(found))

    def batches(self) -> Iterator[pa.RecordBatch]:
        for seg in self.segs:
            yield self._advanced(seg.load())

    def _advanced(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.advance is None:
            return batch
        table = rows.advance_times(pa.Table.from_batches([batch]), self.advance)
        return table.combine_chunks().to_batches()[0]


@dataclass(slots=True, eq=False)
class _Bucket:
    """The chains at times in ``[lower, upper)``, an aligned power-of-two range."""

    lower: int
    upper: int
    chains: list[_Chain] = field(default_factory=list)


class Correction:
    """A buffer of ``(row, time, diff)`` updates that consolidates them and reads them by time.

    ``schema`` holds the user's row columns plus ``_time`` and ``_diff`` (int64). Inserts
    accept any order and any non-zero diffs at times ``>= 0``. ``updates_before(upper)``
    returns the consolidated updates at times below ``upper`` (after advancing times to
    ``since``), sorted by (time, row), in record batches of about ``chunk_bytes``; those
    updates stay in the buffer (as ``emitted``) until retractions consolidate them away.
    ``updates_from(lower)`` returns those at ``lower`` and beyond, without changing the
    buffer. The invariants (chain proportionality, placement by time relative to the
    boundary, bounded stage) are in the module docstring and checked by `check_invariants`.

    With ``budget_bytes``, the in-memory size stays near the budget: the largest chains spill
    to Arrow IPC files and reads merge them back chunk by chunk. ``chunk_bytes`` is lowered to
    an eighth of the budget when the budget is that small.
    """

    def __init__(
        self,
        schema: pa.Schema,
        *,
        chunk_bytes: int = 4 << 20,
        chain_proportionality: int = 3,
        budget_bytes: int | None = None,
        spill_dir: str | None = None,
    ) -> None:
        for name in rows.SYSTEM_COLUMNS:
            index = schema.get_field_index(name)
            if index < 0 or schema.field(index).type != pa.int64():
                raise InvalidUpdates(
                    f"Correction needs an int64 column {name!r} in its schema, "
                    f"got ({_describe(schema)})"
                )
        if chain_proportionality < 2:
            raise ValueError(
                f"Correction: chain_proportionality must be at least 2, got {chain_proportionality}"
            )
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"Correction: budget_bytes must be positive, got {budget_bytes}")
        self._schema = schema
        self._columns = rows.row_columns(schema)
        self._budget = budget_bytes
        self._chunk_bytes = max(1, chunk_bytes)
        if budget_bytes is not None:
            self._chunk_bytes = max(1, min(self._chunk_bytes, budget_bytes // 8))
        self._proportionality = chain_proportionality
        self._spill_parent = spill_dir
        self._spill_path: str | None = None
        self._spill_cleanup: weakref.finalize[Any, Any] | None = None
        self._spill_names = itertools.count()
        self._since = 0
        self._boundary = 0
        self._stage: list[pa.Table] = []
        self._stage_bytes = 0
        self._buckets = _initial_buckets(0)
        self._pending_low: list[_Chain] = []
        self._emitted = _Chain()
        self._spilled: list[_Chain] = []
        # Counters of the work done, for tests and benchmarks.
        self.stats: dict[str, int] = {
            "merges": 0,
            "subchain_merges": 0,
            "materialized_merges": 0,
            "spilled_runs": 0,
            "streaming_merges": 0,
        }

    # -- public API ---------------------------------------------------------------------------

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def since(self) -> int:
        return self._since

    @property
    def boundary(self) -> int:
        """The largest ``upper`` read so far; the buckets hold the times at or beyond it."""
        return self._boundary

    def insert(self, updates: pa.Table | pa.RecordBatch) -> None:
        """Stash ``updates`` (any order; diffs non-zero; times ``>= 0``)."""
        table = self._validated(updates)
        if table.num_rows == 0:
            return
        self._stage.append(table)
        self._stage_bytes += table.nbytes
        if self._stage_bytes >= self._chunk_bytes:
            self._flush_stage()
            self._maybe_spill()

    def advance_since(self, since: int) -> None:
        """Allow times below ``since`` to be forwarded to it; never moves back."""
        self._since = max(self._since, int(since))

    def consolidate_before(self, upper: int) -> None:
        """Merge every update at a time below ``upper`` into ``emitted``.

        With ``upper <= since`` nothing is below ``upper`` once advanced, so nothing happens.
        """
        upper = int(upper)
        self._flush_stage()
        if upper <= self._since:
            self._maybe_spill()
            return
        parts: list[_Chain] = []
        kept_low: list[_Chain] = []
        kept_spilled: list[_Chain] = []
        for chain in [self._emitted, *self._pending_low]:
            low, high = chain.split_at(upper)
            parts.append(low)
            (kept_spilled if high.on_disk else kept_low).append(high)
        for chain in self._spilled:
            low, high = chain.split_at(upper)
            parts.append(low)
            kept_spilled.append(high)
        if upper > self._boundary:
            parts.extend(self._peel(upper))
            self._boundary = upper
        self._pending_low = self._restored(kept_low, self._pending_low_advance())
        self._spilled = []
        for chain in sorted((c for c in kept_spilled if c.segs), key=len, reverse=True):
            self._push_spilled(chain)
        runs = self._advanced_runs([p for p in parts if p.segs], self._since)
        self._emitted = self._merge(runs, may_spill=True)
        self._maybe_spill()

    def updates_before(self, upper: int) -> Iterator[pa.RecordBatch]:
        """Consolidated updates at times below ``upper``, sorted by (time, row).

        The consolidation happens in this call; the iterator only reads ``emitted``.
        """
        self.consolidate_before(upper)
        if int(upper) <= self._since:
            return iter(())
        return self._emitted.batches()

    def updates_from(self, lower: int) -> Iterator[pa.RecordBatch]:
        """Consolidated updates at times ``>= lower``, sorted by (time, row); a pure read.

        The merge happens as the iterator is consumed; with a budget it streams, holding a
        bounded slice of each chain at a time.
        """
        lower = int(lower)
        self._flush_stage()
        self._maybe_spill()
        everything = lower <= self._since
        runs: list[_Chain] = []
        sources = [self._emitted, *self._pending_low, *self._spilled]
        sources += [c for b in self._buckets if everything or b.upper > lower for c in b.chains]
        for chain in sources:
            if not chain.segs:
                continue
            if everything or chain.first >= lower:
                runs.append(chain)
            else:
                runs.append(chain.split_at(lower)[1])
        runs = self._advanced_runs([r for r in runs if r.segs], self._since)
        return self._merged_batches(runs)

    def __len__(self) -> int:
        staged: int = sum(t.num_rows for t in self._stage)
        return staged + sum(len(c) for c in self._all_chains())

    @property
    def size_bytes(self) -> int:
        """Bytes of updates held in memory (stage and in-memory chunks, not spilled runs)."""
        return self._stage_bytes + sum(c.nbytes for c in self._all_chains())

    @property
    def spilled_bytes(self) -> int:
        """Bytes of updates in spill files (as Arrow sizes them in memory)."""
        return sum(c.size - c.nbytes for c in self._all_chains())

    def close(self) -> None:
        """Drop every update and delete the spill files."""
        self._stage = []
        self._stage_bytes = 0
        self._buckets = _initial_buckets(self._boundary)
        self._pending_low = []
        self._emitted = _Chain()
        self._spilled = []
        if self._spill_cleanup is not None:
            self._spill_cleanup()
            self._spill_cleanup = None
            self._spill_path = None

    def __enter__(self) -> Correction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def check_invariants(self, *, deep: bool = True) -> None:
        """Raise AssertionError unless every invariant of the module docstring holds.

        ``deep`` also loads every chain to check it is sorted and consolidated.
        """
        assert self._stage_bytes < self._chunk_bytes, "stage holds a chunk's worth"
        assert self._stage_bytes == sum(t.nbytes for t in self._stage)
        assert self._buckets, "no buckets"
        assert self._buckets[0].lower == self._boundary, "buckets do not start at boundary"
        assert self._buckets[-1].upper == TIME_END, "buckets do not reach the end of time"
        width = 0
        for i, bucket in enumerate(self._buckets):
            w = bucket.upper - bucket.lower
            assert w > 0 and w & (w - 1) == 0, f"bucket width {w} is not a power of two"
            assert bucket.lower % w == 0, f"bucket [{bucket.lower}, {bucket.upper}) unaligned"
            assert w >= width, "bucket widths shrink"
            width = w
            if i:
                assert self._buckets[i - 1].upper == bucket.lower, "buckets leave a gap"
            self._check_chains(bucket.chains, bucket.lower, bucket.upper, deep)
        self._check_chains(self._pending_low, 0, self._boundary, deep)
        if self._emitted.segs:
            self._check_chains([self._emitted], 0, self._boundary, deep, proportional=False)
        self._check_chains(self._spilled, 0, TIME_END, deep)
        assert all(c.on_disk for c in self._spilled), "a spilled run is in memory"
        in_memory = [*self._pending_low, *(c for b in self._buckets for c in b.chains)]
        assert not any(c.on_disk for c in in_memory), "an on-disk chain outside spilled runs"

    # -- internals ----------------------------------------------------------------------------

    def _all_chains(self) -> Iterator[_Chain]:
        yield self._emitted
        yield from self._pending_low
        yield from self._spilled
        for bucket in self._buckets:
            yield from bucket.chains

    def _check_chains(
        self, chains: list[_Chain], lower: int, upper: int, deep: bool, proportional: bool = True
    ) -> None:
        for i, chain in enumerate(chains):
            assert chain.segs, "an empty chain is kept"
            assert chain.advance is None, "a stored chain has a pending advance"
            assert lower <= chain.first and chain.last < upper, (
                f"chain times [{chain.first}, {chain.last}] outside [{lower}, {upper})"
            )
            if proportional and i:
                assert len(chains[i - 1]) >= self._proportionality * len(chain), (
                    f"chain invariant broken: {[len(c) for c in chains]}"
                )
            for seg in chain.segs:
                assert seg.rows > 0
                if seg.batch is not None:
                    assert seg.rows == 1 or seg.size <= 4 * self._chunk_bytes, "chunk too big"
            if deep:
                table = pa.Table.from_batches(list(chain.batches()), schema=self._schema)
                times = table.column(rows.TIME).to_numpy()
                assert times[0] == chain.first and times[-1] == chain.last
                order = rows.sort_indices(table, self._columns, "time_row").to_numpy()
                assert (order == np.arange(table.num_rows)).all(), "chain not sorted"
                kept, _ = rows.consolidation_indices(
                    table, self._columns, order="time_row", presorted=True
                )
                assert len(kept) == table.num_rows, "chain not consolidated"

    def _validated(self, updates: pa.Table | pa.RecordBatch) -> pa.Table:
        table = pa.Table.from_batches([updates]) if isinstance(updates, pa.RecordBatch) else updates
        if not table.schema.equals(self._schema):
            try:
                table = table.select(self._schema.names).cast(self._schema)
            except (
                KeyError,
                ValueError,
                TypeError,
                pa.ArrowInvalid,
                pa.ArrowNotImplementedError,
            ) as e:
                raise InvalidUpdates(
                    f"Correction: updates have columns ({_describe(table.schema)}), "
                    f"expected ({_describe(self._schema)}): {e}"
                ) from e
        if table.num_rows == 0:
            return table
        time = table.column(rows.TIME)
        diff = table.column(rows.DIFF)
        if time.null_count or diff.null_count:
            raise InvalidUpdates("Correction: updates have null _time or _diff values")
        times = time.to_numpy()
        lowest = int(times.min())
        if lowest < 0:
            raise InvalidUpdates(f"Correction: negative time {lowest} in updates")
        if not diff.to_numpy().all():
            raise InvalidUpdates("Correction: updates have a zero _diff")
        return table
        time = table.column(rows.TIME)
        diff = table.column(rows.DIFF)
        if time.null_count or diff.null_count:
            raise InvalidUpdates("Correction: updates have null _time or _diff values")
        if pc.min(time).as_py() < 0:
            raise InvalidUpdates(f"Correction: negative time {pc.min(time).as_py()} in updates")
        if not pc.all(pc.not_equal(diff, 0)).as_py():
            raise InvalidUpdates("Correction: updates have a zero _diff")
        return table

    def _flush_stage(self) -> None:
        if not self._stage:
            return
        table = pa.concat_tables(self._stage)
        self._stage = []
        self._stage_bytes = 0
        self._route(self._consolidated(table))

    def _route(self, chain: _Chain) -> None:
        """Hand a sorted, consolidated chain to pending_low and the buckets by time."""
        if not chain.segs:
            return
        low, chain = chain.split_at(self._boundary)
        if low.segs:
            self._push(self._pending_low, low, self._pending_low_advance())
        for bucket in self._buckets:
            if not chain.segs:
                break
            if chain.first >= bucket.upper:
                continue
            part, chain = chain.split_at(bucket.upper)
            self._push(bucket.chains, part, self._bucket_advance(bucket))

    def _pending_low_advance(self) -> int | None:
        target = min(self._since, self._boundary - 1)
        return target if target > 0 else None

    def _bucket_advance(self, bucket: _Bucket) -> int | None:
        return min(self._since, bucket.upper - 1) if self._since > bucket.lower else None

    def _push(self, chains: list[_Chain], chain: _Chain, advance: int | None) -> None:
        """Append ``chain`` and merge tail chains until the chain invariant holds.

        Where merging the last two would only make the tail violate the invariant with the
        chain before it (a cascade), the whole tail that the cascade would reach (counting
        updates as if nothing consolidated) is merged at once: one k-way merge instead of a
        pairwise merge per level, which copies the smaller chains once instead of repeatedly.
        """
        if chain.segs:
            chains.append(chain)
        p = self._proportionality
        while len(chains) >= 2 and len(chains[-2]) < p * len(chains[-1]):
            total = len(chains[-1])
            start = len(chains) - 1
            while start >= 1 and len(chains[start - 1]) < p * total:
                start -= 1
                total += len(chains[start])
            runs = chains[start:]
            del chains[start:]
            if advance is not None:
                runs = self._advanced_runs(runs, advance)
            merged = self._merge(runs, may_spill=False)
            if merged.segs:
                chains.append(merged)

    def _restored(self, chains: Iterable[_Chain], advance: int | None) -> list[_Chain]:
        """The non-empty in-memory ``chains``, largest first, merged to keep the invariant."""
        result: list[_Chain] = []
        for chain in sorted((c for c in chains if c.segs), key=len, reverse=True):
            self._push(result, chain, advance)
        return result

    def _peel(self, upper: int) -> list[_Chain]:
        """Remove and return the bucket chains below ``upper``; split the straddling bucket."""
        peeled: list[_Chain] = []
        while self._buckets and self._buckets[0].upper <= upper:
            peeled.extend(self._buckets.pop(0).chains)
        if not self._buckets or self._buckets[0].lower >= upper:
            return peeled
        bucket = self._buckets.pop(0)
        lower, top, chains = bucket.lower, bucket.upper, bucket.chains
        above: list[_Bucket] = []
        while True:
            if top <= upper:
                peeled.extend(chains)
                break
            if lower >= upper:
                above.insert(0, _Bucket(lower, top, chains))
                break
            mid = (lower + top) // 2
            left, right = [], []
            for chain in chains:
                a, b = chain.split_at(mid)
                if a.segs:
                    left.append(a)
                if b.segs:
                    right.append(b)
            if upper <= mid:
                above.insert(0, _Bucket(mid, top, right))
                top, chains = mid, left
            else:
                peeled.extend(left)
                lower, chains = mid, right
        for piece in above:
            piece.chains = self._restored(piece.chains, self._bucket_advance(piece))
        self._buckets[:0] = above
        return peeled

    def _advanced_runs(self, runs: list[_Chain], since: int) -> list[_Chain]:
        """Sorted runs that, merged, equal ``runs`` merged with times advanced to ``since``.

        Few distinct stale times: each run is cut into one sub-chain per stale time (all its
        times equal, so still sorted once advanced) and the rest. Many: the stale parts are
        loaded, advanced, sorted and consolidated in one pass.
        """
        stale = [r for r in runs if r.segs and r.first < since]
        if not stale:
            return runs
        fresh = [r for r in runs if not (r.segs and r.first < since)]
        times = np.unique(np.concatenate([r.times_below(since) for r in stale]))
        if len(times) <= STALE_SUBCHAIN_LIMIT:
            self.stats["subchain_merges"] += 1
            for run in stale:
                rest = run
                for t in times:
                    if not rest.segs or rest.first >= since:
                        break
                    piece, rest = rest.split_at(int(t) + 1)
                    if piece.segs:
                        fresh.append(_Chain(piece.segs, since))
                if rest.segs:
                    fresh.append(rest)
            return fresh
        self.stats["materialized_merges"] += 1
        parts: list[pa.RecordBatch] = []
        for run in stale:
            low, high = run.split_at(since)
            parts.extend(low.batches())
            if high.segs:
                fresh.append(high)
        table = rows.advance_times(pa.Table.from_batches(parts, schema=self._schema), since)
        fresh.append(self._consolidated(table))
        return fresh

    def _consolidated(self, table: pa.Table, presorted: bool = False) -> _Chain:
        """``table`` sorted by (time, row), consolidated and cut into chunks, as a chain."""
        return _Chain([_Seg.of(b) for b in self._consolidated_batches(table, presorted)])

    def _consolidated_batches(
        self, table: pa.Table, presorted: bool = False
    ) -> Iterator[pa.RecordBatch]:
        if table.num_rows == 0:
            return
        indices, diffs = rows.consolidation_indices(
            table, self._columns, order="time_row", presorted=presorted
        )
        if len(indices) == 0:
            return
        if table.column(rows.DIFF).num_chunks > 1:
            table = table.combine_chunks()
        step = max(1, int(self._chunk_bytes * table.num_rows // max(1, table.nbytes)))
        diff_index = self._schema.get_field_index(rows.DIFF)
        for start in range(0, len(indices), step):
            piece = table.take(pa.array(indices[start : start + step]))
            columns = [c.combine_chunks() for c in piece.columns]
            columns[diff_index] = pa.array(diffs[start : start + step], type=pa.int64())
            yield pa.RecordBatch.from_arrays(columns, schema=self._schema)

    def _merge(self, runs: list[_Chain], *, may_spill: bool) -> _Chain:
        """Merge sorted, consolidated runs into one chain (spilled if large and allowed)."""
        runs = [r for r in runs if r.segs]
        if not runs:
            return _Chain()
        self.stats["merges"] += 1
        if len(runs) == 1 and runs[0].advance is None:
            return runs[0]
        total = sum(r.size for r in runs)
        if not any(r.on_disk for r in runs) and (self._budget is None or total <= self._budget):
            return self._merge_in_memory(runs)
        batches = self._merged_batches(runs)
        if not may_spill or self._budget is None:
            return _Chain([_Seg.of(b) for b in batches])
        kept: list[pa.RecordBatch] = []
        kept_bytes = 0
        for batch in batches:
            kept.append(batch)
            kept_bytes += batch.nbytes
            if kept_bytes > self._budget // 2:
                return self._write_spill(itertools.chain(kept, batches))
        return _Chain([_Seg.of(b) for b in kept])

    def _merge_in_memory(self, runs: list[_Chain]) -> _Chain:
        batches = [b for r in runs for b in r.batches()]
        return self._consolidated(pa.Table.from_batches(batches, schema=self._schema))

    def _merged_batches(self, runs: list[_Chain]) -> Iterator[pa.RecordBatch]:
        """The merge of sorted, consolidated runs, as bounded batches; streams from disk."""
        runs = [r for r in runs if r.segs]
        memory = [r for r in runs if not r.on_disk]
        disk = [r for r in runs if r.on_disk]
        if not disk and (self._budget is None or sum(r.size for r in memory) <= self._budget):
            if len(runs) == 1 and runs[0].advance is None:
                return runs[0].batches()
            table = pa.Table.from_batches(
                [b for r in runs for b in r.batches()], schema=self._schema
            )
            return self._consolidated_batches(table)
        if len(memory) > 1:
            memory = [self._merge_in_memory(memory)]
        return self._stream_merge(memory + disk)

    def _stream_merge(self, runs: list[_Chain]) -> Iterator[pa.RecordBatch]:
        """K-way merge of sorted runs holding a bounded slice of each in memory.

        Each round loads more of the run whose loaded part ends lowest (its last loaded
        update is the *bound*): every update not yet loaded is above the bound, so all loaded
        updates at or below it are final and are emitted; the rest wait for the next round.
        """
        self.stats["streaming_merges"] += 1
        budget = self._budget if self._budget is not None else 16 * self._chunk_bytes
        load_bytes = max(self._chunk_bytes, budget // (4 * (len(runs) + 1)))
        cursors = [_Cursor(r) for r in runs]
        waiting = [b for c in cursors for b in c.load(load_bytes)]
        while True:
            live = [c for c in cursors if not c.done]
            if not live:
                if waiting:
                    table = pa.Table.from_batches(waiting, schema=self._schema)
                    yield from self._consolidated_batches(table)
                return
            frontiers = pa.Table.from_batches([c.frontier for c in live], schema=self._schema)
            lowest = int(rows.sort_indices(frontiers, self._columns, "time_row")[0].as_py())
            sentinel = frontiers.slice(lowest, 1)
            table = pa.Table.from_batches(
                [*waiting, *sentinel.to_batches()], schema=self._schema
            ).combine_chunks()
            order = rows.sort_indices(table, self._columns, "time_row").to_numpy()
            cut = int(np.flatnonzero(order == table.num_rows - 1)[0])
            head = table.take(pa.array(order[:cut]))
            rest = table.take(pa.array(order[cut + 1 :]))
            yield from self._consolidated_batches(head, presorted=True)
            waiting = rest.to_batches()
            waiting.extend(live[lowest].load(load_bytes))

    def _maybe_spill(self) -> None:
        """Over budget: write the largest in-memory chains to disk until under half of it."""
        if self._budget is None or self.size_bytes <= self._budget:
            return
        self._flush_stage()
        places: list[tuple[list[_Chain] | None, _Chain]] = [
            (self._pending_low, c) for c in self._pending_low
        ]
        places += [(b.chains, c) for b in self._buckets for c in b.chains]
        if self._emitted.segs and not self._emitted.on_disk:
            places.append((None, self._emitted))
        places.sort(key=lambda p: p[1].nbytes, reverse=True)
        spilled: list[_Chain] = []
        for home, chain in places:
            if self.size_bytes <= self._budget // 2:
                break
            on_disk = self._write_spill(chain.batches())
            if home is None:
                self._emitted = on_disk
            else:
                home.remove(chain)
                spilled.append(on_disk)
        for chain in spilled:
            self._push_spilled(chain)

    def _push_spilled(self, chain: _Chain) -> None:
        self._spilled.append(chain)
        while len(self._spilled) >= 2 and len(self._spilled[-2]) < self._proportionality * len(
            self._spilled[-1]
        ):
            second = self._spilled.pop()
            first = self._spilled.pop()
            merged = self._write_spill(self._merged_batches([first, second]))
            if merged.segs:
                self._spilled.append(merged)

    def _write_spill(self, batches: Iterable[pa.RecordBatch]) -> _Chain:
        """Write ``batches`` (sorted, consolidated) to a new spill file; its chain."""
        if self._spill_path is None:
            self._spill_path, self._spill_cleanup = open_spill_dir(self, self._spill_parent)
        path = os.path.join(self._spill_path, f"run-{next(self._spill_names)}.arrow")
        log.debug("correction spills a sorted run to %s", path)
        spill = _SpillFile(path)
        segs: list[_Seg] = []
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, self._schema) as writer:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                writer.write_batch(batch)
                seg = _Seg.of(batch)
                segs.append(_Seg(seg.first, seg.last, seg.rows, seg.size, None, spill, len(segs)))
        self.stats["spilled_runs"] += 1
        return _Chain(segs)


class _Cursor:
    """Reads a sorted run a slice at a time for `Correction._stream_merge`."""

    def __init__(self, run: _Chain) -> None:
        self._run = run
        self._next = 0
        self.frontier: pa.RecordBatch | None = None

    @property
    def done(self) -> bool:
        return self._next >= len(self._run.segs)

    def load(self, nbytes: int) -> list[pa.RecordBatch]:
        loaded: list[pa.RecordBatch] = []
        size = 0
        while not self.done and (not loaded or size < nbytes):
            seg = self._run.segs[self._next]
            self._next += 1
            batch = self._run._advanced(seg.load())
            loaded.append(batch)
            size += seg.size
        if loaded:
            last = loaded[-1]
            self.frontier = last.slice(last.num_rows - 1, 1)
        return loaded


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _initial_buckets(boundary: int) -> list[_Bucket]:
    """Aligned power-of-two buckets covering ``[boundary, TIME_END)``, widths growing."""
    buckets = []
    lower = boundary
    while lower < TIME_END:
        width = lower & -lower if lower else 1
        while lower + width > TIME_END:
            width //= 2
        buckets.append(_Bucket(lower, lower + width))
        lower += width
    return buckets
