"""External sort: a write task's updates in (row, time) order, consolidated, in bounded memory.

A Spark write task reads its input once and writes it out once as parts sorted by
(row, time) and consolidated (`persistshard.core.rows`). An input that fits in memory is
sorted once; `ExternalSort` serves the larger ones:

1. *Runs.* Inserted tables gather until they pass ``run_bytes``; the gathering is then sorted
   by (row, time) and consolidated (one sort, or none when its first column is a strictly
   increasing integer) and written to a local Arrow IPC file: a *run*. Runs are cut by size
   only, never by value, so a run never holds much more than ``run_bytes`` whatever the keys
   (a constant first column included). The last gathering stays in memory as the last run.
2. *Merge.* `ExternalSort.sorted` yields the runs merged and consolidated. When every run
   ends strictly before the next one begins (an input already in row order, such as a
   range, arriving in order) the merge is their concatenation: nothing is sorted again.
   Otherwise a streaming merge: it loads slices of the runs, always from the run whose
   loaded part ends lowest, until about a quarter of ``run_bytes`` is waiting, then emits
   everything that sorts strictly before the lowest loaded end (`rows.settle_below_bound`):
   no run can still deliver it. Loading the laggard first keeps the runs' loaded ends close
   together, so most of what waits is emitted each round and the merge sorts each update
   about twice, whatever the number of runs. More than ``fan_in`` runs are first merged
   ``fan_in`` at a time into longer runs (on disk).

Invariants: every run is sorted by (row, time) and consolidated; the merged output is the
consolidation of everything inserted, in (row, time) order, in tables of bounded size.
Memory: the gathering (up to ``run_bytes`` plus one inserted table, and a sorted copy of it
while a run is cut), or, while merging, the in-memory last run plus about ``run_bytes / 2``
of slices and their sorted copies. Spill files live in a fresh directory named like the
Correction's (`correction.SPILL_PREFIX`, so a killed process's files are swept the same way)
and are deleted by `ExternalSort.close` or when the object is garbage collected.

Assumes: the schema holds the row columns plus int64 ``_time`` and ``_diff``; inserted tables
are in the normal form (`validate.normalize_updates`: non-zero diffs, times >= 0). Not
thread-safe; `sorted` is called once, after the last insert.
"""

from __future__ import annotations

import itertools
import logging
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from persistshard.core import rows
from persistshard.core.write.correction import open_spill_dir

log = logging.getLogger("persistshard.core.write.external")

#: Runs merged at once; more are first merged this many at a time into longer runs.
FAN_IN = 16
#: Bytes of one record batch in a spill file (slices of it are loaded, so this bounds nothing).
SPILL_BATCH_BYTES = 8 << 20


def distinct_ascending(table: pa.Table, column: str) -> bool:
    """Whether ``column`` (the first row column) strictly ascends (`rows.ascending_key`):
    then the rows are sorted by (row, time) and no two rows are equal."""
    return rows.ascending_key(table.column(column))


