"""Garbage collection: deleting parts, state rollups and log entries no live version needs.

A state version is *live* while a reader may still be using it: the head, and every version
that was still the head less than the retention window ago (its successor's commit time,
``at_ms`` in the log, is after ``now - retention``). A read that pinned a version (any scan,
snapshot or Spark job plans on one version) therefore finishes correctly if it ends within
the retention window after that version stopped being the head; a longer read holds a
reader hold (`persistshard.core.statemachine.holds`) or reads again. Writes in flight are protected
by their leases (`persistshard.core.statemachine.leases`), not by the window. Everything else may
go:

- parts under ``parts/`` that no live version references:
  - parts an older retained version references (replaced by compaction, removed by an
    overwrite), written (by the time in their write id,
    `persistshard.core.storage.layout.part_write_time_ms`) before the retention floor;
  - parts no retained version references (*orphans*: writes that never committed, a Spark
    task retried, a driver that died), once the lease of their write ran out by gc's clock.
    Before deleting any orphan gc commits its fence (`persistshard.core.statemachine.leases.fence`),
    then reads the log again and keeps every orphan a commit adopted meanwhile; after the fence no
    commit can adopt one (`LeaseExpired`). A part without a readable write time is never
    deleted.
- parts a fork's pin names (`ShardState.forks`, `ShardState.kept_keys`) are live like parts
  of the head: a fork reads them from this shard's store (`persistshard.core.fork`). A pin
  released at version v is removed like a part a commit at v replaced. A fork's own gc lists
  only its own store, so it never deletes its sources' parts; it reports in
  ``unneeded_sources`` the sources no live version of it names parts of any more (its pins
  there can go: `persistshard.core.shard.Shard.gc` releases them).
- log entries older than the rollup R that the earliest live version is rebuilt from
  (``consensus.truncate(R)``: every live version is rebuilt from R plus later entries).
- rollups under ``rollups/`` that no log entry at or after R names, written before the floor
  and of a version below the head gc read (older rollups, and rollups of commits that lost
  their race). A commit writes its rollup before its compare-and-set, so a rollup at or
  above the head may be a commit in flight: never deleted, whatever the retention or clock.
- temporary ``.tmp-`` files that a put writes before publishing its object, left behind when
  the process died in between; written (by the listing's modification time, else the time in
  their name) before the floor and more than a write lease ago (another writer's put in
  progress is younger). One without a known write time is never deleted.

Time. gc judges leases and the retention floor by its clock (or ``now_ms``) but never more
than `CLOCK_LEAD_MS` after the shard's newest commit time (``at_ms`` in the log; gc's own
fence commits aside): a gc whose clock runs ahead cannot commit a fence in the future (which
would refuse every write with `LeaseExpired`) nor treat live writes as orphans. The price: on
a shard nobody commits to, what becomes collectable only later waits for the next commit.
A clock ahead may still end a reader's retention window early by up to that bound. A
``now_ms`` ahead of both the shard's clock (its configuration's) and the newest commit time
by more than the bound is `InvalidOption`, as is a retention that is negative, NaN or
infinite (0 is valid).

Cost. gc keeps what it learnt of the log in ``rollups/gc/checkpoint.json`` (`_Log`: the
version it covers and that entry's digest, when each retained part was removed, the commit
times that place any floor, the rollups entries name). A run that finds the entry of that
version unchanged in the log reads only the entries after the rollup that version names;
anything it cannot verify (missing, unparsable, another history) makes it read the whole
retained log as before. The checkpoint holds facts about the log only, so it is written
before anything is deleted and a crash leaves it true.

What always holds, whenever gc stops (crash, error, or completion):
- Nothing a live version references is deleted, and every live version can still be rebuilt:
  parts are deleted first (only unreferenced ones), then log entries below R (oldest first,
  never the head), then rollups no remaining entry at or after R names. Each step leaves a
  state from which the next run computes the same or a smaller plan, so gc resumes by simply
  running again; deletes are idempotent.
- ``dry_run=True`` (the default) reads only.
If the live versions cannot be rebuilt (a rollup or log entry missing), gc raises
`CorruptData` and deletes nothing.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from persistshard.core.statemachine import leases
from persistshard.core.statemachine.commits.sweep_leases import SweepLeases
from persistshard.core.statemachine.encoding import Entry, fold
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import ShardState, part_write_id
from persistshard.core.storage import layout, metrics
from persistshard.core.storage.blob import BlobMeta, temporary_time_ms
from persistshard.core.storage.consensus import VersionedData
from persistshard.core.storage.layout import (
    CLOCK_LEAD_MS,
    DEFAULT_RETENTION_SECONDS,
    PARTS_PREFIX,
    ROLLUPS_PREFIX,
    part_write_time_ms,
    rollup_write_time_ms,
)
from persistshard.errors import CorruptData, InvalidOption

log = logging.getLogger("persistshard.core.maintenance.gc")


@dataclass
class GcReport:
    """What gc found (``dry_run``) or deleted.

    ``parts`` are the part keys to delete, ``orphaned_parts`` the subset no retained version
    ever referenced (uncommitted writes), ``young_parts`` how many unreferenced parts were kept
    because they are newer than the retention floor; ``consensus_below`` is R: log entries
    below it are truncated (``consensus_versions`` of them); ``temporary`` are the leftover
    ``.tmp-`` files older than the floor. ``leased_parts`` counts unreferenced parts kept
    because their write's lease is live; ``fence_version`` is the version of gc's lease fence
    (0 when it deleted no orphan).
    """

    dry_run: bool
    head_version: int = 0
    earliest_live_version: int = 0
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    parts: list[str] = field(default_factory=list)
    part_bytes: int = 0
    orphaned_parts: list[str] = field(default_factory=list)
    young_parts: int = 0
    leased_parts: int = 0
    fence_version: int = 0
    rollups: list[str] = field(default_factory=list)
    rollup_bytes: int = 0
    consensus_below: int = 0
    consensus_versions: int = 0
    temporary: list[str] = field(default_factory=list)
    temporary_bytes: int = 0
    deleted: int = 0
    #: For a fork: the sources whose parts no live version names (its pins there can go).
    unneeded_sources: list[str] = field(default_factory=list)
    #: The fork pins released by this run: dangling ones on this shard, and this fork's own
    #: at sources it no longer needs (`persistshard.core.fork`).
    released_pins: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Bytes of parts, rollups and temporary files deleted (or deletable on a dry run)."""
        return self.part_bytes + self.rollup_bytes + self.temporary_bytes

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["bytes"] = self.bytes
        return out


