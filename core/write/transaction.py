"""The write transaction: the one protocol by which anything adds data to a shard.

Every write (the Python API's appends and upserts, every Spark write path: batch and
streaming appends, overwrites, upserts, reclocked writes, complete-mode views, distributed
compaction) goes through a `WriteTransaction`, which owns its four steps:

1. *Lease*: a write id minted from the shard's clock (`StateMachine.new_write_id`), whose
   lease (`persistshard.core.statemachine.leases`) the transaction keeps alive while it is
   entered (``with txn:``); `holding` keeps the leases of writes made elsewhere (Spark
   tasks, staged rows) while a driver gathers them.
2. *Parts*: parts written under ``parts/<write id>/`` (or inline, within the shard's
   ``inline_bytes``), never overwriting anything.
3. *Commit*: one compare-and-append (`commit`) naming the parts (and, for a write that
   sets the retention, the retention: it lands with them); parts written by another
   process are checked first (``check=True``: present with their recorded sizes, times
   inside their batch).
4. *Sweep*: parts nothing will name are deleted: the parts of a commit refused for certain,
   and the leftovers of a write's directories (`sweep`).

What always holds (the durability contract of docs/design.md):
- Nothing is visible before the commit, which is one compare-and-set: a failed or refused
  write leaves the shard as it was.
- A part is deleted only when no state can name it: after a *determinate* refusal
  (`persistshard.core.statemachine.machine.DETERMINATE_REFUSALS`, or `StorageUnsupported`
  before the first entry), and never a part the newest state this handle read names. An
  ambiguous outcome (an I/O error, `Indeterminate`) is resolved by the state machine reading
  the log back for the commit's id; what stays unknown keeps every part (gc decides later).
  A lost response is never taken for "did not land".
- A streaming writer's replayed batch (`WriterAlreadyCommitted`) is a no-op whose parts are
  deleted.

The transaction holds no state of the shard beyond what its state machine caches; it is
cheap, single-threaded like the machine, and may be used without entering it (a commit of
parts whose leases are held elsewhere, e.g. `Shard.commit_checked`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import pyarrow as pa

from persistshard.core.config import MEMORY_BUDGET, ShardConfig
from persistshard.core.maintenance.auto import AutoMaintenance, MaintenanceReport
from persistshard.core.maintenance.compact import MergeResult, commit_merge
from persistshard.core.maintenance.trace import MergePlan
from persistshard.core.read.plan import KeyRange
from persistshard.core.rows import TIME, consolidate
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.append_set_retention import AppendSetRetention
from persistshard.core.statemachine.leases import WriteLease, holding
from persistshard.core.statemachine.machine import DETERMINATE_REFUSALS, StateMachine
from persistshard.core.statemachine.retention import RetentionChange
from persistshard.core.statemachine.state import Batch, PartRef, ShardState
from persistshard.core.storage import metrics
from persistshard.core.storage import parts as part_store
from persistshard.core.storage.blob import FsspecBlob, foreign_keys, unobserved
from persistshard.core.storage.layout import PARTS_PREFIX
from persistshard.core.storage.parts import PartsWithin, PutsBehind
from persistshard.core.write.diff import (
    DiffRun,
    DiffStats,
    current_runs,
    diff_parts,
    plan_key_ranges,
)
from persistshard.core.write.validate import normalize_updates, user_schema
from persistshard.errors import (
    InvalidOption,
    InvalidUpdates,
    StorageError,
    StorageUnsupported,
    WriterAlreadyCommitted,
)

log = logging.getLogger("persistshard.core.write.transaction")

__all__ = ["CommitOptions", "WriteTransaction", "WrittenUpdates", "split_at"]


class CommitOptions(TypedDict, total=False):
    """What a commit of written parts may also say (`WriteTransaction.commit`): its id
    (default: a fresh one), the streaming writer and batch it records, whether a plain append
    may land at a newer upper (``rebase``), the history's name for it (``label``) and the
    retention it sets with its data (``retention``)."""

    commit_id: str | None
    writer: tuple[str, int] | None
    rebase: bool
    label: str | None
    retention: RetentionChange | None


@dataclass
class WrittenUpdates:
    """What a write produced: sealed parts (below the new upper) and unsealed parts."""

    sealed: list[PartRef] = field(default_factory=list)
    unsealed: list[PartRef] = field(default_factory=list)

    def extend(self, other: WrittenUpdates) -> None:
        self.sealed.extend(other.sealed)
        self.unsealed.extend(other.unsealed)

    def keys(self) -> list[str]:
        """Every part's key (an inline part's names no stored object, but a commit may store
        it first: `WriteTransaction.commit`), e.g. what a sweep of the write must keep."""
        return [p.key for p in (*self.sealed, *self.unsealed)]

    def stored_keys(self) -> list[str]:
        """The keys of the parts stored as files (what a refused commit deletes)."""
        return [p.key for p in (*self.sealed, *self.unsealed) if p.inline is None]


def split_at(table: pa.Table, upper: int) -> tuple[pa.Table, pa.Table]:
    """The updates of ``table`` with times below ``upper`` and the others. When all are on
    one side (an append at its upper: the usual case) that side is ``table`` itself: a filter
    would copy every column of it (about a second for 16M rows on memory fresh from the OS)."""
    import pyarrow.compute as pc

    below = pc.less(table.column(TIME), upper)
    n_below = int(pc.sum(below).as_py() or 0)
    if n_below == table.num_rows:
        return table, table.slice(0, 0)
    if n_below == 0:
        return table.slice(0, 0), table
    return table.filter(below), table.filter(pc.invert(below))


class WriteTransaction:
    """One write to the shard of ``machine`` (see the module docstring).

    ``inline_bytes``/``inline_cap``: the shard handle's inline settings (a part of at most
    ``inline_bytes`` may travel inside the commit, while the state's inline bytes stay within
    ``inline_cap``). ``maintenance``: the handle's after-commit maintenance (`maintain`).
    ``write_id``: the write's id (default: a fresh one from the shard's clock); a Spark
    task passes the id its driver minted."""

    def __init__(
        self,
        machine: StateMachine,
        *,
        inline_bytes: int,
        inline_cap: int,
        maintenance: AutoMaintenance,
        write_id: str | None = None,
    ) -> None:
        self._machine = machine
        self.location = machine.location
        self.inline_bytes = inline_bytes
        self.inline_cap = inline_cap
        self._maintenance = maintenance
        self.write_id = write_id if write_id is not None else machine.new_write_id()
        #: The shard's tunables and clock (`persistshard.core.config`): its parts' sizes, its
        #: chunks, the diff's slices; the same configuration as the machine's.
        self.config: ShardConfig = machine.config
        #: The since this handle knew before the transaction's last commit (what the
        #: after-commit maintenance compares with, to tell whether since moved).
        self.since_before = machine.known().since
        self._lease: WriteLease | None = None

    # --- 1. the lease ----------------------------------------------------------------

    def __enter__(self) -> WriteTransaction:
        """Keep this write's lease alive until the block ends (renewed if it runs long)."""
        self._lease = WriteLease(self._machine, self.write_id)
        self._lease.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.__exit__(*exc)

    def mint(self) -> str:
        """Another fresh write id of this shard (a compaction round's merges, an upsert's
        retry), for `holding` or a transaction of its own."""
        return self._machine.new_write_id()

    def again(self) -> WriteTransaction:
        """A new transaction on the same shard handle under a fresh write id (a retry that
        writes its parts again)."""
        return WriteTransaction(
            self._machine,
            inline_bytes=self.inline_bytes,
            inline_cap=self.inline_cap,
            maintenance=self._maintenance,
        )

    @contextlib.contextmanager
    def holding(self, write_ids: Iterable[str], *, check: bool = False) -> Iterator[None]:
        """Keep the leases of ``write_ids`` (writes made elsewhere: Spark tasks, staged rows,
        merges) alive while the block runs; with ``check``, first `LeaseExpired` unless they
        are all live now (for a step about to read those parts). See
        `persistshard.core.statemachine.leases.holding`."""
        with holding(self._machine, write_ids, check=check, location=self.location):
            yield

    # --- the state ---------------------------------------------------------------------

    def state(self) -> ShardState:
        """The newest state version (re-reads the head)."""
        return self._machine.state()

    def known(self) -> ShardState:
        """The newest state this handle read or committed (no request)."""
        return self._machine.known()

    def refuse_foreign_files(self) -> None:
        """Refuse to create a shard where files that are not a shard's already are (a
        mistyped location would otherwise mix a shard into someone's data)."""
        found = foreign_keys(self._machine.blob)
        if found:
            raise InvalidOption(
                f"the location holds files but no shard (for example {', '.join(found)}); "
                "refusing to create a shard among them: choose a new or empty location",
                location=self.location,
            )

    def refuse_file_location(self) -> None:
        """Refuse a location that is an existing file (not a directory or prefix): otherwise
        every write of a part would fail on it with a raw ``NotADirectoryError``."""
        blob = unobserved(self._machine.blob)  # under the request counting
        if not isinstance(blob, FsspecBlob):
            return  # other stores have no files to mistake for a shard's directory
        try:
            is_file = bool(blob.root) and blob.fs.isfile(blob.root)
        except OSError:
            is_file = False
        if is_file:  # what `persistshard.errors.storage_error` says of a NotADirectoryError
            raise StorageError(
                f"cannot write the shard at {self.location}: NotADirectoryError: it is a "
                "file; a shard is a directory (or prefix) of its own",
            )

    # --- 2. parts ----------------------------------------------------------------------

    def puts(self) -> PutsBehind:
        """Puts this write's parts behind their encoding (`PutsBehind`); the caller holds it
        open over the write, and the parts are stored once it closes."""
        return PutsBehind(self._machine.blob)

    def write_part(
        self, table: pa.Table, *, puts: PutsBehind | None = None, inline: bool = False
    ) -> PartRef:
        """One part of ``table`` (sorted, consolidated) under this write's id; ``inline``:
        inline when it encodes to at most the handle's ``inline_bytes``."""
        small = self.inline_bytes if inline else 0
        return part_store.write_part(
            self._machine.blob,
            self.write_id,
            table,
            config=self.config,
            inline_max=small,
            puts=puts,
        )

    def write_parts(
        self, table: pa.Table, *, inline: bool = False, hold: bool = False
    ) -> list[PartRef]:
        """``table`` (sorted, consolidated) as parts under this write's id
        (`persistshard.core.storage.parts.write_parts`); ``inline`` as in `write_part`,
        ``hold``: keep small parts decoded for this process's compaction."""
        small = self.inline_bytes if inline else 0
        return part_store.write_parts(
            self._machine.blob,
            self.write_id,
            table,
            config=self.config,
            inline_max=small,
            hold=hold,
        )

    def write_updates(
        self, updates: pa.Table, *, lower: int, new_upper: int, schema: pa.Schema | None
    ) -> WrittenUpdates:
        """Validate, consolidate and write ``updates`` as parts; commits nothing. Updates
        below ``new_upper`` become sealed parts, the rest unsealed parts; small ones inline
        and kept decoded for this process's compaction (`persistshard.core.storage.recent`)."""
        table = normalize_updates(updates, lower=lower, schema=schema, location=self.location)
        if table.num_rows == 0:
            return WrittenUpdates()
        sealed, unsealed = split_at(table, new_upper)
        sealed, unsealed = consolidate(sealed), consolidate(unsealed)
        return WrittenUpdates(
            sealed=self.write_parts(sealed, inline=True, hold=True),
            unsealed=self.write_parts(unsealed, inline=True, hold=True),
        )

    def read_parts(self, refs: Iterable[PartRef], schema: pa.Schema) -> pa.Table:
        """Every row of ``refs`` (staged rows), concatenated, not consolidated."""
        return part_store.read_parts(self._machine.blob, refs, schema)

    def check_parts(self, groups: Sequence[PartsWithin]) -> None:
        """Check parts written elsewhere before anything reads or names them
        (`persistshard.core.storage.parts.check_parts`); nothing is committed or deleted."""
        part_store.check_parts(self._machine.blob, groups, location=self.location)

    def check(self, written: WrittenUpdates, *, expected_upper: int, new_upper: int) -> None:
        """Check parts written elsewhere before a commit names them: every stored part present
        with its recorded size (else `CorruptData` naming it), every sealed part's times in
        ``[expected_upper, new_upper)`` and every unsealed part's at or above ``new_upper``
        (else `InvalidUpdates`). One listing per write directory, in parallel."""
        self.check_parts(
            [(written.sealed, expected_upper, new_upper), (written.unsealed, new_upper, None)]
        )

    def key_ranges(
        self, refs: Sequence[PartRef], schema: pa.Schema, count: int
    ) -> list[KeyRange | None]:
        """At most ``count`` key ranges cut by the chunk statistics of ``refs``
        (`persistshard.core.write.diff.plan_key_ranges`)."""
        return plan_key_ranges(self._machine.blob, refs, schema, count)

    def diff(
        self,
        runs: Sequence[DiffRun],
        schema: pa.Schema,
        *,
        time: int,
        memory_budget: int,
        write_id: str | None = None,
        key_range: KeyRange | None = None,
        stats: DiffStats | None = None,
    ) -> list[PartRef]:
        """The signed sum of ``runs`` as parts at ``time`` under ``write_id`` (default: this
        write's); `persistshard.core.write.diff.diff_parts`."""
        return diff_parts(
            self._machine.blob,
            runs,
            schema,
            time=time,
            write_id=self.write_id if write_id is None else write_id,
            memory_budget=memory_budget,
            key_range=key_range,
            stats=stats,
            config=self.config,
        )

    def self_correct(
        self,
        staged: WrittenUpdates,
        *,
        time: int,
        write_id: str | None = None,
        state: ShardState | None = None,
        schema: pa.Schema | None = None,
        runs: list[list[PartRef]] | None = None,
        memory_budget: int = MEMORY_BUDGET,
    ) -> WrittenUpdates:
        """The updates that turn the shard's current contents into the staged rows.

        ``staged`` holds the desired contents (rows with any diffs, any times); the result
        holds, at ``time``, a retraction for every row that goes away and an insertion for
        every row that comes (only the difference), written as parts of ``write_id`` (default:
        this write's). The staged parts are deleted. The current contents are those of
        ``state`` (default: newest), all sealed updates summed; the caller commits with
        ``expected_upper = state.upper``. ``schema`` is the shard's schema after the commit
        (wider than the state's when the overwrite adds columns: the current rows then have
        nulls there). ``runs`` groups the staged parts into sorted chains (default: each part
        alone). The difference is a streaming merge of sorted runs within ``memory_budget``
        (`persistshard.core.write.diff`)."""
        state = state if state is not None else self._machine.state()
        if staged.unsealed:
            raise InvalidUpdates(
                "an overwrite writes the whole table at one time; it has no unsealed updates",
                location=self.location,
            )
        if state.schema is None and not staged.sealed:
            return WrittenUpdates()
        schema = schema if schema is not None else state.schema
        if schema is None:
            first = part_store.open_part(self._machine.blob, staged.sealed[0])
            schema = user_schema(first.schema)
        chains = runs if runs is not None else [[p] for p in staged.sealed]
        desired = [DiffRun(tuple(c), 1) for c in chains if c]
        current = current_runs(state) if state.schema is not None else []
        parts = self.diff(
            [*desired, *current], schema, time=time, write_id=write_id, memory_budget=memory_budget
        )
        self.delete(staged.keys())
        return WrittenUpdates(sealed=parts)

    def upsert_delta(
        self,
        state: ShardState,
        incoming: pa.Table,
        keys: Sequence[str],
        schema: pa.Schema,
        *,
        stats: Any = None,
    ) -> list[PartRef]:
        """The parts at ``state.upper`` that apply ``incoming`` to ``state``'s rows by
        ``keys`` (`persistshard.core.upsert.delta_parts`), under this write's id."""
        from persistshard.core import upsert as up

        return up.delta_parts(
            self._machine.blob,
            state,
            incoming,
            keys,
            schema,
            self.write_id,
            config=self.config,
            location=self.location,
            stats=stats,
        )

    # --- 3. the commit -----------------------------------------------------------------

    @metrics.operation_method("append")
    def commit(
        self,
        written: WrittenUpdates,
        *,
        expected_upper: int,
        new_upper: int,
        schema: pa.Schema | None,
        commit_id: str | None = None,
        writer: tuple[str, int] | None = None,
        rebase: bool = False,
        label: str | None = None,
        retention: RetentionChange | None = None,
        check: bool = False,
    ) -> ShardState:
        """Append ``written`` with one compare-and-append (`commits.append.Append`), in an
        ``append`` operation scope unless one is open (`persistshard.core.storage.metrics`: a
        certain storage refusal is `StorageError`).

        ``check``: the parts came from elsewhere (other processes, an external caller): check
        them first (`check`), so a commit naming a missing part, a part of another size than
        recorded, or a part whose times lie outside its batch is refused (`CorruptData`,
        `InvalidUpdates`) with nothing applied and nothing deleted. Inline parts are stored
        as files where this handle's ``inline_bytes``/``inline_cap`` say so (a Spark driver's
        setting decides, whatever its tasks produced). On a determinate refusal the stored
        parts are deleted (never one the newest known state names) and the error re-raised;
        a streaming writer's replayed batch deletes them and returns the newest state;
        anything else (I/O errors, `Indeterminate`) may have landed: the parts stay and gc
        removes them later if no state references them.

        ``rebase``: a plain append (every update at ``expected_upper``, ``new_upper =
        expected_upper + 1``) that lands at whatever the upper is when it commits, never
        failing with `UpperMismatch`; its parts are not rewritten.

        ``retention``: set the shard's retention to ``retention.to`` (None: clear it) in the
        same compare-and-append (`commits.append_set_retention.AppendSetRetention`), so it
        lands with the data or not at all. When the state the commit is planned on already
        has that retention, the commit is a plain append that leaves the retention alone (a
        ``set_retention`` landing between that read and the compare-and-set then stays).
        """
        if check:
            self.check(written, expected_upper=expected_upper, new_upper=new_upper)
        commit_id = commit_id or self._machine.new_id()
        base = self._machine.known()
        if base.version == 0:
            base = self._machine.state()
        written = self._fit_inline(written, base)
        batch = Batch(
            id=f"{commit_id}-t",
            lower=expected_upper,
            upper=new_upper,
            parts=tuple(written.sealed),
        )
        unsealed = None
        if written.unsealed:
            unsealed = Batch(
                id=f"{commit_id}-u",
                lower=min(p.min_time for p in written.unsealed),
                upper=max(p.max_time for p in written.unsealed) + 1,
                parts=tuple(written.unsealed),
            )
        commit = Append(
            expected_upper,
            new_upper,
            batch,
            unsealed,
            schema,
            writer,
            rebase=rebase,
            label=label,
            id=commit_id,
        )
        if retention is not None and retention.to != base.retention:
            commit = AppendSetRetention.of(commit, retention.to)
        self.since_before = self._machine.known().since
        try:
            return self._machine.commit(commit, base=base)
        except WriterAlreadyCommitted:
            self.delete(written.stored_keys())
            return self._machine.state()
        except (*DETERMINATE_REFUSALS, StorageUnsupported):
            # Certainly not applied (StorageUnsupported: the store failed the atomic-create
            # probe before the first entry): the parts are garbage now, unless a landed
            # entry names them (never deleted: see `delete`).
            self.delete(written.stored_keys())
            raise
        # Anything else (I/O errors, Indeterminate) may have landed: the parts stay; gc
        # removes them later if no state references them.

    def commit_merge(self, plan: MergePlan, result: MergeResult) -> tuple[bool, Batch]:
        """Commit a merge written elsewhere (a Spark task's `MergeResult`): whether it landed
        (a lost race deletes its parts) and its output batch
        (`persistshard.core.maintenance.compact.commit_merge`)."""
        committed, output, _ = commit_merge(self._machine, plan, result)
        return committed, output

    def _fit_inline(self, written: WrittenUpdates, state: ShardState) -> WrittenUpdates:
        """``written`` with its inline parts stored as files where this handle's
        ``inline_bytes``/``inline_cap`` say so (`persistshard.core.storage.parts.fit_inline`)."""
        if not any(p.inline is not None for p in (*written.sealed, *written.unsealed)):
            return written
        limit, cap, blob = self.inline_bytes, self.inline_cap, self._machine.blob
        sealed = part_store.fit_inline(blob, written.sealed, state, limit=limit, cap=cap)
        used = sum(p.size for p in sealed if p.inline is not None)
        unsealed = part_store.fit_inline(blob, written.unsealed, state, limit=limit, cap=cap - used)
        return WrittenUpdates(sealed=sealed, unsealed=unsealed)

    # --- 4. the sweep ------------------------------------------------------------------

    def delete(self, keys: Sequence[str]) -> None:
        """Delete parts no state references (a refused commit's, staged rows): never one the
        newest state this handle read names (free: a refusal was decided on that state). A
        refusal is only determinate when its commit did not land, but a part a landed entry
        names must never be deleted, whatever misled the commit; parts named only by entries
        compacted away since are gc's to delete."""
        named = self._machine.known().stored_part_keys()
        kept = [k for k in keys if k in named]
        if kept:
            log.warning(
                "%s: a refused commit's parts %s are named by the shard; kept",
                self.location,
                kept[:3],
            )
        doomed = [k for k in keys if k not in named]
        log.info("%s: deleting %d parts no state references", self.location, len(doomed))
        self._machine.delete_parts(doomed)

    def sweep(self, prefixes: Iterable[str], keep: Iterable[str] = ()) -> int:
        """Delete every stored part under ``parts/<prefix>`` for each of ``prefixes`` (a write
        id with its trailing ``/``, or the start of the ids derived from one) that is not in
        ``keep``: the parts of failed task attempts and staged rows, which no state names.
        Returns how many were deleted. ``keep`` must hold every part a commit of the write
        may have named (its written parts, or the newest state's part keys)."""
        kept = set(keep)
        doomed: list[str] = []
        for prefix in prefixes:
            listed = self._machine.blob.list(f"{PARTS_PREFIX}{prefix}")
            doomed.extend(m.key for m in listed if m.key not in kept)
        log.info("%s: deleting %d parts no state references", self.location, len(doomed))
        self._machine.delete_parts(doomed)
        return len(doomed)

    def sweep_write(self, write_id: str, keep: Iterable[str] = ()) -> int:
        """`sweep` of one write's directory (``parts/<write_id>/``)."""
        return self.sweep([f"{write_id}/"], keep)

    # --- after the commit --------------------------------------------------------------

    def maintain(
        self, since_before: int | None = None, *, compact: bool = True
    ) -> MaintenanceReport | None:
        """The bounded after-commit maintenance (`persistshard.core.maintenance.auto`) of a
        commit that found since at ``since_before`` (default: before this transaction's last
        commit): due Spine merges (unless ``compact`` is false), then gc if since moved. None
        when the handle was opened with ``maintenance=False``. Never raises for a maintenance
        failure (it is logged)."""
        before = self.since_before if since_before is None else since_before
        return self._maintenance.after_commit(self._machine, before, compact=compact)
