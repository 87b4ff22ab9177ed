"""Forks and drops: a shard made from another's snapshot without copying its parts, and the
deletion of a shard (after persist's shard forks; Delta's shallow clone).

A *fork* of a source shard at ``as_of`` is a new shard with since ``as_of`` and upper
``as_of + 1`` whose snapshot at ``as_of`` is the source's. Its first version (the ``fork``
commit) names the source's parts through a `SourceRef` (the source's shard id and canonical
location) and reads them from the source's store (`Blob.sibling`); the part keys stay keys
inside the source, so every key check holds as it is. What it writes is metadata only: its
identity marker and its log entry. Only a part that holds updates on both sides of ``as_of``
(an explicit ``as_of`` inside a batch) is cut: its updates at or before ``as_of`` are written
as the fork's own part. At the default ``as_of`` (upper - 1) nothing is cut.

What always holds:
- The source's gc never deletes a part a fork names. Before the fork's first entry exists,
  every shard that owns a part the fork will name (the source, and for a fork of a fork the
  shards the source names parts of) commits ``add_fork``: a pin with those keys, which its
  gc keeps (`ShardState.kept_keys`). The pin is refused unless its keys are the shard's at
  that very version, so no gc that read an older head can delete them (``add_fork``).
- The fork's gc never deletes the source's parts: it lists and deletes only its own store.
  Its compaction writes its own parts; once no live version of the fork (gc's retention)
  names a source's parts any more, the fork's gc releases its pin there (``release_fork``).
- Crash cuts: a creation that dies after a pin and before the fork's first entry leaves a
  dangling pin (and perhaps an identity marker and cut parts at the destination, which
  `drop` removes). The owner's gc releases a pin whose fork has no first entry, a later
  identity or is dropped, once `PIN_PENDING_MS` passed since the pin; the creator never
  commits the fork's first entry later than half of that after its first pin, so a released
  pin never has a fork.
- `drop` commits ``drop`` first (the shard reads as gone, takes no write), then releases its
  pins at its sources, then deletes: everything when no fork pins its parts (a
  ``consensus/DROPPING`` marker makes a rerun after a crash finish the deletion without
  reading the state), else only the parts no fork pins, keeping the log with its pins; the
  last fork to release a dropped shard's pin finishes that drop. Rerunning `drop` after any
  crash completes it.
Relies on: a fork and its sources share storage options (`Blob.sibling`) and the kind of
log (next to the data, or the same database given by URL); the clocks of the processes that
create forks and run gc agree to well within `PIN_PENDING_MS` / 2.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from persistshard.core.config import ShardConfig
from persistshard.core.read.plan import check_as_of
from persistshard.core.statemachine.commits.add_fork import AddFork
from persistshard.core.statemachine.commits.drop import Drop
from persistshard.core.statemachine.commits.fork import Fork
from persistshard.core.statemachine.commits.release_fork import ReleaseFork
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import (
    PIN_PENDING_MS,
    Batch,
    PartRef,
    ShardState,
    SourceRef,
)
from persistshard.core.storage import layout
from persistshard.core.storage.blob import Blob, foreign_keys
from persistshard.core.storage.consensus import (
    Consensus,
    mark_log_home,
    read_log_home,
    underlying,
)
from persistshard.core.storage.layout import (
    CONSENSUS_PREFIX,
    PARTS_PREFIX,
    ROLLUPS_PREFIX,
    canonical_location,
)
from persistshard.core.storage.parts import read_part, write_parts
from persistshard.errors import (
    CorruptData,
    InvalidOption,
    NoShard,
    PersistShardError,
    StateConflict,
)


class Shard(Protocol):
    """What this module needs of a shard (`persistshard.core.shard.Shard`, which imports this
    module for `Shard.fork` and `Shard.drop`, so it is named by its shape here)."""

    location: str
    config: ShardConfig
    _machine: StateMachine

    @property
    def _inline_bytes(self) -> int: ...

    @property
    def _blob(self) -> Blob: ...

    @property
    def _consensus(self) -> Consensus: ...

    @property
    def maintenance(self) -> _Maintenance: ...

    def _require_shard(self, state: ShardState | None = None) -> ShardState: ...

    def _related(self, location: str, *, maintenance: bool = False) -> Shard: ...


class _Maintenance(Protocol):
    """What this module needs of ``shard.maintenance`` (`persistshard.core.shard.Maintenance`)."""

    @property
    def enabled(self) -> bool: ...


log = logging.getLogger("persistshard.core.fork")

#: Written before a drop deletes a shard's log: a rerun after a crash finishes the deletion
#: without reading the (partly deleted) log.
DROPPING_KEY = f"{CONSENSUS_PREFIX}DROPPING"
#: How many times `fork` starts again when a compaction replaced the parts it read.
FORK_ATTEMPTS = 3


def identity(shard: Shard) -> str:
    """The shard's id (``consensus/IDENTITY``: one get), recorded now if it has none yet (what
    its first writer would do: a shard logged next to its data before shard ids, or a fork's
    destination); a store without an atomic create has the location as its id."""
    home = read_log_home(shard._blob, shard.location)
    if home is None or home.shard_id is None:
        home = mark_log_home(shard._blob, shard._consensus, shard.location)
    return home.shard_id or shard.location


@dataclass
class _Plan:
    """What a fork's first version holds, and what must happen before it lands."""

    trace: list[Batch] = field(default_factory=list)
    unsealed: list[Batch] = field(default_factory=list)
    #: Parts holding updates on both sides of ``as_of``: to cut (batch index, trace or not).
    cuts: list[tuple[bool, int, PartRef]] = field(default_factory=list)
    #: owner shard id -> (its location, the keys of its parts the fork names)
    pins: dict[str, tuple[str, set[str]]] = field(default_factory=dict)


