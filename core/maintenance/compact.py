"""Compaction execution: streaming k-way merges of sorted runs, and committing their outputs.

`run_merge` executes one `MergePlan` (see `persistshard.core.maintenance.trace`): it reads the input
parts chunk by chunk, forwards times below the plan's floor, merges and consolidates them by
the one row rule (`persistshard.core.rows`), and writes one sorted, consolidated run as parts
of at most about ``part_bytes`` each, cut only where the row (not just the time) changes. It
commits nothing; `commit_merge` turns its result into a ``compact`` commit, and on a
`StateConflict` deletes the parts the merge wrote (never parts it reused from an input).
`compact_shard` and `maybe_compact` drive plan, run, commit in a loop on one process.

The merge. Each input part is a *run*, sorted by (row, time) and consolidated; forwarding
times is monotone, so a run stays sorted after it. A run's *frontier* is the last (row, time)
it has delivered; a run with chunks left can still deliver keys at or after its frontier,
and nothing below. So every buffered update strictly below the smallest frontier among runs
with chunks left is final: it is emitted, and the buffer keeps the rest. Then the run with
the smallest frontier delivers its next non-empty chunk. The buffer is a list of sorted
pieces (what each run delivered, less what was emitted): when the first row column is a
plain numeric key, each piece is cut by binary search below the bound's first key
(`persistshard.core.rows.split_sorted_below`), so a waiting row is neither sorted nor copied
again; otherwise, or when that cut finds nothing final, the whole buffer is settled exactly
(one stable sort with the bound row placed first, `persistshard.core.rows.settle_below_bound`)
and left as one sorted piece. Inputs this process wrote moments before come decoded from
memory (`persistshard.core.storage.recent`), in chunks of the same size as stored ones.

Memory bound (measured by `MergeStats.peak_buffered_bytes`, checked by the tests): a run's
buffered updates come from its most recently delivered chunk, plus the rows of its older
chunks that share the bound's first key (everything below a bound was emitted), so the
buffer holds about ``k`` chunks for ``k`` input parts: about ``k * chunk_bytes`` of decoded
Arrow data, and twice that while sorting; a left-over piece under half of the chunk it is a
view of is copied, so views never keep more than twice the buffered bytes alive. The output
side adds the part writer's two encoded chunks in flight and the compressed bytes of the one
output part being assembled (blobs are written with one ``put``): at most the compressed
size of ``part_bytes`` of data (``chunk_bytes`` and ``part_bytes``: the shard's configuration,
`persistshard.core.config`). None of it depends on batch sizes.

Unsealed trimming: an unsealed batch straddling the plan's upper is rewritten part by part,
streaming, keeping only updates at or after the upper (each part stays sorted and
consolidated, a filter preserves both); a part entirely at or after the upper is reused.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import ShardConfig
from persistshard.core.maintenance import trace
from persistshard.core.maintenance.trace import MergePlan
from persistshard.core.read.race import check_collected
from persistshard.core.rows import (
    DIFF,
    TIME,
    advance_times,
    consolidate,
    key_columns,
    row_columns,
    run_starts,
    settle_below_bound,
    sort_indices,
    split_sorted_below,
)
from persistshard.core.statemachine import leases
from persistshard.core.statemachine.commits.compact import Compact
from persistshard.core.statemachine.leases import WriteLease
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import Batch, PartRef, ShardState
from persistshard.core.storage import metrics
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.layout import id_time_ms, new_id, part_key
from persistshard.core.storage.parts import (
    adapt_part_table,
    open_part,
    part_blob,
    written_ref,
)
from persistshard.core.storage.recent import RECENT, HeldPart
from persistshard.core.write.validate import update_schema
from persistshard.errors import CorruptData, LeaseExpired, StateConflict
from persistshard.format import PartReader, PartWriter

log = logging.getLogger("persistshard.core.maintenance.compact")

# --- results and reports -----------------------------------------------------------------


@dataclass
class MergeStats:
    """What one merge read, wrote and held."""

    rows_read: int = 0
    rows_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    chunks_read: int = 0
    peak_buffered_bytes: int = 0
    seconds: float = 0.0

    def add(self, other: MergeStats) -> None:
        self.rows_read += other.rows_read
        self.rows_written += other.rows_written
        self.bytes_read += other.bytes_read
        self.bytes_written += other.bytes_written
        self.chunks_read += other.chunks_read
        self.peak_buffered_bytes = max(self.peak_buffered_bytes, other.peak_buffered_bytes)
        self.seconds += other.seconds

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_json(d: dict[str, Any]) -> MergeStats:
        return MergeStats(**d)


@dataclass
class MergeResult:
    """The output of `run_merge`: parts of the trace output (some possibly reused from an
    input), the unsealed remainders, and which part keys the merge itself wrote."""

    parts: list[PartRef]
    unsealed_outputs: list[Batch]
    written_keys: list[str]
    stats: MergeStats
    free: bool = False

    @property
    def rows_out(self) -> int:
        return sum(p.num_rows for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "parts": [p.to_json() for p in self.parts],
            "unsealed_outputs": [b.to_json() for b in self.unsealed_outputs],
            "written_keys": list(self.written_keys),
            "stats": self.stats.to_json(),
            "free": self.free,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> MergeResult:
        return MergeResult(
            parts=[PartRef.from_json(p) for p in d["parts"]],
            unsealed_outputs=[Batch.from_json(b) for b in d["unsealed_outputs"]],
            written_keys=list(d["written_keys"]),
            stats=MergeStats.from_json(d["stats"]),
            free=d["free"],
        )


@dataclass(frozen=True)
class MergeReport:
    """One merge as `compact_shard` reports it."""

    reason: str
    inputs: list[str]
    unsealed_inputs: list[str]
    lower: int
    upper: int
    input_levels: list[int]
    output: str | None
    level: int | None
    rows_in: int
    rows_out: int
    bytes_read: int
    bytes_written: int
    free: bool
    committed: bool


@dataclass
class CompactionReport:
    """What `Shard.compact` / `Shard._maybe_compact` did.

    ``merges`` lists every merge attempted (``committed`` False for one that lost a race and
    was discarded); ``levels_before``/``levels_after`` are the trace's levels, oldest first.
    A merge that fails outright raises; it is never only reported.
    """

    merges: list[MergeReport] = field(default_factory=list)
    conflicts: int = 0
    levels_before: list[int] = field(default_factory=list)
    levels_after: list[int] = field(default_factory=list)
    batches_before: int = 0
    batches_after: int = 0
    stats: MergeStats = field(default_factory=MergeStats)

    @property
    def committed(self) -> int:
        return sum(1 for m in self.merges if m.committed)

    @property
    def bytes_read(self) -> int:
        return self.stats.bytes_read

    @property
    def bytes_written(self) -> int:
        return self.stats.bytes_written

    @property
    def rows_written(self) -> int:
        return self.stats.rows_written

    def to_json(self) -> dict[str, Any]:
        return {
            "merges": [asdict(m) for m in self.merges],
            "committed": self.committed,
            "conflicts": self.conflicts,
            "levels_before": self.levels_before,
            "levels_after": self.levels_after,
            "batches_before": self.batches_before,
            "batches_after": self.batches_after,
            "stats": self.stats.to_json(),
        }


# --- reading runs ----------------------------------------------------------------------


class _Run:
    """One sorted input part, delivered chunk by chunk with times forwarded to ``floor``;
    for unsealed parts only updates at times ``< below`` are delivered. ``reader`` is a
    `PartReader` over storage or a part this process kept (`HeldPart`), read alike."""

    def __init__(
        self,
        reader: PartReader | HeldPart,
        schema: pa.Schema,
        floor: int,
        below: int | None,
        stats: MergeStats,
        ref: PartRef | None = None,
    ) -> None:
        self.reader = reader
        self.ref = ref
        self.schema = schema
        self.floor = floor
        self.below = below
        self.stats = stats
        self.next_chunk = 0
        self.frontier: pa.Table | None = None  # row columns + time of the last update delivered

    @property
    def has_more(self) -> bool:
        return self.next_chunk < len(self.reader.chunks)

    def deliver(self) -> pa.Table | None:
        """The next non-empty chunk (forwarded, filtered), or None when the run is done."""
        while self.has_more:
            index = self.next_chunk
            self.next_chunk += 1
            info = self.reader.chunks[index]
            if self.below is not None and info.min_time is not None and info.min_time >= self.below:
                continue
            batch = self.reader.read_chunk(index)
            self.stats.chunks_read += 1
            self.stats.bytes_read += info.length
            table = pa.Table.from_batches([batch])
            if self.ref is not None:
                table = adapt_part_table(table, self.ref, self.schema)
            elif table.schema != self.schema:
                table = table.cast(self.schema)
            if self.below is not None:
                table = table.filter(pc.less(table.column(TIME), self.below))
            if table.num_rows == 0:
                continue
            self.stats.rows_read += table.num_rows
            if self._lowest_time(info.min_time) < self.floor:
                table = advance_times(table, self.floor)
            # A zero-copy view of the last update: it keeps this chunk's buffers alive, which
            # the buffer of `_merge_runs` holds anyway (at most one chunk per run).
            self.frontier = table.slice(table.num_rows - 1, 1).drop_columns([DIFF])
            return table
        return None

    def _lowest_time(self, stored_min: int | None) -> int:
        """A lower bound of the times a chunk delivers (its footer's, or the reference's
        rewritten time); below the floor when unknown, so times are then forwarded."""
        if self.ref is not None and self.ref.rewrite_time is not None:
            return self.ref.rewrite_time
        return stored_min if stored_min is not None else self.floor - 1


#: Input parts up to this size are read whole with one get (then decoded from memory)
#: instead of a ranged get for the tail, one for the footer and one per chunk: most merges
#: of writer-triggered compaction have small inputs, whose cost is requests, not bytes.
WHOLE_READ_BYTES = 4 << 20


def _open_input(blob: Blob, ref: PartRef, chunk_bytes: int) -> PartReader | HeldPart:
    """A reader over input part ``ref``: the decoded updates this process kept when it wrote
    the part (`persistshard.core.storage.recent`), else small parts fetched whole (see
    above), else a ranged reader (from the owner's store for a part a fork names). Held
    updates come in chunks of ``chunk_bytes``."""
    blob = part_blob(blob, ref)
    held = RECENT.held(blob.url, ref, chunk_bytes)
    if held is not None:
        return held
    if ref.size > WHOLE_READ_BYTES or ref.inline is not None:
        return open_part(blob, ref)  # an inline part is read from the state's bytes
    data = blob.get(ref.key)
    if data is None:
        raise CorruptData(
            f"part {ref.key} is referenced by the shard's state but missing from storage",
            file=ref.key,
            location=blob.url,
            missing=True,
        )
    return PartReader.open(ref.key, ref.size, lambda offset, length: data[offset : offset + length])


def _merge_runs(runs: list[_Run], columns: list[str], stats: MergeStats) -> Iterator[pa.Table]:
    """Yield the merged, consolidated updates of ``runs`` in (row, time) order, in pieces.

    The buffer is a list of sorted pieces (what each run delivered, less what was emitted):
    a step cuts each piece below the bound by binary search (`split_sorted_below`), so a
    waiting row is neither copied nor sorted again; only when that finds nothing final (the
    first column is not a plain numeric key, or the bound shares its first key with what is
    left) is the whole buffer settled exactly (`settle_below_bound`), leaving one sorted piece.
    """
    schema = runs[0].schema if runs else None
    if schema is None:
        return
    pending: list[tuple[pa.Table, int]] = []  # sorted pieces, the bytes each keeps alive
    # After its first delivery a run either has a frontier or is exhausted.
    arriving = [t for t in (r.deliver() for r in runs) if t is not None]
    while True:
        active = [r for r in runs if r.has_more and r.frontier is not None]
        pieces = [*pending, *((t, t.nbytes) for t in arriving)]
        buffered = sum(kept for _, kept in pieces)
        stats.peak_buffered_bytes = max(stats.peak_buffered_bytes, buffered)
        if not active:
            tables = [t for t, _ in pieces]
            out = consolidate(pa.concat_tables(tables) if tables else schema.empty_table(), columns)
            if out.num_rows:
                yield out
            return
        frontiers = pa.concat_tables([r.frontier for r in active if r.frontier is not None])
        order = sort_indices(frontiers, columns).to_numpy()
        first = int(order[0])
        slowest = active[first]
        bound = frontiers.slice(first, 1)
        split = split_sorted_below(pieces, bound, columns) if pieces else None
        if split is not None and split[0] is not None:
            if split[0].num_rows:
                yield split[0]
            pending = split[1]
        elif pieces:
            bound = bound.append_column(DIFF, pa.array([0], pa.int64())).cast(schema)
            table = pa.concat_tables([bound, *(t for t, _ in pieces)])
            done, rest = settle_below_bound(table, columns, sort_rest=True)
            if done.num_rows:
                yield done
            pending = [(rest, rest.nbytes)] if rest is not None else []
        nxt = slowest.deliver()
        arriving = [nxt] if nxt is not None else []


class _RunWriter:
    """Writes one sorted run as parts, cutting a part only where the row changes."""

    def __init__(
        self,
        blob: Blob,
        write_id: str,
        schema: pa.Schema,
        part_bytes: int,
        stats: MergeStats,
        *,
        chunk_bytes: int,
        hold: bool = False,
    ) -> None:
        self.chunk_bytes = chunk_bytes
        self.blob = blob
        self.hold = hold
        self._held: list[pa.Table] | None = [] if hold else None
        self.write_id = write_id
        self.schema = schema
        self.columns = row_columns(schema)
        self.part_bytes = part_bytes
        self.stats = stats
        self.parts: list[PartRef] = []
        self._writer: PartWriter | None = None
        self._sink: io.BytesIO | None = None
        self._bytes = 0
        self._last_row: pa.Table | None = None

    def _open(self) -> PartWriter:
        if self._writer is None:
            self._sink = io.BytesIO()
            self._writer = PartWriter(
                self._sink,
                self.schema,
                sort_column=self.columns[0] if self.columns else None,
                chunk_bytes=self.chunk_bytes,
            )
            self._bytes = 0
        return self._writer

    def _put(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._open().write(table)
        self._bytes += table.nbytes
        if self._held is not None:
            # The part's updates, kept while they stay small enough to hold (`close_part`).
            if RECENT.fits(self._bytes):
                self._held.append(table)
            else:
                self._held = None
        self.stats.rows_written += table.num_rows
        self._last_row = table.slice(table.num_rows - 1, 1)

    def _row_cut(self, table: pa.Table, start: int) -> int | None:
        """The first index ``>= start`` of ``table`` whose row differs from the row before it
        (index 0 counts when it differs from the last row written), or None."""
        rows = table.select(self.columns)
        offset = 0
        if self._last_row is not None:
            rows = pa.concat_tables([self._last_row.select(self.columns), rows])
            offset = 1
        starts = run_starts(key_columns(rows, self.columns), rows.num_rows) - offset
        later = starts[(starts >= start) & (starts + offset >= 1)]
        return int(later[0]) if len(later) else None

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (the next updates of the run); starts a new part when the current
        one would pass ``part_bytes``, at the first row boundary past that point."""
        while table.num_rows:
            room = self.part_bytes - self._bytes
            if table.nbytes <= room:
                self._put(table)
                return
            fit = int(room // max(1.0, table.nbytes / table.num_rows))
            if self._writer is None:
                fit = max(fit, 1)  # an empty part takes at least one update
            cut = self._row_cut(table, fit)
            if cut is None:
                self._put(table)  # the rest is one row's versions: they stay together
                return
            self._put(table.slice(0, cut))
            self.close_part()
            table = table.slice(cut)

    def close_part(self) -> None:
        if self._writer is None or self._sink is None:
            return
        info = self._writer.close()
        data = self._sink.getvalue()
        ref = written_ref(part_key(self.write_id), len(data), info)
        self.blob.put(ref.key, data)
        self.stats.bytes_written += len(data)
        self.parts.append(ref)
        if self._held:
            RECENT.hold(self.blob.url, ref, pa.concat_tables(self._held))
        self._writer, self._sink, self._bytes = None, None, 0
        self._held = [] if self.hold else None

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
        self._writer, self._sink = None, None


def _trim_unsealed(
    blob: Blob,
    batch: Batch,
    upper: int,
    schema: pa.Schema,
    write_id: str,
    stats: MergeStats,
    written: list[str],
    config: ShardConfig,
) -> Batch | None:
    """``batch`` without its updates at times ``< upper``; None if nothing remains."""
    if batch.lower >= upper:
        return batch
    if batch.upper <= upper:
        return None
    parts: list[PartRef] = []
    for ref in batch.parts:
        if ref.max_time < upper:
            continue
        if ref.min_time >= upper:
            parts.append(ref)
            continue
        reader = open_part(blob, ref)
        out = _RunWriter(
            blob, write_id, schema, config.part_bytes, stats, chunk_bytes=config.chunk_bytes
        )
        try:
            for index, info in enumerate(reader.chunks):
                if info.max_time is not None and info.max_time < upper:
                    continue
                table = pa.Table.from_batches([reader.read_chunk(index)])
                stats.chunks_read += 1
                stats.bytes_read += info.length
                table = adapt_part_table(table, ref, schema)
                table = table.filter(pc.greater_equal(table.column(TIME), upper))
                if table.num_rows:
                    out._put(table)
            out.close_part()
        except BaseException:
            out.abort()
            raise
        finally:
            written.extend(p.key for p in out.parts)
        parts.extend(out.parts)
    if not parts:
        return None
    return Batch(
        id=new_id(id_time_ms(write_id)),
        lower=min(p.min_time for p in parts),
        upper=max(p.max_time for p in parts) + 1,
        parts=tuple(parts),
    )


def run_merge(
    blob: Blob,
    plan: MergePlan,
    user_schema: pa.Schema,
    *,
    write_id: str,
    config: ShardConfig,
    part_bytes: int | None = None,
    hold: bool = False,
) -> MergeResult:
    """Execute ``plan``: write its output run and unsealed remainders; commit nothing.
    Output parts of about ``part_bytes`` (default ``config.part_bytes``), chunks of
    ``config.chunk_bytes``.

    Inputs this process kept decoded are taken from memory (`_open_input`); with ``hold``
    small outputs are kept too, for the merges that will take them as inputs (the driver of
    writer-triggered compaction, not Spark tasks). On an exception, parts already written
    are deleted before it propagates.
    """
    started = time.perf_counter()
    stats = MergeStats()
    schema = update_schema(user_schema)
    reusable = plan.reusable_parts()
    if reusable is not None:
        stats.seconds = time.perf_counter() - started
        return MergeResult(list(reusable), [], [], stats, free=True)
    written: list[str] = []
    chunk_bytes = config.chunk_bytes
    part_bytes = config.part_bytes if part_bytes is None else part_bytes
    writer = _RunWriter(
        blob, write_id, schema, part_bytes, stats, chunk_bytes=chunk_bytes, hold=hold
    )
    try:
        runs = [
            _Run(_open_input(blob, ref, chunk_bytes), schema, plan.floor, None, stats, ref)
            for b in plan.inputs
            for ref in b.parts
            if ref.num_rows
        ]
        runs += [
            _Run(
                _open_input(blob, ref, chunk_bytes),
                schema,
                plan.floor,
                plan.upper_at_plan,
                stats,
                ref,
            )
            for u in plan.unsealed
            for ref in u.parts
            if ref.num_rows and ref.min_time < plan.upper_at_plan
        ]
        if log.isEnabledFor(logging.DEBUG):
            kept = sum(isinstance(r.reader, HeldPart) for r in runs)
            log.debug("merge %s: %d of %d input parts from memory", write_id, kept, len(runs))
        for piece in _merge_runs(runs, row_columns(schema), stats):
            writer.write(piece)
        writer.close_part()
        written.extend(p.key for p in writer.parts)
        remainders = []
        for u in plan.unsealed:
            rest = _trim_unsealed(
                blob, u, plan.upper_at_plan, schema, write_id, stats, written, config
            )
            if rest is not None:
                remainders.append(rest)
    except BaseException:
        writer.abort()
        for key in [*written, *(p.key for p in writer.parts)]:
            blob.delete(key)
        raise
    stats.seconds = time.perf_counter() - started
    return MergeResult(writer.parts, remainders, written, stats)


# --- committing ------------------------------------------------------------------------


def compact_commit(
    plan: MergePlan, result: MergeResult, state: ShardState, output_id: str, commit_id: str
) -> tuple[Compact, Batch]:
    """The ``compact`` commit installing ``result`` in place of the plan's inputs."""
    one_run = not result.free or all(trace.is_one_run(b) for b in plan.inputs if b.parts)
    output = Batch(
        id=output_id + (trace.RUN_SUFFIX if one_run else ""),
        lower=plan.lower,
        upper=plan.upper,
        parts=tuple(result.parts),
        level=trace.commit_level(plan, result.rows_out, state),
        since=plan.floor,
    )
    touched = bool(plan.unsealed)  # which unsealed batches it replaced, if any
    commit = Compact(
        tuple(plan.input_ids),
        output,
        unsealed_inputs=tuple(u.id for u in plan.unsealed) if touched else None,
        unsealed_outputs=tuple(result.unsealed_outputs) if touched else None,
        id=commit_id,
    )
    return commit, output


def commit_merge(
    machine: StateMachine, plan: MergePlan, result: MergeResult, state: ShardState | None = None
) -> tuple[bool, Batch, ShardState | None]:
    """Commit ``result``, its level chosen against ``state`` (default: the newest); returns
    (committed, output batch, the state after the commit, or None after a lost race). On a
    lost race (`StateConflict`), or a merge that outlived its lease (`LeaseExpired`), the parts
    the merge wrote are deleted. Other errors propagate
    and leave the parts for gc (the commit may have landed).

    A given ``state`` (one this machine read or committed) is also the first attempt's base:
    no head read; if it is no longer the newest, the compare-and-set fails and the commit is
    re-applied to the newest (`StateMachine.commit`)."""
    base = state
    state = state if state is not None else machine.state()
    commit, output = compact_commit(plan, result, state, machine.new_id(), machine.new_id())
    try:
        after = machine.commit(commit, base=base)
    except (StateConflict, LeaseExpired):
        machine.delete_parts(result.written_keys)
        RECENT.forget(machine.blob.url, result.written_keys)
        return False, output, None
    # The inputs are no longer in the state: a kept copy of them would never be read again.
    kept = {p.key for p in result.parts}
    kept.update(p.key for b in result.unsealed_outputs for p in b.parts)
    replaced = [p.key for b in (*plan.inputs, *plan.unsealed) for p in b.parts]
    RECENT.forget(machine.blob.url, [k for k in replaced if k not in kept])
    return True, output, after


def merge_report(
    plan: MergePlan, result: MergeResult, output: Batch, committed: bool
) -> MergeReport:
    return MergeReport(
        reason=plan.reason,
        inputs=plan.input_ids,
        unsealed_inputs=[u.id for u in plan.unsealed],
        lower=plan.lower,
        upper=plan.upper,
        input_levels=[b.level for b in plan.inputs],
        output=output.id,
        level=output.level,
        rows_in=plan.input_rows,
        rows_out=result.rows_out,
        bytes_read=result.stats.bytes_read,
        bytes_written=result.stats.bytes_written,
        free=result.free,
        committed=committed,
    )


#: A machine's merges share one write id (so one ``parts/<write id>/`` directory) for at
#: most this long, and at most an eighth of the implicit write lease.
MERGE_WRITE_ID_SECONDS = 10.0


def merge_write_id(machine: StateMachine) -> str:
    """The write id for this machine's next merge: the one its last merge used while that is
    young, else a new one.

    Each merge of a writer used to open a directory of its own, and creating one costs a
    ``mkdir`` and a sync of ``parts/`` on top of the sync of the directory holding the part
    (about 0.5 ms of a 4 ms merge of eight small batches). Sharing is safe because what gc
    and the commit check go by is the write id's time and lease: a shared id is at most
    `MERGE_WRITE_ID_SECONDS` older than a merge that uses it, and at most an eighth of the
    implicit lease, so every merge still starts with most of its lease ahead (and renews it
    through `WriteLease` when it runs long); a merge that fails or loses deletes the parts it
    wrote, never the directory, and gc deletes parts one by one.
    """
    wid = machine.merge_write_id
    born = id_time_ms(wid) if wid is not None else None
    limit_ms = min(MERGE_WRITE_ID_SECONDS * 1000, leases.implicit_lease_ms() / 8)
    if wid is None or born is None or machine.now_ms() - born >= limit_ms:
        wid = machine.merge_write_id = machine.new_write_id()
    return wid


def compact_shard(
    machine: StateMachine,
    *,
    full: bool = True,
    max_merges: int | None = None,
    part_bytes: int | None = None,
    max_conflicts: int = 10,
) -> CompactionReport:
    """Plan, run and commit merges one at a time until the trace is tidy (see
    `persistshard.core.maintenance.trace`), at most ``max_merges`` of them; gives up after
    ``max_conflicts`` lost races (other compactors are then doing the work). Output parts
    of about ``part_bytes`` (default the machine's configuration's)."""
    return _compact_from(machine, machine.state(), full, max_merges, part_bytes, max_conflicts)


def _compact_from(
    machine: StateMachine,
    state: ShardState,
    full: bool,
    max_merges: int | None,
    part_bytes: int | None,
    max_conflicts: int,
) -> CompactionReport:
    report = CompactionReport(levels_before=trace.levels(state), batches_before=len(state.trace))
    while max_merges is None or len(report.merges) < max_merges:
        if state.schema is None:
            break
        plan = trace.next_plan(state, full=full, wide_rows=machine.config.compact_wide_rows)
        if plan is None:
            break
        write_id = merge_write_id(machine)
        with WriteLease(machine, write_id):  # a merge longer than the lease renews it
            try:
                result = run_merge(
                    machine.blob,
                    plan,
                    state.schema,
                    write_id=write_id,
                    config=machine.config,
                    part_bytes=part_bytes,
                    hold=True,
                )
            except CorruptData as e:
                # An input gone because another compaction replaced it and gc collected it
                # (retention 0) is a lost race, not damage: plan again on the newest state.
                # What this merge wrote is its write's, swept by gc once its lease ends.
                check_collected(e, state.version, machine.state, machine.location)
                raise
            committed, output, after = commit_merge(machine, plan, result, state)
        report.merges.append(merge_report(plan, result, output, committed))
        report.stats.add(result.stats)
        if not committed:
            report.conflicts += 1
            if report.conflicts >= max_conflicts:
                break
        state = after if after is not None else machine.state()
    report.levels_after = trace.levels(state)
    report.batches_after = len(state.trace)
    metrics.REGISTRY.inc("compactions", report.committed)
    log.info("%s: compaction %s", machine.location, _describe(report))
    return report


def _describe(report: CompactionReport) -> str:
    """One line: merges committed and lost, batches and levels before and after, bytes."""
    return (
        f"committed {report.committed} merges ({report.conflicts} lost races): "
        f"{report.batches_before} -> {report.batches_after} batches, levels "
        f"{report.levels_before} -> {report.levels_after}, {report.bytes_read} bytes read, "
        f"{report.bytes_written} written"
    )


def needs_compaction(state: ShardState, wide_rows: int | None = None) -> bool:
    """Whether a writer-triggered compaction has work: a same-level group (`trace.fan_in`
    batches, ``wide_rows`` as there) or unsealed updates the upper has passed (cheap: looks at
    the state only)."""
    return bool(trace.level_plans(state, wide_rows=wide_rows) or trace.unsealed_plans(state))


def maybe_compact(machine: StateMachine, *, max_merges: int = 1) -> CompactionReport | None:
    """The small compaction a writer runs after its commit: at most ``max_merges`` merges of
    the unsealed and level kinds (never the whole-trace merge); None if nothing was due.

    Decided and planned on the newest state this writer has seen (its own commit's): no
    read, as persist plans a writer's compaction on the state its append produced. Most
    commits leave nothing due, and then nothing is read at all. When another process
    committed since, the merge's compare-and-set fails and its commit is re-applied to the
    newest state (refused, and the merge's parts deleted, when its inputs are gone). Only a
    writer that has seen no state reads the head."""
    known = machine.known()
    wide = machine.config.compact_wide_rows
    if max_merges <= 0 or (known.version > 0 and not needs_compaction(known, wide)):
        return None
    state = known if known.version > 0 else machine.state()
    if not needs_compaction(state, wide):
        return None
    return _compact_from(machine, state, False, max_merges, None, 10)
