"""Garbage collection: dry run by default, never deletes what a live version references,
respects the retention floor, removes orphans of failed writes, truncates the log behind the
latest usable rollup, and resumes after a crash between any two deletions. gc deletes part
files, so the shards here write every part as a file (``inline_bytes=0``); inline parts under
gc are covered by test_gc_faults.py and test_inline.py."""

from __future__ import annotations

import shutil
import uuid

import pyarrow as pa
import pytest
from conformance_helpers import Clock, rows_of, tick, updates

import persistshard as ps
from persistshard.core.shard import write_transaction
from persistshard.core.statemachine.state import ShardState
from persistshard.core.storage.blob import Blob, BlobWrapper
from persistshard.core.storage.layout import ROLLUP_EVERY

HOUR_MS = 3600 * 1000


def keys(shard: ps.Shard, prefix: str = "") -> dict[str, int]:
    return {m.key: m.size for m in shard._blob.list(prefix)}


def all_reads(shard: ps.Shard) -> dict:
    state = shard.inspect.state()
    return {t: rows_of(shard.snapshot(t)) for t in range(state.since, state.upper)}


def read_state(shard: ps.Shard, state: ShardState) -> pa.Table:
    """Every update of ``state`` (a pinned, possibly old version)."""
    return shard._read_range(state, min_time=None, max_time=None)


def build(
    location: str, clock: Clock | None = None, appends: int = 3 * ROLLUP_EVERY, step_ms: int = 0
) -> ps.Shard:
    """A shard with history: appends with writer-sized compactions after each (replaced
    parts), enough versions for several rollups, and one write that never committed (every
    part a file). On ``clock`` when given (moved ``step_ms`` after each append), else the
    wall clock."""
    on_clock = {"clock": clock.now} if clock is not None else {}
    shard = ps.open_shard(location, inline_bytes=0, **on_clock)
    for t in range(appends):
        shard.append(updates([(t % 7, "x", t, 1), (t % 5, "y", t, -1)]))
        shard._maybe_compact(2)
        if clock is not None:
            clock.advance(step_ms)
    write_transaction(shard).write_updates(
        updates([(99, "lost", shard.upper, 1)]),
        lower=shard.upper,
        new_upper=shard.upper + 1,
        schema=shard.schema,
    )
    return shard


def test_gc_is_a_dry_run_by_default(tmp_path, clock):
    shard = build(str(tmp_path / "s"), clock)
    tick(shard, clock, 2 * HOUR_MS)
    before = keys(shard)
    report = shard.gc()
    assert report.dry_run and report.deleted == 0
    assert report.parts and report.rollups and report.consensus_versions
    assert keys(shard) == before
    assert report.to_json()["bytes"] == report.part_bytes + report.rollup_bytes > 0


def test_nothing_young_is_deleted(tmp_path):
    shard = build(str(tmp_path / "s"))
    before = keys(shard)
    report = shard.gc(dry_run=False)
    assert report.deleted == 0 and not report.parts and not report.rollups
    assert report.leased_parts == 1  # the write that never committed: its lease is live
    after = keys(shard)
    assert after.pop("rollups/gc/checkpoint.json")  # what gc learnt of the log
    assert after == before


def test_gc_after_the_retention_window(tmp_path, clock):
    shard = build(str(tmp_path / "s"), clock)
    tick(shard, clock, 2 * HOUR_MS)
    reads = all_reads(shard)
    history = len(shard.history())
    orphan = [k for k in keys(shard, "parts/") if k not in shard.inspect.state().part_keys()]
    report = shard.gc(dry_run=False)
    assert report.deleted == len(report.parts) + report.consensus_versions + len(report.rollups)
    assert set(keys(shard, "parts/")) == shard.inspect.state().part_keys()
    assert set(orphan) == set(report.parts)
    assert len(report.orphaned_parts) == 1  # the write that never committed
    assert report.fence_version == report.head_version + 1  # the lease fence before deleting
    assert len(shard.history()) == history + 1 - report.consensus_versions
    assert shard.verify().ok
    fresh = ps.open_shard(shard.location, clock=clock.now)
    assert all_reads(fresh) == reads
    # Only the rollup the remaining log needs is left.
    assert len([k for k in keys(shard, "rollups/") if not k.startswith("rollups/gc/")]) == 1
    again = shard.gc(dry_run=False)
    assert again.deleted == 0


def test_retention_floor_keeps_versions_a_reader_may_hold(tmp_path, clock):
    """A reader pinned a version; compaction replaced its parts. Within the retention window
    the version is live and its parts stay; once its successor is older than the window,
    they go."""
    shard = build(str(tmp_path / "s"), clock, appends=6, step_ms=1000)
    pinned = shard.inspect.state()
    pinned_rows = read_state(shard, pinned).sort_by("id")
    clock.advance(10 * 60 * 1000)
    shard.advance_since(shard.upper - 1)
    shard.compact()
    assert not pinned.part_keys() <= shard.inspect.state().part_keys()

    clock.advance(30 * 60 * 1000)  # the successor of `pinned` is 30 minutes old
    report = shard.gc(dry_run=False, now_ms=clock.ms)
    assert report.earliest_live_version <= pinned.version
    assert pinned.part_keys() <= set(keys(shard, "parts/"))
    assert read_state(shard, pinned).sort_by("id").equals(pinned_rows)

    tick(shard, clock, 2 * HOUR_MS)
    report = shard.gc(dry_run=False, now_ms=clock.ms)
    # Only the version the tick replaced is live besides the head (the tick is a commit).
    assert report.earliest_live_version == report.head_version - 1
    assert not (pinned.part_keys() - shard.inspect.state().part_keys()) & set(keys(shard, "parts/"))
    assert shard.verify().ok