def _named(ref: PartRef, source: SourceRef) -> PartRef:
    """``ref`` as the fork names it: an inline part travels in the fork's state (metadata),
    a part of the source's own through ``source``, another shard's part through its owner."""
    if ref.inline is not None or ref.source is not None:
        return ref
    return replace(ref, source=source)


def _plan(state: ShardState, as_of: int, source: SourceRef) -> _Plan:
    """The source's batches restricted to times ``<= as_of`` (see the module docstring)."""
    plan = _Plan()

    def split(parts: tuple[PartRef, ...], trace: bool, index: int) -> list[PartRef]:
        kept = []
        for p in parts:
            if p.num_rows == 0 or p.max_time <= as_of:
                kept.append(_named(p, source))
            elif p.min_time <= as_of:
                plan.cuts.append((trace, index, p))
        return kept

    for b in state.trace:
        if b.lower > as_of:
            break
        index = len(plan.trace)
        parts = split(b.parts, True, index)
        plan.trace.append(replace(b, upper=min(b.upper, as_of + 1), parts=tuple(parts)))
    for b in state.unsealed:
        if b.lower > as_of:
            continue
        index = len(plan.unsealed)
        parts = split(b.parts, False, index)
        plan.unsealed.append(replace(b, parts=tuple(parts)))
    return plan


def _bounded(batch: Batch) -> Batch | None:
    """An unsealed batch with ``lower``/``upper`` bounding its parts' times (None: empty)."""
    with_rows = [p for p in batch.parts if p.num_rows]
    if not with_rows:
        return None
    lo = min(p.min_time for p in with_rows)
    hi = max(p.max_time for p in with_rows) + 1
    return replace(batch, lower=lo, upper=hi)


def _write_cuts(source: Shard, target: Shard, plan: _Plan, as_of: int) -> list[str]:
    """Write each cut part's updates at or before ``as_of`` as the fork's own parts (read from
    the part's owner); the keys written."""
    if not plan.cuts:
        return []
    write_id = target._machine.new_write_id()
    written: list[str] = []
    for trace, index, ref in plan.cuts:
        table = read_part(source._blob, ref, max_time=as_of)
        refs = write_parts(
            target._blob, write_id, table, config=target.config, inline_max=target._inline_bytes
        )
        written.extend(r.key for r in refs if r.inline is None)
        batches = plan.trace if trace else plan.unsealed
        batch = batches[index]
        batches[index] = replace(batch, parts=(*batch.parts, *refs))
    log.info("%s: cut %d parts across as_of %d", target.location, len(plan.cuts), as_of)
    return written