@dataclass(eq=False)
class _Run:
    """One sorted, consolidated run: record batches in memory or in a spill file."""

    rows: int
    nbytes: int
    first: pa.Table  # its first update (one row)
    last: pa.Table  # its last update (one row)
    batches: list[pa.RecordBatch] = field(default_factory=list)
    path: str | None = None

    def read(self) -> Iterator[pa.RecordBatch]:
        if self.path is None:
            yield from self.batches
            return
        with pa.memory_map(self.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


class _Cursor:
    """Reads a run a slice at a time; ``frontier`` is the last update loaded (one row)."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.row_bytes = max(1, run.nbytes // max(1, run.rows))
        self._batches = run.read()
        self._current: pa.RecordBatch | None = None
        self._offset = 0
        self.frontier: pa.Table | None = None
        self.done = False

    def load(self, nbytes: int) -> pa.Table | None:
        """About ``nbytes`` of the next updates (at least one), or None when the run is done."""
        want = max(1, nbytes // self.row_bytes)
        pieces: list[pa.RecordBatch] = []
        while want > 0:
            if self._current is None or self._offset >= self._current.num_rows:
                self._current = next(self._batches, None)
                self._offset = 0
                if self._current is None:
                    self.done = True
                    break
                continue
            piece = self._current.slice(self._offset, want)
            self._offset += piece.num_rows
            want -= piece.num_rows
            pieces.append(piece)
        if self._current is not None and self._offset >= self._current.num_rows:
            self._current = next(self._batches, None)
            self._offset = 0
            self.done = self._current is None
        if not pieces:
            return None
        table = pa.Table.from_batches(pieces)
        self.frontier = table.slice(table.num_rows - 1, 1)
        return table


def _sorts_before(a: pa.Table, b: pa.Table, columns: list[str]) -> bool:
    """Whether update ``a`` sorts strictly before update ``b`` in (row, time) order."""
    pair = pa.concat_tables([b, a])
    return int(rows.sort_indices(pair, columns, expect_ties=True)[0].as_py()) == 1


class ExternalSort:
    """Sorts and consolidates inserted updates by (row, time), spilling runs beyond
    ``run_bytes`` (see the module docstring for the invariants and the memory bound)."""

    def __init__(
        self,
        schema: pa.Schema,
        *,
        run_bytes: int,
        spill_dir: str | None = None,
        fan_in: int = FAN_IN,
    ) -> None:
        if run_bytes <= 0:
            raise ValueError(f"ExternalSort: run_bytes must be positive, got {run_bytes}")
        if fan_in < 2:
            raise ValueError(f"ExternalSort: fan_in must be at least 2, got {fan_in}")
        self._schema = schema
        self._columns = rows.row_columns(schema)
        self._run_bytes = run_bytes
        self._fan_in = fan_in
        self._spill_parent = spill_dir
        self._spill_path: str | None = None
        self._spill_cleanup: weakref.finalize[Any, Any] | None = None
        self._names = itertools.count()
        self._gathered: list[pa.Table] = []
        self._gathered_bytes = 0
        self._runs: list[_Run] = []
        #: Counters of the work done, for tests and benchmarks.
        self.stats: dict[str, int] = {
            "runs_spilled": 0,
            "merge_passes": 0,
            "merge_rounds": 0,
            "concatenated": 0,
            "peak_waiting_bytes": 0,
        }

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def size_bytes(self) -> int:
        """Bytes of updates gathered in memory (not yet a run)."""
        return self._gathered_bytes

    def insert(self, table: pa.Table) -> None:
        """Add updates (the schema's columns, normal form); cuts a run past ``run_bytes``."""
        if table.num_rows == 0:
            return
        if not table.schema.equals(self._schema):
            table = table.select(self._schema.names).cast(self._schema)
        self._gathered.append(table)
        self._gathered_bytes += table.nbytes
        if self._gathered_bytes > self._run_bytes:
            run = self._cut_run()
            if run.rows:
                self._runs.append(self._spill(run))

    def sorted(self) -> Iterator[pa.Table]:
        """Every inserted update, consolidated, in (row, time) order, in tables of at most
        about ``SPILL_BATCH_BYTES`` (or a merge round's output)."""
        if self._gathered:
            self._runs.append(self._cut_run())
        runs = [r for r in self._runs if r.rows]
        self._runs = []
        while len(runs) > self._fan_in:
            self.stats["merge_passes"] += 1
            group, runs = runs[: self._fan_in], runs[self._fan_in :]
            runs.append(self._spill(self._merge(group)))
        if not runs:
            return iter(())
        if len(runs) == 1 or all(
            _sorts_before(a.last, b.first, self._columns) for a, b in itertools.pairwise(runs)
        ):
            self.stats["concatenated"] += 1
            return (pa.Table.from_batches([b]) for run in runs for b in run.read())
        self.stats["merge_passes"] += 1
        return self._merge(runs)

    def close(self) -> None:
        """Drop every update and delete the spill files."""
        self._gathered = []
        self._gathered_bytes = 0
        self._runs = []
        if self._spill_cleanup is not None:
            self._spill_cleanup()
            self._spill_cleanup = None
            self._spill_path = None

    def __enter__(self) -> ExternalSort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

    def _cut_run(self) -> _Run:
        """The gathering, sorted and consolidated, as an in-memory run (cut into batches)."""
        table = pa.concat_tables(self._gathered)
        self._gathered = []
        self._gathered_bytes = 0
        if self._columns and distinct_ascending(table, self._columns[0]):
            # Already sorted and consolidated (diffs are non-zero): the batches as they came,
            # neither copied nor cut.
            return self._run_of(table.to_batches())
        if table.num_columns and table.column(0).num_chunks > 1:
            table = table.combine_chunks()  # Arrow's gather is much slower across many chunks
        indices, sums = rows.consolidation_indices(table, self._columns)
        step = max(1, int(SPILL_BATCH_BYTES * table.num_rows // max(1, table.nbytes)))
        diff_index = self._schema.get_field_index(rows.DIFF)
        diff_field = self._schema.field(diff_index)
        batches: list[pa.RecordBatch] = []
        for start in range(0, len(indices), step):
            piece = table.take(pa.array(indices[start : start + step]))
            diffs = pa.array(sums[start : start + step], pa.int64())
            piece = piece.set_column(diff_index, diff_field, diffs)
            batches.extend(piece.combine_chunks().to_batches())
        return self._run_of(batches)

    def _run_of(self, batches: list[pa.RecordBatch]) -> _Run:
        batches = [b for b in batches if b.num_rows]
        if not batches:
            empty = self._schema.empty_table()
            return _Run(0, 0, empty, empty)
        last = batches[-1]
        return _Run(
            rows=sum(b.num_rows for b in batches),
            nbytes=sum(b.nbytes for b in batches),
            first=pa.Table.from_batches([batches[0].slice(0, 1)]),
            last=pa.Table.from_batches([last.slice(last.num_rows - 1, 1)]),
            batches=batches,
        )

    def _spill(self, source: _Run | Iterator[pa.Table]) -> _Run:
        """Write a run (or merged tables) to a new spill file; the run on disk."""
        if self._spill_path is None:
            self._spill_path, self._spill_cleanup = open_spill_dir(self, self._spill_parent)
        path = os.path.join(self._spill_path, f"sorted-{next(self._names)}.arrow")
        tables = source.read() if isinstance(source, _Run) else source
        rows_, nbytes = 0, 0
        first: pa.Table | None = None
        last: pa.Table | None = None
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, self._schema) as writer:
            for item in tables:
                if item.num_rows == 0:
                    continue
                writer.write(item)
                rows_ += item.num_rows
                nbytes += item.nbytes
                table = item if isinstance(item, pa.Table) else pa.Table.from_batches([item])
                # Copies (a slice would keep the whole batch's buffers alive).
                if first is None:
                    first = table.take(pa.array([0]))
                last = table.take(pa.array([table.num_rows - 1]))
        self.stats["runs_spilled"] += 1
        log.debug("spilled a sorted run of %d rows (%d bytes) to %s", rows_, nbytes, path)
        if first is None or last is None:
            os.remove(path)
            empty = self._schema.empty_table()
            return _Run(0, 0, empty, empty)
        return _Run(rows_, nbytes, first, last, path=path)

    def _merge(self, runs: list[_Run]) -> Iterator[pa.Table]:
        """The streaming merge of the module docstring: consolidated, in (row, time) order."""
        runs = [r for r in runs if r.rows]
        cursors = [_Cursor(r) for r in runs]
        target = max(1, self._run_bytes // 4)
        share = max(1, self._run_bytes // (8 * max(1, len(cursors))))
        waiting: list[pa.Table] = []
        waiting_bytes = 0
        bound_diff = pa.array([0], pa.int64())
        diff_index = self._schema.get_field_index(rows.DIFF)
        for cursor in cursors:
            loaded = cursor.load(share)
            if loaded is not None:
                waiting.append(loaded)
                waiting_bytes += loaded.num_rows * cursor.row_bytes
        while True:
            live = [c for c in cursors if not c.done]
            if not live:
                if waiting:
                    table = pa.concat_tables(waiting).combine_chunks()
                    out = rows.consolidate(table, self._columns)
                    if out.num_rows:
                        yield out
                return
            frontiers = pa.concat_tables([c.frontier for c in live if c.frontier is not None])
            order = rows.sort_indices(frontiers, self._columns, expect_ties=True).to_numpy()
            if waiting_bytes < target:
                cursor = live[int(order[0])]
                loaded = cursor.load(share)
                if loaded is not None:
                    waiting.append(loaded)
                    waiting_bytes += loaded.num_rows * cursor.row_bytes
                continue
            self.stats["merge_rounds"] += 1
            self.stats["peak_waiting_bytes"] = max(self.stats["peak_waiting_bytes"], waiting_bytes)
            lowest = frontiers.slice(int(order[0]), 1)
            bound = lowest.set_column(diff_index, self._schema.field(diff_index), bound_diff)
            table = pa.concat_tables([bound, *waiting]).combine_chunks()
            done, rest = rows.settle_below_bound(table, self._columns, expect_ties=True)
            if done.num_rows:
                yield done
            waiting = [rest] if rest is not None else []
            waiting_bytes = sum(t.nbytes for t in waiting)
            # The laggard's loaded part is all emitted (or equal to the bound): load more.
            cursor = live[int(order[0])]
            loaded = cursor.load(share)
            if loaded is not None:
                waiting.append(loaded)
                waiting_bytes += loaded.num_rows * cursor.row_bytes