def test_orphans_of_failed_writes_and_unknown_files(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    written = write_transaction(shard).write_updates(
        updates([(2, "b", 1, 1)]), lower=1, new_upper=2, schema=shard.schema
    )
    shard._blob.put("parts/not-an-id/stray.part", b"x")
    tick(shard, clock, 59 * 60 * 1000)
    assert shard.gc(dry_run=False, now_ms=clock.ms).deleted == 0
    tick(shard, clock, 2 * 60 * 1000)
    report = shard.gc(dry_run=False, now_ms=clock.ms)
    assert report.parts == written.keys() == report.orphaned_parts
    assert "parts/not-an-id/stray.part" in keys(shard)  # no readable age: never deleted
    assert rows_of(shard.snapshot()) == {(1, "a"): 1}


def test_memory_consensus(tmp_path, clock):
    from persistshard.core.storage.consensus import MemoryConsensus

    shard = ps.open_shard(
        f"memory://gc-{uuid.uuid4().hex}",
        consensus=MemoryConsensus(),
        inline_bytes=0,
        clock=clock.now,
    )
    for t in range(2 * ROLLUP_EVERY + 3):
        shard.append(updates([(t, "a", t, 1)]))
        shard._maybe_compact()
    tick(shard, clock, 2 * HOUR_MS)
    reads = all_reads(shard)
    report = shard.gc(dry_run=False)
    assert report.consensus_versions > 0 and report.parts
    assert all_reads(shard) == reads
    assert (
        all_reads(ps.open_shard(shard.location, consensus=shard._consensus, clock=clock.now))
        == reads
    )


# --- crash at any point, then resume ------------------------------------------------------


class Crash(Exception):
    pass


class CrashingBlob(BlobWrapper):
    """A blob that lets ``allowed`` deletes through and then raises on the next one."""

    def __init__(self, inner: Blob, allowed: int) -> None:
        super().__init__(inner)
        self.allowed = allowed
        self.deletes = 0

    def delete(self, key: str) -> None:
        if self.deletes >= self.allowed:
            raise Crash(f"crash before delete #{self.deletes + 1} ({key})")
        self.inner.delete(key)
        self.deletes += 1


def test_gc_resumes_after_a_crash_between_any_two_deletions(tmp_path, clock):
    template = tmp_path / "template"
    shard = build(str(template), clock, appends=2 * ROLLUP_EVERY)
    tick(shard, clock, 2 * HOUR_MS)
    pinned = shard.inspect.state()
    reads = all_reads(shard)
    now = clock.ms
    # The outcome without a crash.
    clean_dir = tmp_path / "clean"
    shutil.copytree(template, clean_dir)
    clean = ps.open_shard(str(clean_dir), clock=clock.now)
    report = clean.gc(dry_run=False, now_ms=now)
    assert report.parts and report.consensus_versions and report.rollups
    total = report.deleted
    want = keys(clean)
    for k in range(total):
        where = tmp_path / f"crash-{k}"
        shutil.copytree(template, where)
        crashing = ps.Shard(str(where), blob=CrashingBlob(Blob(str(where)), k), clock=clock.now)
        with pytest.raises(Crash):
            crashing.gc(dry_run=False, now_ms=now)
        # Whatever was deleted, the head and every read are intact...
        survivor = ps.open_shard(str(where), clock=clock.now)
        assert survivor.inspect.state().part_keys() == pinned.part_keys()
        assert pinned.part_keys() <= set(keys(survivor, "parts/"))
        assert rows_of(survivor.snapshot()) == reads[survivor.upper - 1]
        # ...and running gc again finishes the job.
        survivor.gc(dry_run=False, now_ms=now)
        # (log entries hold their commit's metrics, a duration among them: sizes may differ)
        got = keys(survivor)
        assert set(got) == set(want), k
        # (gc's checkpoint too: what it prunes depends on when the crash came)
        assert {
            f: n for f, n in got.items() if not f.startswith(("consensus/v", "rollups/gc"))
        } == {f: n for f, n in want.items() if not f.startswith(("consensus/v", "rollups/gc"))}, k
        assert survivor.verify().ok
        shutil.rmtree(where)


@pytest.mark.parametrize("seed", range(3))
def test_random_history_never_loses_a_live_version(tmp_path, clock, seed):
    """Appends, compactions, since advances and gc runs at random moments of a random clock.
    After every gc, every version that was the head within the retention window (a reader
    may hold it) still has all its parts, and the head reads the same as before."""
    import random

    rng = random.Random(seed)
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.compare_and_append(None, 0, 0)  # the empty shard: gc and compaction need one
    history: list[tuple[ShardState, int | None]] = []  # (version, when it stopped being head)

    def record() -> None:
        state = shard.inspect.state()
        if history and history[-1][0].version == state.version:
            return
        if history:
            history[-1] = (history[-1][0], clock.ms)
        history.append((state, None))

    deleted = 0
    for step in range(80):
        clock.advance(rng.randrange(0, 40 * 60 * 1000))
        op = rng.random()
        if op < 0.5:
            t = shard.upper
            shard.append(updates([(rng.randrange(6), "x", t, rng.choice([1, -1]))]))
        elif op < 0.65:
            shard.advance_since(max(0, shard.upper - rng.randrange(3)))
        elif op < 0.85:
            shard._maybe_compact(rng.randrange(1, 3)) if rng.random() < 0.5 else shard.compact()
        else:
            before = all_reads(shard)
            deleted += shard.gc(dry_run=False, now_ms=clock.ms).deleted
            present = set(keys(shard, "parts/"))
            floor = clock.ms - HOUR_MS
            for state, until in history:
                if until is None or until > floor:
                    assert state.part_keys() <= present, (step, state.version)
            assert all_reads(shard) == before
        record()
    assert shard.verify().ok
    assert deleted > 0
