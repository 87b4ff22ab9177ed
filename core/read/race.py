"""Reads that lose a race with gc: a collected part of a replaced version is `VersionCollected`
(read again), a missing part of the newest version stays `CorruptData`.

Every read pins one state version and then reads the parts it names: `Shard.snapshot`,
`Shard.updates`, a `persistshard.core.read.scan.Scan` (consumed any time later), a listener's
deliveries (through the first two) and the tasks of a Spark job (its driver pinned the version
in ``partitions()``). gc keeps every part of a *live* version: the head, and every version
that was the head less than the retention window ago (`persistshard.core.maintenance.gc`).
Once the pinned version has been replaced for longer than that, gc may delete a part only it
named (one a compaction or an overwrite replaced), and the read finds the part missing:
`persistshard.core.storage.parts.open_part` raises `CorruptData` with ``missing`` set.

What decides between a race and damage (`check_collected`) is the newest state, read after
the part was found missing:
- the pinned version is no longer the newest and the newest names no part under that key:
  the part was collected and the read lost the race, `VersionCollected` (a `StateConflict`:
  nothing was returned; a new read pins the newest version and succeeds);
- anything else stays `CorruptData`: a part missing from the newest version (gc never deletes
  a part the head names), a missing part of a read that pinned the newest version, and every
  checksum, magic number or length that does not match (the bytes are there and wrong).

What it relies on: part keys are never reused (each holds a fresh write id and uuid), so a key
the newest version does not name is never named again, and gc deletes only parts that no live
version names. Reading the newest state may itself fail (the storage is unreachable): that
error reaches the caller, with the missing part as its context.

The same race one level down, a state read whose rollup or log entries gc removed while the
head moved on, is retried inside `persistshard.core.statemachine.machine.StateMachine`
(``_read_state``); at an unchanged head it is `CorruptData`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from persistshard.core.statemachine.state import ShardState
from persistshard.errors import CorruptData, VersionCollected

log = logging.getLogger("persistshard.core.read.race")

#: Reads the shard's newest state (re-reading the consensus head), e.g.
#: ``StateMachine.state``.
Newest = Callable[[], ShardState]


def check_collected(error: CorruptData, pinned: int, newest: Newest, location: str) -> None:
    """Raise `VersionCollected` (from ``error``) when ``error``, met by a read pinned to
    version ``pinned`` of the shard at ``location``, is a part gc collected (module docstring);
    otherwise return, and the caller re-raises ``error``. Reads the newest state only for a
    missing part."""
    if not error.missing or error.file is None:
        return
    current = newest()
    if current.version <= pinned or error.file in current.part_keys():
        return
    log.info(
        "read of version %d at %s lost a race with gc (newest version %d no longer names %s)",
        pinned,
        location,
        current.version,
        error.file,
    )
    raise VersionCollected(pinned, current.version, error.file, location=location) from error


@contextmanager
def pinned_read(pinned: int, newest: Newest | None, location: str) -> Iterator[None]:
    """Run a read of version ``pinned``; a `CorruptData` it raises that `check_collected` finds
    to be a race with gc leaves as `VersionCollected`, any other as itself. ``newest`` None:
    nothing can tell (every error leaves as itself). Wraps a generator's body too: the error
    is judged where the consumer meets it."""
    try:
        yield
    except CorruptData as e:
        if newest is not None:
            check_collected(e, pinned, newest, location)
        raise
