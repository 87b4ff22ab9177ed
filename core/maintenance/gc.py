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
- log entries older than the rollup R that the earliest live version is rebuilt from
  (``consensus.truncate(R)``: every live version is rebuilt from R plus later entries).
- rollups under ``rollups/`` that no log entry at or after R names, written before the floor
  (older rollups, and rollups of commits that lost their race).
- temporary ``.tmp-`` files that a put writes before publishing its object, left behind when
  the process died in between; written (by the listing's modification time, else the time in
  their name) before the floor. Nothing ever references them; a put still in progress is far
  younger than any retention window. One without a known write time is never deleted.

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

import itertools
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from persistshard.core.statemachine import leases
from persistshard.core.statemachine import state as st
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import Entry, ShardState
from persistshard.core.storage import layout, metrics
from persistshard.core.storage.blob import temporary_time_ms
from persistshard.core.storage.layout import (
    DEFAULT_RETENTION_SECONDS,
    PARTS_PREFIX,
    ROLLUPS_PREFIX,
    part_write_time_ms,
    rollup_write_time_ms,
)
from persistshard.errors import CorruptData

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

    @property
    def bytes(self) -> int:
        """Bytes of parts, rollups and temporary files deleted (or deletable on a dry run)."""
        return self.part_bytes + self.rollup_bytes + self.temporary_bytes

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["bytes"] = self.bytes
        return out


def _live_versions(
    machine: StateMachine, now_ms: int, retention_ms: int
) -> tuple[int, int, int, str | None, list[tuple[int, Entry]]] | None:
    """(head, earliest live version E, rollup version R, rollup key, entries) or None."""
    entries = machine.entries(1)
    if not entries:
        return None
    head = entries[-1][0]
    floor = now_ms - retention_ms
    earliest = head
    for (prev_version, _), (_, entry) in itertools.pairwise(entries):
        if entry.at_ms is None or entry.at_ms > floor:
            earliest = prev_version
            break
    by_version = dict(entries)
    anchor = by_version[earliest]
    return head, earliest, anchor.rollup_version, anchor.rollup_key, entries


def _fold_from(
    machine: StateMachine,
    entries: list[tuple[int, Entry]],
    rollup_version: int,
    rollup_key: str | None,
) -> ShardState | None:
    """The state at ``rollup_version`` if the log after it is complete, else None."""
    if rollup_version + 1 < entries[0][0]:
        return None
    return machine.load_rollup(rollup_version, rollup_key)


def _referenced(
    machine: StateMachine,
    earliest: int,
    rollup_version: int,
    rollup_key: str | None,
    entries: list[tuple[int, Entry]],
) -> tuple[set[str], set[str]]:
    """(part keys of every live version, part keys only older retained versions reference).

    Live versions are rebuilt from the rollup the earliest live version names; older retained
    versions, when the log reaches back far enough, from the oldest rebuildable point (they
    only tell replaced parts from never-committed ones in the report).
    """
    state = _fold_from(machine, entries, 0, None) if entries[0][0] == 1 else None
    if state is None:
        first = entries[0][1]
        state = _fold_from(machine, entries, first.rollup_version, first.rollup_key)
    if state is None or state.version > rollup_version:
        state = _fold_from(machine, entries, rollup_version, rollup_key)
    if state is None:
        raise CorruptData(
            f"cannot rebuild live version {earliest}: the log starts at {entries[0][0]} and "
            f"the rollup it needs is version {rollup_version}; gc deleted nothing",
            location=machine.location,
        )
    live: set[str] = set()
    dead: set[str] = set()
    (live if state.version >= earliest else dead).update(state.part_keys())
    for version, entry in entries:
        if version <= state.version:
            continue
        if version != state.version + 1:
            raise CorruptData(
                f"consensus log has a gap before version {version}; gc deleted nothing",
                location=machine.location,
            )
        # fold: apply, then check the invariants (canonical part keys: an aliased key
        # would make gc delete the live part it names).
        state = st.fold(state, [entry.commit], machine.location)
        (live if version >= earliest else dead).update(state.part_keys())
    return live, dead - live