def _collect_pins(plan: _Plan) -> None:
    for b in (*plan.trace, *plan.unsealed):
        for p in b.parts:
            if p.source is not None:
                _loc, keys = plan.pins.setdefault(p.source.shard_id, (p.source.location, set()))
                keys.add(p.key)


def _owner(source: Shard, source_id: str, owner_id: str, location: str) -> Shard:
    """A handle on the shard ``owner_id`` at ``location`` (``source`` itself, or a shard the
    source names parts of); `CorruptData` if another shard is there now."""
    if owner_id == source_id:
        return source
    owner = source._related(location)
    found = identity(owner)
    if found != owner_id:
        raise CorruptData(
            f"the source names parts of shard {owner_id} at {location}, but the shard there "
            f"is {found}; its parts are gone",
            location=source.location,
        )
    return owner


def fork(source: Shard, dst: str, as_of: int | None = None) -> Shard:
    """Create at ``dst`` a fork of ``source`` at ``as_of`` (default upper - 1, which must be in
    ``[since, upper)``: `SinceViolation`, `NotSealed`); the fork's handle. See the module
    docstring. `InvalidOption` when ``dst`` holds a shard or other files, or is the source."""
    location = canonical_location(dst)
    if location == source.location:
        raise InvalidOption(f"a fork needs a new location, not the source's ({dst})")
    target = source._related(location)
    for attempt in range(1, FORK_ATTEMPTS + 1):
        state = source._require_shard(source._machine.state())
        at = state.upper - 1 if as_of is None else as_of
        check_as_of(state, at, source.location)
        if target._machine.state().version != 0:
            raise InvalidOption(
                f"a fork needs a new location; {location} already holds a shard (drop it "
                "first: persistshard drop)",
                location=source.location,
            )
        found = foreign_keys(target._blob)
        if found:
            raise InvalidOption(
                f"a fork needs a new location; {location} holds files but no shard (for "
                f"example {', '.join(found)})",
                location=source.location,
            )
        source_id = identity(source)
        fork_id = identity(target)
        plan = _plan(state, at, SourceRef(source_id, source.location))
        cut_keys = _write_cuts(source, target, plan, at)
        _collect_pins(plan)
        started = time.monotonic()
        pinned: list[tuple[Shard, str]] = []
        try:
            for owner_id, (loc, keys) in sorted(plan.pins.items()):
                owner = _owner(source, source_id, owner_id, loc)
                adding = AddFork(fork_id, location, tuple(sorted(keys)), id=owner._machine.new_id())
                owner._machine.commit(adding)
                pinned.append((owner, owner_id))
            if time.monotonic() - started > PIN_PENDING_MS / 2000:
                raise StateConflict(
                    "the fork's pins took longer than half their pending time; fork again",
                    location=location,
                )
            unsealed = [u for u in (_bounded(b) for b in plan.unsealed) if u is not None]
            sources = tuple(sorted((i, loc) for i, (loc, _) in plan.pins.items()))
            commit = Fork(
                at,
                state.schema,
                tuple(plan.trace),
                tuple(unsealed),
                sources,
                id=target._machine.new_id(),
            )
            target._machine.commit(commit)
        except StateConflict as e:
            # Certainly not landed (a compaction replaced the parts, or another fork was
            # made at ``dst``): release what was pinned, delete what was cut.
            _release_all(pinned, fork_id)
            target._machine.delete_parts(cut_keys)
            if attempt == FORK_ATTEMPTS or target._machine.state().version != 0:
                raise
            log.info("%s: fork of %s starts again: %s", location, source.location, e)
            continue
        log.info(
            "%s: forked from %s at %d (%d parts named, %d cut)",
            location,
            source.location,
            at,
            sum(len(keys) for _, keys in plan.pins.values()),
            len(plan.cuts),
        )
        return source._related(location, maintenance=source.maintenance.enabled)
    raise AssertionError("unreachable")  # pragma: no cover