#: Where gc keeps what it learnt of the log (`_Log`), under the shard's own prefix. Not a
#: rollup (its name has no version), so gc never deletes it.
CHECKPOINT_KEY = f"{ROLLUPS_PREFIX}gc/checkpoint.json"
#: The checkpoint's format; a checkpoint of any other format is ignored (the log is read).
CHECKPOINT_FORMAT = 1
#: Commit kinds gc itself makes: their times are gc's clock, so they never count as the
#: shard's newest commit time (a gc clock ahead would otherwise lift its own bound).
GC_COMMITS = (SweepLeases,)
#: A block's time when a version in it has none (logs from before commit times): live.
_UNKNOWN_MS = 1 << 62


def check_retention_seconds(value: object, name: str = "retention_seconds") -> float:
    """``value`` as gc's retention: a finite number >= 0 (0: delete now what no live version,
    hold or lease needs), else `InvalidOption` naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidOption(
            f"{name} {value!r} is not a finite number of seconds >= 0 (0 keeps only what a "
            "live version, hold or write lease needs)"
        )
    return float(value)


@dataclass
class _Log:
    """What gc knows of the log, through version ``version`` (whose entry has ``digest``).

    - ``state``: the state at ``version`` (rebuilt, never stored);
    - ``rollup``: the rollup entry ``version`` names (rebuilding ``state`` starts there);
    - ``first``: the oldest version ``blocks`` cover (the log's oldest retained entry);
    - ``times``: ``(version, commit time)`` of every version (at or after ``first``) whose
      commit time is later than that of every version before it: the first version committed
      after any retention floor is one of them, so the earliest live version is exact;
    - ``newest_ms``: the latest commit time of any commit gc did not make;
    - ``removed``: part key -> the version whose commit removed it from the state (the part
      is referenced by versions before it), for parts that may still exist;
    - ``named``: rollup key -> (its version, first and last version whose entry names it).
    Every field is a fact about the log up to ``version``; none depends on what gc deleted,
    so a checkpoint written before deleting stays true after a crash.
    """

    version: int
    digest: str
    rollup: tuple[int, str | None]
    state: ShardState
    first: int
    times: list[tuple[int, int]] = field(default_factory=list)
    newest_ms: int | None = None
    removed: dict[str, int] = field(default_factory=dict)
    named: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    source_seen: dict[str, int] = field(default_factory=dict)

    def see_sources(self, state: ShardState) -> None:
        """Record that ``state`` names parts of the sources it names parts of."""
        if not state.sources:
            return
        for p in state.parts():
            if p.source is not None:
                self.source_seen[p.source.shard_id] = state.version

    def advance(self, entries: list[VersionedData], location: str) -> None:
        """Fold ``entries`` (the versions right after ``version``, oldest first) in."""
        for raw in entries:
            if raw.version <= self.version:
                continue
            if raw.version != self.version + 1:
                raise CorruptData(
                    f"consensus log has a gap before version {raw.version}; gc deleted nothing",
                    location=location,
                )
            entry = Entry.decode(raw.data, f"consensus version {raw.version}", location)
            # fold: apply, then check the invariants (canonical part keys: an aliased key
            # would make gc delete the live part it names).
            new = fold(self.state, [entry.commit], location)
            for key in self.state.kept_keys() - new.kept_keys():
                self.removed[key] = raw.version
            self.see_sources(new)
            at = entry.at_ms if entry.at_ms is not None else _UNKNOWN_MS
            if not self.times or at > self.times[-1][1]:
                self.times.append((raw.version, at))
            if entry.at_ms is not None and not isinstance(entry.commit, GC_COMMITS):
                self.newest_ms = max(self.newest_ms or entry.at_ms, entry.at_ms)
            if entry.rollup_key:
                rv, lo, _ = self.named.get(entry.rollup_key, (entry.rollup_version, raw.version, 0))
                self.named[entry.rollup_key] = (rv, lo, raw.version)
            self.state, self.version, self.digest = new, raw.version, raw.digest
            self.rollup = (entry.rollup_version, entry.rollup_key)

    def earliest_live(self, floor: int) -> int:
        """The earliest live version for the retention ``floor``: the one before the first
        version committed after the floor (never before ``first``), else the head."""
        for version, at in self.times:
            if at > floor:
                return min(self.version, max(self.first, version - 1))
        return self.version

    def forget_below(self, below: int) -> None:
        """Drop what only versions below ``below`` (truncated) need; the newest time dropped
        is kept as that of ``below`` (later than its own, so never less live)."""
        dropped = [t for t in self.times if t[0] < below]
        kept = [t for t in self.times if t[0] >= below]
        if dropped and not (kept and kept[0][0] == below):
            kept.insert(0, (below, dropped[-1][1]))
        self.times = kept
        self.first = max(self.first, below)
        self.named = {k: v for k, v in self.named.items() if v[2] >= below}

    def anchor(self, earliest: int) -> tuple[int, str | None]:
        """The newest rollup an entry at or before ``earliest`` names: every version from
        ``earliest`` on is rebuilt from it and the entries after it."""
        best: tuple[int, str | None] = (0, None)
        for key, (rv, lo, _) in self.named.items():
            if lo <= earliest and rv <= earliest and rv > best[0]:
                best = (rv, key)
        return best

    def live_parts(self, earliest: int) -> set[str]:
        """Parts some version from ``earliest`` to ``version`` references."""
        live = self.state.kept_keys()
        live.update(k for k, v in self.removed.items() if v > earliest)
        return live

    def unneeded_sources(self, earliest: int) -> list[str]:
        """For a fork: the sources no version from ``earliest`` on names a part of."""
        return sorted(i for i in self.state.sources if self.source_seen.get(i, 0) < earliest)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "version": self.version,
            "digest": self.digest,
            "rollup": [self.rollup[0], self.rollup[1]],
            "first": self.first,
            "times": [[v, t] for v, t in self.times],
            "newest_ms": self.newest_ms,
            "removed": dict(sorted(self.removed.items())),
            "named": {k: list(v) for k, v in sorted(self.named.items())},
            **({"source_seen": dict(sorted(self.source_seen.items()))} if self.source_seen else {}),
        }


def _read_log(machine: StateMachine) -> _Log | None:
    """What gc knows of the log through its head: from the checkpoint of gc's last run when
    it verifies (its version's entry is still in the log with the same digest), reading only
    the entries after the rollup that version names; else from the whole retained log.
    None when the log is empty."""
    found = _from_checkpoint(machine)
    if found is not None:
        return found
    raws = machine.consensus.scan(1)
    if not raws:
        return None
    location = machine.location
    decoded = [
        (r, Entry.decode(r.data, machine.consensus.entry_name(r.version), location)) for r in raws
    ]
    first = raws[0].version
    start: ShardState | None = ShardState() if first == 1 else None
    if start is None:
        # The oldest rollup a retained entry names from which the log after it is complete.
        for _, entry in decoded:
            rv = entry.rollup_version
            if entry.rollup_key and first - 1 <= rv:
                start = machine.load_rollup(rv, entry.rollup_key)
                break
    if start is None:
        raise CorruptData(
            f"cannot rebuild any retained version: the log starts at {first} and no entry "
            "names a rollup the log continues from; gc deleted nothing",
            location=location,
        )
    log_ = _Log(version=start.version, digest="", rollup=(0, None), state=start, first=first)
    log_.see_sources(start)
    log_.advance([r for r, _ in decoded if r.version > start.version], location)
    if log_.version != raws[-1].version:
        raise CorruptData(
            f"cannot rebuild version {raws[-1].version}; gc deleted nothing", location=location
        )
    return log_


def _from_checkpoint(machine: StateMachine) -> _Log | None:
    """The `_Log` of gc's last run brought up to the head, or None when there is none, it
    does not parse, or the log no longer holds its version with the same digest."""
    try:
        data = machine.blob.get(CHECKPOINT_KEY)
    except FileNotFoundError:
        data = None
    if data is None:
        return None
    try:
        d = json.loads(data)
        if d.get("format") != CHECKPOINT_FORMAT:
            return None
        version, digest = int(d["version"]), str(d["digest"])
        rv, rkey = int(d["rollup"][0]), d["rollup"][1]
        first = int(d["first"])
        times = [(int(v), int(t)) for v, t in d["times"]]
        newest = d["newest_ms"]
        removed = {str(k): int(v) for k, v in d["removed"].items()}
        named = {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in d["named"].items()}
        source_seen = {str(k): int(v) for k, v in d.get("source_seen", {}).items()}
        if not (0 <= rv <= version and first <= version and (rkey is None or rv > 0)):
            return None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        log.info("%s: gc checkpoint unreadable; reading the whole log", machine.location)
        return None
    raws = machine.consensus.scan(rv + 1) if rv < version else machine.consensus.scan(version)
    at = {r.version: r for r in raws}
    mine = at.get(version)
    if mine is None or mine.digest != digest or (rv < version and rv + 1 not in at):
        log.info("%s: gc checkpoint does not match the log; reading it all", machine.location)
        return None
    location = machine.location
    state = machine.load_rollup(rv, rkey if isinstance(rkey, str) else None)
    commits = [
        Entry.decode(r.data, machine.consensus.entry_name(r.version), location).commit
        for r in raws
        if rv < r.version <= version
    ]
    state = fold(state, commits, location)
    if state.version != version:
        return None
    log_ = _Log(
        version=version,
        digest=digest,
        rollup=(rv, rkey if isinstance(rkey, str) else None),
        state=state,
        first=first,
        times=times,
        newest_ms=int(newest) if newest is not None else None,
        removed=removed,
        named=named,
        source_seen=source_seen,
    )
    log_.see_sources(state)
    log_.advance([r for r in raws if r.version > version], location)
    return log_


def _write_checkpoint(machine: StateMachine, log_: _Log) -> None:
    """Store ``log_`` for the next run (a failure only costs the next run a full read)."""
    try:
        machine.blob.put(CHECKPOINT_KEY, json.dumps(log_.to_json()).encode())
    except OSError as e:
        log.warning("%s: could not write gc's checkpoint: %s", machine.location, e)


def _clock(machine: StateMachine, log_: _Log | None, now_ms: int | None) -> tuple[int, int]:
    """(gc's clock, the time gc judges by): the clock is ``now_ms`` or the shard's; the
    time judged by is the clock, but never more than `CLOCK_LEAD_MS` after the shard's newest
    commit time (commits gc makes aside). A ``now_ms`` later than both the shard's clock and
    the newest commit time by more than that is `InvalidOption`."""
    process = machine.config.clock()
    if now_ms is not None:
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidOption(
                f"now_ms {now_ms!r} is not an integer (ms since the epoch)",
                location=machine.location,
            )
        newest = log_.newest_ms if log_ is not None and log_.newest_ms is not None else 0
        if now_ms > max(process, newest) + CLOCK_LEAD_MS:
            raise InvalidOption(
                f"now_ms {now_ms} is {now_ms - max(process, newest)} ms ahead of both this "
                f"process's clock and the shard's newest commit time ({newest}); gc's fences "
                "and cutoffs may not lie in the future: leave now_ms unset",
                location=machine.location,
            )
    clock = process if now_ms is None else now_ms
    if log_ is None or log_.newest_ms is None:
        return clock, clock
    return clock, min(clock, log_.newest_ms + CLOCK_LEAD_MS)


def collect(
    machine: StateMachine,
    *,
    dry_run: bool = True,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    now_ms: int | None = None,
) -> GcReport:
    """Find (and unless ``dry_run``, delete) what no live version needs; see the module
    docstring for what is deleted, in which order, and why that is safe."""
    try:
        retention_seconds = check_retention_seconds(retention_seconds)
    except InvalidOption as e:
        raise InvalidOption(e.detail, location=machine.location) from None
    retention_ms = int(retention_seconds * 1000)
    report = GcReport(dry_run=dry_run, retention_seconds=retention_seconds)
    temporary = machine.blob.list_temporary()
    # Read before the log: every commit up to this state's fence is in the log read next.
    head_state = machine.state()
    log_ = _read_log(machine)
    _, now = _clock(machine, log_, now_ms)
    floor = now - retention_ms
    _plan_temporary(temporary, now - max(retention_ms, leases.implicit_lease_ms()), report)
    if log_ is None:
        _delete_temporary(machine, report)
        return _summary(machine, report)
    head = log_.version
    earliest = log_.earliest_live(floor)
    rollup_version, rollup_key = log_.anchor(earliest)
    report.head_version, report.earliest_live_version = head, earliest
    live = log_.live_parts(earliest)
    report.unneeded_sources = log_.unneeded_sources(earliest)

    part_sizes: dict[str, int] = {}
    listed: set[str] = set()
    for meta in machine.blob.list(PARTS_PREFIX):
        listed.add(meta.key)
        if meta.key in live:
            continue
        written = part_write_time_ms(meta.key)
        if written is None:
            report.young_parts += 1
            continue
        if meta.key in log_.removed:  # only versions before the earliest live one name it
            if written >= floor:
                report.young_parts += 1
                continue
        else:
            write_id = part_write_id(meta.key)
            if write_id is None or leases.live(head_state, write_id, now):
                report.leased_parts += 1
                continue
            report.orphaned_parts.append(meta.key)
        part_sizes[meta.key] = meta.size

    oldest = machine.consensus.oldest_stored()
    first = min(log_.first, oldest) if oldest is not None else log_.first
    if rollup_version > first:
        report.consensus_below = rollup_version
        report.consensus_versions = rollup_version - first

    named = {k for k, (_, _, last) in log_.named.items() if last >= rollup_version}
    if rollup_key:
        named.add(rollup_key)
    rollup_sizes: dict[str, int] = {}
    for meta in machine.blob.list(ROLLUPS_PREFIX):
        if meta.key in named:
            continue
        version = layout.rollup_version_of(meta.key)
        written = rollup_write_time_ms(meta.key)
        if version is None or version >= head or written is None or written >= floor:
            # A rollup at or above the head gc read may belong to a commit in flight (it is
            # written before its entry); one gc cannot date is not gc's to delete.
            continue
        rollup_sizes[meta.key] = meta.size
    report.rollups = sorted(rollup_sizes)
    report.rollup_bytes = sum(rollup_sizes.values())

    through = None if dry_run else _fence_for(head_state, report.orphaned_parts, now)
    if through is not None:
        _fence_orphans(machine, through, log_, report, part_sizes)
    report.parts = sorted(part_sizes)
    report.part_bytes = sum(part_sizes.values())
    if dry_run:
        return _summary(machine, report)
    # The checkpoint first: it holds facts about the log only, true whatever is deleted next.
    log_.removed = {k: v for k, v in log_.removed.items() if k in listed and k not in part_sizes}
    if report.consensus_below:
        log_.forget_below(report.consensus_below)
    _write_checkpoint(machine, log_)
    for key in report.parts:
        machine.blob.delete(key)
        report.deleted += 1
    if report.consensus_below:
        report.deleted += machine.consensus.truncate(report.consensus_below)
    for key in report.rollups:
        machine.blob.delete(key)
        report.deleted += 1
    _delete_temporary(machine, report)
    return _summary(machine, report)


def _summary(machine: StateMachine, report: GcReport) -> GcReport:
    """Count and log (info) what gc did; ``report`` unchanged."""
    if not report.dry_run:
        parts = len(report.parts)
        entries = report.deleted - parts - len(report.rollups) - len(report.temporary)
        metrics.REGISTRY.inc("gc_runs")
        metrics.REGISTRY.inc("gc_deleted_parts", parts)
        metrics.REGISTRY.inc("gc_deleted_entries", max(0, entries))
    log.info(
        "%s: gc %s %d parts, %d rollups, %d temporary files (%d bytes) and %d log versions "
        "below %d; kept %d young and %d leased parts",
        machine.location,
        "would delete" if report.dry_run else "deleted",
        len(report.parts),
        len(report.rollups),
        len(report.temporary),
        report.bytes,
        report.consensus_versions,
        report.consensus_below,
        report.young_parts,
        report.leased_parts,
    )
    return report


def _fence_for(state: ShardState, orphans: list[str], now_ms: int) -> int | None:
    """The fence to commit before deleting ``orphans``, or None when the fence in ``state``
    (the state gc read its log up to) already refuses every commit that could adopt them (a
    gc that resumes after a crash, or a second gc soon after the first).

    The fence is the lowest that covers them: the latest time any of their writes' leases
    ran out (each at or before ``now_ms``, gc's time, or it would be no orphan). Fencing there
    and not at gc's own time refuses exactly the writes whose parts gc may delete, and never
    a write whose lease is still running by that bound, however far gc's clock or a writer's
    runs from the others (a write id's time starts its lease)."""
    needed = False
    latest = 0
    for key in orphans:
        write_id = part_write_id(key)
        until = leases.expiry_ms(state, write_id) if write_id is not None else None
        if until is None or until > state.lease_fence_ms:
            needed = True
        if until is not None:
            latest = max(latest, until)
    if not needed:
        return None
    return min(latest, now_ms) if latest else now_ms


def _fence_orphans(
    machine: StateMachine,
    now_ms: int,
    log_: _Log,
    report: GcReport,
    part_sizes: dict[str, int],
) -> None:
    """Commit gc's lease fence, then drop from the plan every orphan a commit adopted between
    gc's first read of the log and the fence (the entries after it are read and folded in)."""
    fenced = leases.fence(machine, now_ms)
    report.fence_version = fenced.version
    before = log_.version
    log_.advance(machine.consensus.scan(before + 1), machine.location)
    seen = log_.state.kept_keys()
    seen.update(k for k, v in log_.removed.items() if v > before)
    adopted = [k for k in report.orphaned_parts if k in seen]
    if adopted:
        # A commit landed before the fence and references them: not orphans after all.
        report.orphaned_parts = [k for k in report.orphaned_parts if k not in seen]
        for key in adopted:
            part_sizes.pop(key, None)


def _plan_temporary(temporary: list[BlobMeta], floor: int, report: GcReport) -> None:
    """Leftover temporary files written before ``floor`` go into the report."""
    for meta in temporary:
        written = meta.modified_ms if meta.modified_ms is not None else temporary_time_ms(meta.key)
        if written is None or written >= floor:
            continue
        report.temporary.append(meta.key)
        report.temporary_bytes += meta.size


def _delete_temporary(machine: StateMachine, report: GcReport) -> None:
    if report.dry_run:
        return
    for key in report.temporary:
        machine.blob.delete(key)
        report.deleted += 1