def collect(
    machine: StateMachine,
    *,
    dry_run: bool = True,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    now_ms: int | None = None,
) -> GcReport:
    """Find (and unless ``dry_run``, delete) what no live version needs; see the module
    docstring for what is deleted, in which order, and why that is safe."""
    now_ms = layout.now_ms() if now_ms is None else now_ms
    retention_ms = int(retention_seconds * 1000)
    floor = now_ms - retention_ms
    report = GcReport(dry_run=dry_run, retention_seconds=retention_seconds)
    _plan_temporary(machine, floor, report)
    # Read before the log: every commit up to this state's fence is in the log read next.
    head_state = machine.state()
    found = _live_versions(machine, now_ms, retention_ms)
    if found is None:
        _delete_temporary(machine, report)
        return _summary(machine, report)
    head, earliest, rollup_version, rollup_key, entries = found
    report.head_version, report.earliest_live_version = head, earliest
    live, dead = _referenced(machine, earliest, rollup_version, rollup_key, entries)

    part_sizes: dict[str, int] = {}
    for meta in machine.blob.list(PARTS_PREFIX):
        if meta.key in live:
            continue
        written = part_write_time_ms(meta.key)
        if written is None:
            report.young_parts += 1
            continue
        if meta.key in dead:
            if written >= floor:
                report.young_parts += 1
                continue
        else:
            write_id = st.part_write_id(meta.key)
            if write_id is None or leases.live(head_state, write_id, now_ms):
                report.leased_parts += 1
                continue
            report.orphaned_parts.append(meta.key)
        part_sizes[meta.key] = meta.size

    first = min(entries[0][0], machine.consensus.oldest_stored() or entries[0][0])
    if rollup_version > first:
        report.consensus_below = rollup_version
        report.consensus_versions = rollup_version - first

    named = {e.rollup_key for v, e in entries if v >= rollup_version and e.rollup_key}
    if rollup_key:
        named.add(rollup_key)
    rollup_sizes: dict[str, int] = {}
    for meta in machine.blob.list(ROLLUPS_PREFIX):
        if meta.key in named:
            continue
        written = rollup_write_time_ms(meta.key)
        if written is None or written >= floor:
            continue
        rollup_sizes[meta.key] = meta.size
    report.rollups = sorted(rollup_sizes)
    report.rollup_bytes = sum(rollup_sizes.values())

    if not dry_run and _needs_fence(head_state, report.orphaned_parts):
        _fence_orphans(machine, now_ms, retention_ms, report, part_sizes)
    report.parts = sorted(part_sizes)
    report.part_bytes = sum(part_sizes.values())
    if dry_run:
        return _summary(machine, report)
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


def _needs_fence(state: ShardState, orphans: list[str]) -> bool:
    """Whether deleting ``orphans`` needs a new fence: not when the fence in ``state`` (the
    state gc read its log up to) already refuses every commit that could adopt them (a gc
    that resumes after a crash, or a second gc soon after the first)."""
    for key in orphans:
        write_id = st.part_write_id(key)
        until = leases.expiry_ms(state, write_id) if write_id is not None else None
        if until is None or until > state.lease_fence_ms:
            return True
    return False


def _fence_orphans(
    machine: StateMachine,
    now_ms: int,
    retention_ms: int,
    report: GcReport,
    part_sizes: dict[str, int],
) -> None:
    """Commit gc's lease fence, then drop from the plan every orphan a commit adopted between
    gc's first read of the log and the fence (the log is read again, after the fence)."""
    fenced = leases.fence(machine, now_ms)
    report.fence_version = fenced.version
    found = _live_versions(machine, now_ms, retention_ms)
    assert found is not None  # the fence itself is in the log
    _, earliest, rollup_version, rollup_key, entries = found
    live, _ = _referenced(machine, earliest, rollup_version, rollup_key, entries)
    adopted = [k for k in report.orphaned_parts if k in live]
    if adopted:
        # A commit landed before the fence and references them: not orphans after all.
        report.orphaned_parts = [k for k in report.orphaned_parts if k not in live]
        for key in adopted:
            part_sizes.pop(key, None)


def _plan_temporary(machine: StateMachine, floor: int, report: GcReport) -> None:
    """Leftover temporary files written before ``floor`` go into the report."""
    for meta in machine.blob.list_temporary():
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
