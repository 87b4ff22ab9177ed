"""Repair: restore a shard whose newest consensus entries are unreadable to its last valid
version (``persistshard repair LOCATION [--apply]``).

When can the newest entries be unreadable? On a store that honours fsync, never from a crash:
a put syncs the entry's bytes before its name is published (`persistshard.core.storage.blob`), so an
entry is either absent or whole. It happens when the storage lied about a sync (a disk
cache without power-loss protection, a filesystem mounted without barriers), or when the
disk damaged the bytes: a 0-byte file, a torn (short) file, or bytes whose crc32c fails.

What `plan` finds and `apply` drops, and why that is safe:
- Only the *newest* entries, and only those whose own bytes do not decode (no header, wrong
  magic, length or crc32c; `RepairEntry.problem` says which). An unreadable entry's commit
  was never observed by anyone: every reader fails on it, and the writer that created it
  was not acknowledged by a store that lost its bytes. Its parts are orphans gc sweeps.
- The state at the version below them must load (its rollup and the log from there fold and
  check). If it does not, the damage is deeper than a torn write: `plan` raises
  `CorruptData` and nothing is dropped (restore the files from a backup).
- A readable entry is never dropped, so nothing acknowledged is dropped on a store that
  honours fsync. Entries are deleted newest first: a crash in the middle leaves a shorter
  run of unreadable entries, and running repair again finishes the job.

Works on the log kept next to the data (`BlobConsensus`); another consensus keeps its entries
where this cannot delete them, and is refused with `StorageUnsupported`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from persistshard.core.statemachine.encoding import ENTRY_MAGIC, Entry, fold, unseal
from persistshard.core.statemachine.machine import StateMachine
from persistshard.core.statemachine.state import ShardState
from persistshard.core.storage.consensus import BlobConsensus
from persistshard.errors import CorruptData, StorageUnsupported

log = logging.getLogger("persistshard.core.maintenance.repair")


@dataclass(frozen=True)
class RepairEntry:
    """One unreadable entry: its version, stored file, size in bytes and what is wrong."""

    version: int
    file: str
    size: int
    problem: str


@dataclass
class RepairReport:
    """What repair found: the newest stored version, the last valid one it restores, and the
    unreadable entries above it (dropped when ``applied``)."""

    location: str
    newest_version: int
    valid_version: int
    dropped: list[RepairEntry] = field(default_factory=list)
    valid_upper: int = 0
    applied: bool = False

    @property
    def needed(self) -> bool:
        return bool(self.dropped)


def _problem(consensus: BlobConsensus, version: int, location: str) -> tuple[int, str | None]:
    """(stored size, why the entry of ``version`` is not whole, or None if it is).

    Whole means its bytes are: the header, the magic, the length and the checksum hold. An
    entry whose bytes are whole but whose commit this version cannot read (a kind a newer
    library wrote, arguments it does not know) is whole too: it may be an acknowledged commit,
    so repair never drops it (the version below it then fails to be the newest readable one
    only if it is damaged itself, and repair refuses)."""
    key = consensus.entry_name(version)
    raw = consensus.blob.get(key)
    if raw is None:
        return 0, "missing"
    try:
        found = consensus.scan(version, limit=1)
        if not found or found[0].version != version:
            return len(raw), "missing"
        unseal(ENTRY_MAGIC, found[0].data, "consensus entry", key, location)
    except CorruptData as e:
        return len(raw), e.detail
    return len(raw), None


def _state_at(machine: StateMachine, version: int) -> ShardState:
    """The state of ``version``, rebuilt from its rollup and the log (CorruptData if not)."""
    consensus = machine.consensus
    (top,) = consensus.scan(version, limit=1)
    entry = Entry.decode(top.data, consensus.entry_name(version), machine.location)
    base = machine.load_rollup(entry.rollup_version, entry.rollup_key)
    logged = (
        consensus.scan(base.version + 1, version - base.version) if base.version < version else []
    )
    commits = [
        Entry.decode(e.data, consensus.entry_name(e.version), machine.location).commit
        for e in logged
    ]
    state = fold(base, commits, machine.location)
    if state.version != version:
        raise CorruptData(
            f"cannot rebuild version {version}: the log from rollup version {base.version} "
            f"reaches only version {state.version}",
            location=machine.location,
        )
    return state


def plan(machine: StateMachine) -> RepairReport:
    """What repair would drop (module docstring); reads only."""
    consensus = machine.consensus
    if not isinstance(consensus, BlobConsensus):
        raise StorageUnsupported(
            f"repair deletes damaged entries of the log kept next to the data; this shard's "
            f"log is kept by {type(consensus).__name__}: repair it with that store's own tools",
            location=machine.location,
        )
    versions = consensus._versions()
    report = RepairReport(machine.location, versions[-1] if versions else 0, 0)
    for version in reversed(versions):
        size, problem = _problem(consensus, version, machine.location)
        if problem is None:
            report.valid_version = version
            break
        report.dropped.append(RepairEntry(version, consensus.entry_name(version), size, problem))
    if report.valid_version:
        try:
            report.valid_upper = _state_at(machine, report.valid_version).upper
        except CorruptData as e:
            raise CorruptData(
                f"repair cannot restore version {report.valid_version}, the newest readable "
                f"one: {e.detail}. The damage is older than the newest entries, or a whole "
                "entry holds a commit this version cannot read (written by a newer "
                "persistshard? upgrade first); nothing was changed: otherwise restore the "
                "shard's files from a backup",
                location=machine.location,
            ) from e
    elif report.dropped:
        raise CorruptData(
            f"repair found no readable consensus entry (the {len(report.dropped)} stored are "
            "all damaged); nothing was changed: restore the shard's files from a backup",
            location=machine.location,
        )
    return report


def repair(machine: StateMachine, *, apply: bool = False) -> RepairReport:
    """`plan`, and with ``apply`` delete the unreadable newest entries, newest first, so the
    last valid version is the head again."""
    report = plan(machine)
    if not apply or not report.dropped:
        return report
    consensus = machine.consensus
    assert isinstance(consensus, BlobConsensus)
    for dropped in report.dropped:  # newest first: the log stays contiguous at every step
        log.warning(
            "%s: repair drops version %d (%s): %s",
            machine.location,
            dropped.version,
            dropped.file,
            dropped.problem,
        )
        consensus.blob.delete(dropped.file)
    report.applied = True
    return report
