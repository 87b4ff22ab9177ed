"""Maintenance that runs itself: the bounded work a writer does after its own commit.

After every commit of a writer (`persistshard.core.shard.Shard`'s appends, upserts and seals,
and the Spark driver after it commits a write), `AutoMaintenance.after_commit`:

1. runs the compaction the Spine says is due (`persistshard.core.maintenance.compact.
   maybe_compact`: unsealed absorption and same-level merges, never the whole-trace merge),
   at most ``max_merges`` merges and no new merge once ``budget_seconds`` have passed;
2. when since moved during the commit (the shard's history retention moves it inside the
   commit itself, `persistshard.core.statemachine.retention`), runs gc
   (`persistshard.core.maintenance.gc.collect`, with all of gc's own safety: write leases,
   the lease fence, the retention floor of `DEFAULT_RETENTION_SECONDS`), at most once per
   ``gc_interval_seconds`` per shard handle, since gc lists every part.

What always holds:
- The user's commit is already acknowledged when this runs: a failure here never reaches the
  caller. A maintenance step that loses a race (`StateConflict`: another compactor won) is
  skipped silently; any other error is logged on ``persistshard.core.maintenance.auto`` with its
  traceback and the rest of the step is skipped. A process that dies in the middle leaves
  what a crash of an explicit compaction or gc leaves (both are crash-safe on their own:
  `persistshard.conformance.crash`).
- Maintenance never changes what a read at or after since returns (the package invariant).
- The work per commit is bounded: ``max_merges`` merges (each of one Spine group, so its
  size is that of the batches it merges) and one gc listing per interval.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from persistshard.core.maintenance.compact import CompactionReport, maybe_compact
from persistshard.core.maintenance.gc import GcReport, collect
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.storage.layout import DEFAULT_RETENTION_SECONDS
from persistshard.errors import StateConflict

log = logging.getLogger("persistshard.core.maintenance.auto")

#: Merges a writer runs after one commit at most (one Spine group each).
MAX_MERGES = 2
#: No new merge starts after this many seconds of a writer's maintenance.
BUDGET_SECONDS = 5.0
#: A shard handle runs gc at most once per this many seconds.
GC_INTERVAL_SECONDS = 60.0


@dataclass
class MaintenanceReport:
    """What one `AutoMaintenance.after_commit` did: merges committed, whether gc ran and
    what it deleted, and the errors it logged and swallowed (by class name)."""

    compaction: CompactionReport | None = None
    gc: GcReport | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def merges(self) -> int:
        return self.compaction.committed if self.compaction is not None else 0


@dataclass
class AutoMaintenance:
    """A shard handle's after-commit maintenance (module docstring); ``enabled=False`` makes
    it do nothing."""

    enabled: bool = True
    max_merges: int = MAX_MERGES
    budget_seconds: float = BUDGET_SECONDS
    gc_interval_seconds: float = GC_INTERVAL_SECONDS
    #: gc's retention floor (`persistshard.core.maintenance.gc`): what it keeps regardless.
    gc_retention_seconds: float = DEFAULT_RETENTION_SECONDS
    _last_gc: int | None = None  # when this handle last ran gc (ms, the shard's clock)

    def after_commit(
        self, machine: StateMachine, since_before: int, *, compact: bool = True
    ) -> MaintenanceReport | None:
        """Run the bounded maintenance after a commit that found since at ``since_before``;
        None when switched off. Never raises a non-fatal error (module docstring)."""
        if not self.enabled:
            return None
        report = MaintenanceReport()
        if compact:
            self._compact(machine, report)
        since = machine.known().since
        now = machine.config.clock()
        due = self._last_gc is None or now - self._last_gc >= self.gc_interval_seconds * 1000
        if since > since_before and due:
            self._last_gc = now
            try:
                report.gc = collect(
                    machine, dry_run=False, retention_seconds=self.gc_retention_seconds
                )
                if report.gc.deleted:
                    log.info(
                        "gc after a commit on %s deleted %d objects (%d part bytes)",
                        machine.location,
                        report.gc.deleted,
                        report.gc.part_bytes,
                    )
            except StateConflict:
                log.debug("gc on %s lost a race; skipped", machine.location)
            except Exception as e:
                report.errors.append(type(e).__name__)
                log.warning(
                    "gc after a commit on %s failed; the commit stands: %s",
                    machine.location,
                    e,
                    exc_info=True,
                )
        return report

    def _compact(self, machine: StateMachine, report: MaintenanceReport) -> None:
        started = time.monotonic()
        merges = 0
        while merges < self.max_merges and time.monotonic() - started < self.budget_seconds:
            try:
                done = maybe_compact(machine, max_merges=1)
            except StateConflict:
                log.debug("compaction on %s lost a race; skipped", machine.location)
                return
            except Exception as e:
                report.errors.append(type(e).__name__)
                log.warning(
                    "compaction after a commit on %s failed; the commit stands: %s",
                    machine.location,
                    e,
                    exc_info=True,
                )
                return
            if done is None or not done.merges:
                return
            if report.compaction is None:
                report.compaction = done
            else:
                report.compaction.merges.extend(done.merges)
                report.compaction.stats.add(done.stats)
                report.compaction.conflicts += done.conflicts
                report.compaction.levels_after = done.levels_after
                report.compaction.batches_after = done.batches_after
            merges += len(done.merges)
            if done.conflicts:
                return  # another compactor is on it