def _release_all(pinned: list[tuple[Shard, str]], fork_id: str) -> None:
    for owner, _ in pinned:
        try:
            owner._machine.commit(ReleaseFork(fork_id, id=owner._machine.new_id()))
        except (PersistShardError, OSError) as e:  # dangling: the owner's gc releases it
            log.warning("%s: could not release fork %s's pin: %s", owner.location, fork_id, e)


# --- releasing pins -------------------------------------------------------------------------


def release_at(shard: Shard, source_id: str, location: str, fork_id: str) -> bool:
    """Release the pin of ``fork_id`` at the shard ``source_id`` (at ``location``), if it has
    one; finish that shard's drop when it was dropped and this was its last pin. Whether a pin
    was released. A source that is gone (no shard, another identity) has nothing to release."""
    owner = shard._related(location)
    home = read_log_home(owner._blob, location)
    if home is None or (home.shard_id or location) != source_id:
        return False
    try:
        state = owner._machine.state()
    except NoShard:
        return False
    if fork_id not in state.forks:
        return False
    new = owner._machine.commit(ReleaseFork(fork_id, id=owner._machine.new_id()))
    log.info("%s: released the pin of fork %s", location, fork_id)
    if new.dropped and not new.forks:
        drop(owner, apply=True)
    return True


def release_sources(shard: Shard, source_ids: list[str]) -> list[str]:
    """Release this shard's pins at the sources ``source_ids`` (its gc found no live version
    naming their parts); the ids of those released."""
    state = shard._machine.state()
    fork_id = identity(shard)
    done = []
    for source_id in source_ids:
        location = state.sources.get(source_id)
        if location is not None and release_at(shard, source_id, location, fork_id):
            done.append(source_id)
    return done


def _fork_names(fork: Shard, fork_id: str, source_id: str) -> bool:
    """Whether the fork ``fork_id`` is at ``fork``'s location and may still name parts of
    ``source_id``: its identity is ``fork_id`` and it has a first version, not dropped, that
    records the source. Unreadable or unreachable: assumed to (nothing is released)."""
    try:
        home = read_log_home(fork._blob, fork.location)
        if home is None or (home.shard_id or fork.location) != fork_id:
            return False
        state = fork._machine.state()
    except (PersistShardError, OSError) as e:
        log.warning("%s: cannot tell whether fork %s is there: %s", fork.location, fork_id, e)
        return True
    return state.version > 0 and not state.dropped and source_id in state.sources


def dangling(shard: Shard, state: ShardState, now_ms: int) -> list[str]:
    """The forks whose pins on ``shard`` are dangling at ``now_ms``: recorded more than
    `PIN_PENDING_MS` ago, with no fork at their location that records this shard."""
    if not state.forks:
        return []
    source_id = identity(shard)
    out = []
    for fork_id, pin in sorted(state.forks.items()):
        if now_ms - pin.at_ms <= PIN_PENDING_MS:
            continue
        if not _fork_names(shard._related(pin.location), fork_id, source_id):
            out.append(fork_id)
    return out


def release_dangling(shard: Shard, now_ms: int | None = None) -> list[str]:
    """Release the dangling pins on ``shard`` (`dangling`); the forks released."""
    state = shard._machine.state()
    now = shard.config.clock() if now_ms is None else now_ms
    released = dangling(shard, state, now)
    for fork_id in released:
        shard._machine.commit(ReleaseFork(fork_id, id=shard._machine.new_id()))
        log.info("%s: released the dangling pin of fork %s", shard.location, fork_id)
    return released


# --- drop ----------------------------------------------------------------------------------


