"""Which shard time a wall-clock instant means: SQL's ``TIMESTAMP AS OF`` (the JVM
companion's session catalog asks it through `persistshard.datasource.bridge`).

Shard times are logical; the only wall-clock record is the commit time every consensus log
entry carries (``Entry.at_ms``, the committing process's clock). The shard time of an
instant is the newest time readable in the state the log had reached at that instant:
``upper - 1`` of the state after the newest retained entry recorded at or before it.

Invariants:
- Only retained log entries count (older ones were truncated with their times): an instant
  before the oldest retained entry's time is `SinceViolation`, never a guess.
- An instant after every entry is ``upper - 1`` of the newest state (the present).
- Entries without a recorded time (written before times were recorded) are skipped; their
  states still fold into the uppers of the entries after them.
- An instant at which the shard held no time yet (upper 0) is `InvalidOption`.
- The answer is never below ``since``: such a time was compacted away (`SinceViolation`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from persistshard.core.statemachine import encoding
from persistshard.core.statemachine.state import ShardState
from persistshard.errors import InvalidOption, SinceViolation

if TYPE_CHECKING:
    from persistshard.core.shard import Shard

log = logging.getLogger("persistshard.core.read.instant")


def _text(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1_000_000, UTC).isoformat()


def commit_uppers(shard: Shard) -> list[tuple[int, int]]:
    """``(commit time in ms, upper after that commit)`` of every retained log entry with a
    recorded time, oldest first (the log replayed from the rollup the oldest one names)."""
    machine = shard._machine
    entries = machine.entries(1)
    if not entries:
        return []
    by_version = {v: e for v, e in entries}
    out: list[tuple[int, int]] = []
    state: ShardState | None = None
    for version, entry in entries:
        if state is not None and state.version == version - 1:
            state = encoding.fold(state, [entry.commit], shard.location)
        else:
            base = machine.load_rollup(entry.rollup_version, entry.rollup_key)
            between = range(base.version + 1, version + 1)
            if base.version > version or any(v not in by_version for v in between):
                continue  # this entry's state cannot be rebuilt from what is retained
            commits = [by_version[v].commit for v in between]
            state = encoding.fold(base, commits, shard.location)
        if entry.at_ms is not None:
            out.append((entry.at_ms, state.upper))
    return out


def time_at_instant(shard: Shard, micros: int) -> int:
    """The shard time of the instant ``micros`` (microseconds since the epoch, Spark's
    ``TIMESTAMP AS OF``): module docstring."""
    marks = commit_uppers(shard)
    since = shard.since
    if not marks or micros < marks[0][0] * 1000:
        oldest = f"{_text(marks[0][0] * 1000)}" if marks else "none"
        raise SinceViolation(
            -1,
            since,
            location=shard.location,
            message=f"TIMESTAMP AS OF {_text(micros)} is before the oldest commit the log "
            f"still records ({oldest}); history before it is gone, read at a later instant",
        )
    upper = next(u for at_ms, u in reversed(marks) if at_ms * 1000 <= micros)
    if upper == 0:
        raise InvalidOption(
            f"TIMESTAMP AS OF {_text(micros)}: nothing was written to the shard by then "
            f"(its first data commit came later)",
            location=shard.location,
        )
    if upper - 1 < since:
        raise SinceViolation(upper - 1, since, location=shard.location)
    log.debug("%s: instant %s is shard time %d", shard.location, _text(micros), upper - 1)
    return upper - 1