@dataclass
class DropReport:
    """What `drop` deleted (or, on a dry run, would delete).

    ``parts`` and ``files`` (rollups, log entries next to the data, markers) are this shard's
    own keys; ``kept_parts`` the parts its forks still pin (kept, with the log that records
    the pins, until they release them); ``released`` the sources whose pins on this shard's
    behalf go; ``log_deleted`` whether the log goes too."""

    location: str
    dry_run: bool
    parts: list[str] = field(default_factory=list)
    kept_parts: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    forks: list[str] = field(default_factory=list)
    log_deleted: bool = False
    deleted: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "dry_run": self.dry_run,
            "parts": self.parts,
            "kept_parts": self.kept_parts,
            "files": self.files,
            "released": self.released,
            "forks": self.forks,
            "log_deleted": self.log_deleted,
            "deleted": self.deleted,
        }


def _own_keys(blob: Blob) -> list[str]:
    """Every key a shard stores under its location (parts, rollups, its log if next to the
    data, markers), and leftover temporary files."""
    keys = [
        m.key
        for prefix in (PARTS_PREFIX, ROLLUPS_PREFIX, CONSENSUS_PREFIX)
        for m in blob.list(prefix)
    ]
    keys += [m.key for m in blob.list_temporary()]
    return keys


def drop(shard: Shard, *, apply: bool = False) -> DropReport:
    """Drop the shard (module docstring); with ``apply=False`` (the default) only report what
    would go. `NoShard` where nothing of a shard is."""
    report = DropReport(shard.location, dry_run=not apply)
    blob = shard._blob
    if blob.get(DROPPING_KEY) is not None:  # a drop that deleted part of the log: finish it
        report.files = _own_keys(blob)
        report.log_deleted = True
        if apply:
            _delete_everything(shard, report)
        return report
    state = shard._machine.state()
    if state.version == 0:
        leftovers = _own_keys(blob)
        if not leftovers:
            raise NoShard(f"no shard at {shard.location}: nothing to drop")
        # A fork creation (or first write) that died before its first entry.
        report.parts = [k for k in leftovers if k.startswith(PARTS_PREFIX)]
        report.files = [k for k in leftovers if not k.startswith(PARTS_PREFIX)]
        if apply:
            for key in (*report.parts, *report.files):
                blob.delete(key)
                report.deleted += 1
        return report
    report.released = sorted(state.sources)
    if apply and not state.dropped:
        state = shard._machine.commit(Drop(id=shard._machine.new_id()))
        log.info("%s: dropped (version %d)", shard.location, state.version)
    if apply and state.sources:
        fork_id = identity(shard)
        for source_id, location in sorted(state.sources.items()):
            release_at(shard, source_id, location, fork_id)
    if apply and state.forks:
        released = release_dangling(shard)
        if released:
            state = shard._machine.state()
    pinned = {k for pin in state.forks.values() for k in pin.keys}
    report.forks = sorted(pin.location for pin in state.forks.values())
    listed = _own_keys(blob)
    own_parts = [k for k in listed if k.startswith(PARTS_PREFIX)]
    report.parts = sorted(k for k in own_parts if k not in pinned)
    report.kept_parts = sorted(k for k in own_parts if k in pinned)
    if state.forks:
        if apply:
            for key in report.parts:
                blob.delete(key)
                report.deleted += 1
        return report
    report.files = sorted(k for k in listed if not k.startswith(PARTS_PREFIX))
    report.log_deleted = True
    if apply:
        blob.put(DROPPING_KEY, shard._machine.new_id().encode())
        _delete_everything(shard, report)
    return report


def _delete_everything(shard: Shard, report: DropReport) -> None:
    """The end of a drop: parts, rollups, the log (in its database too), temporaries, the
    identity marker, and last the `DROPPING_KEY` marker itself."""
    blob = shard._blob
    for key in sorted(k for k in _own_keys(blob) if k.startswith((PARTS_PREFIX, ROLLUPS_PREFIX))):
        blob.delete(key)
        report.deleted += 1
    underlying(shard._consensus).destroy()
    rest = [k for k in _own_keys(blob) if k != DROPPING_KEY]
    for key in sorted(rest, key=lambda k: k == layout.IDENTITY_KEY):  # the identity last
        blob.delete(key)
        report.deleted += 1
    blob.delete(DROPPING_KEY)
    log.info("%s: deleted (%d objects)", shard.location, report.deleted)
