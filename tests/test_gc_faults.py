"""gc under the faults of issue 36: a writer stalled between its rollup and its
compare-and-set, other writers' temporary files, reads that lose a race with gc, out-of-range
arguments, and gc's cost on a long retained log."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from conformance_helpers import Clock, rows_of

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.conformance.faults import FaultyBlob
from persistshard.core.shard import write_transaction
from persistshard.core.storage import layout
from persistshard.core.storage.blob import BlobWrapper, open_blob, temporary_name
from persistshard.core.storage.layout import ROLLUP_EVERY
from persistshard.errors import CorruptData, InvalidOption, StateConflict


def table(t: int) -> pa.Table:
    return pa.table({"id": [t], "_time": [t], "_diff": [1]})


def test_gc_never_deletes_the_rollup_of_a_commit_in_flight(tmp_path, clock):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, clock=clock.now)
    for t in range(ROLLUP_EVERY - 1):
        shard.append(table(t))
        clock.advance(10)
    ran: list[ps.GcReport] = []

    def gc_while_stalled() -> None:
        # The writer's rollup of version ROLLUP_EVERY is written; its entry is not yet.
        if ran or not shard._blob.list("rollups/"):
            return
        clock.advance(1000)
        ran.append(ps.open_shard(location, clock=clock.now).gc(dry_run=False, retention_seconds=0))

    stalling = FaultyBlob(
        open_blob(location),
        operations=frozenset({"put_if_absent"}),
        stall=1.0,
        on_stall=gc_while_stalled,
    )
    writer = ps.Shard(location, blob=stalling, maintenance=False, clock=clock.now)
    writer.append(table(ROLLUP_EVERY - 1))
    assert ran, "gc did not run while the writer was stalled"
    assert not ran[0].rollups
    fresh = ps.open_shard(location, clock=clock.now)
    assert fresh.inspect.state().version == ROLLUP_EVERY
    assert len(rows_of(fresh.snapshot())) == ROLLUP_EVERY
    assert fresh.verify().ok
    fresh.gc(dry_run=False, retention_seconds=0)  # and gc itself still reads the shard


def test_gc_keeps_temporary_files_younger_than_the_write_lease(tmp_path, clock):
    location = tmp_path / "s"
    shard = ps.open_shard(str(location), maintenance=False, inline_bytes=0, clock=clock.now)
    shard.append(table(0))
    in_flight = location / "parts" / temporary_name()  # another writer's put, not published yet
    in_flight.write_bytes(b"partial")
    clock.advance(5000)
    shard.append(table(1))
    report = shard.gc(dry_run=False, retention_seconds=0)
    assert not report.temporary and in_flight.exists()


def _replace_parts_under_a_pinned_read(location: str, clock) -> tuple[ps.Shard, ps.Scan]:
    """A scan pinned to a version whose part files gc collected (every part a file)."""
    shard = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(4):
        shard.append(table(t))
    scan = shard.scan()  # pins this version
    shard.compact()  # replaces every part the pinned version reads
    clock.advance(2000)
    shard.append(table(4))
    report = ps.open_shard(location, clock=clock.now).gc(dry_run=False, retention_seconds=0)
    assert report.parts  # the pinned version's parts are gone
    return shard, scan


def test_a_read_that_loses_a_race_with_gc_is_retryable_not_corrupt(tmp_path, clock):
    shard, scan = _replace_parts_under_a_pinned_read(str(tmp_path / "s"), clock)
    with pytest.raises(StateConflict) as info:
        scan.to_arrow()
    assert not isinstance(info.value, CorruptData)
    assert "read again" in str(info.value)
    assert shard.scan().to_arrow().num_rows == 5  # reading again works


def test_a_part_missing_from_the_newest_version_is_still_corrupt(tmp_path, clock):
    location = tmp_path / "s"
    shard = ps.open_shard(str(location), maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(3):
        shard.append(table(t))
    key = shard.inspect.state().trace[0].parts[0].key
    (location / key).unlink()
    with pytest.raises(CorruptData):
        shard.snapshot()
    with pytest.raises(CorruptData):
        shard.scan().to_arrow()


# --- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1.0, -0.001, math.nan, math.inf, -math.inf])
def test_out_of_range_retention_is_invalid_option(tmp_path, bad):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    shard.append(table(0))
    before = {m.key for m in shard._blob.list("")}
    with pytest.raises(InvalidOption, match="retention"):
        shard.gc(dry_run=False, retention_seconds=bad)
    with pytest.raises(InvalidOption, match="retention"):
        shard.set_retention(seconds=bad)
    assert {m.key for m in shard._blob.list("")} == before


def test_retention_zero_stays_valid_and_set_retention_zero_is_invalid_option(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    shard.append(table(0))
    shard.gc(dry_run=False, retention_seconds=0)
    with pytest.raises(InvalidOption):
        shard.set_retention(seconds=0)  # a history window of nothing: not a retention


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["gc", "--retention-seconds", "-5"], "--retention-seconds"),
        (["gc", "--retention-seconds", "nan"], "--retention-seconds"),
        (["gc", "--apply", "--retention-seconds", "inf"], "--retention-seconds"),
        (["retention", "--seconds", "-1"], "--seconds"),
        (["retention", "--seconds", "nan"], "--seconds"),
    ],
)
def test_cli_refuses_out_of_range_seconds_in_one_line(tmp_path, capsys, argv, flag):
    location = str(tmp_path / "s")
    ps.open_shard(location, maintenance=False).append(table(0))
    code = cli([argv[0], location, *argv[1:]])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and flag in err, err


# --- clocks ------------------------------------------------------------------------------

DAY_MS = 24 * 3600 * 1000


def _with_an_orphan(location: str, clock: Clock, **options: int) -> ps.Shard:
    """A shard on ``clock`` with one write that never committed (gc fences before deleting
    it); ``options`` go to `open_shard`."""
    shard = ps.open_shard(location, maintenance=False, clock=clock.now, **options)
    shard.append(table(0))
    write_transaction(shard).write_updates(table(1), lower=1, new_upper=2, schema=shard.schema)
    return shard


def test_gc_with_now_ms_far_ahead_is_invalid_option(tmp_path, clock):
    shard = _with_an_orphan(str(tmp_path / "s"), clock)
    with pytest.raises(InvalidOption, match="now_ms"):
        shard.gc(dry_run=False, now_ms=clock.ms + DAY_MS)
    shard.append(table(1))


@pytest.mark.parametrize("inline", [False, True])
def test_a_gc_whose_clock_is_ahead_blocks_no_write(tmp_path, clock, inline):
    inline_bytes = 1 << 16 if inline else 0  # the writes' parts inline, or all files
    location = str(tmp_path / "s")
    shard = _with_an_orphan(location, clock, inline_bytes=inline_bytes)
    real = clock.ms
    clock.ms = real + DAY_MS  # the gc process's clock runs a day ahead
    ps.open_shard(location, maintenance=False, clock=clock.now).gc(
        dry_run=False, retention_seconds=0
    )
    clock.ms = real + 1000  # every other process has the right time
    writer = ps.open_shard(location, maintenance=False, inline_bytes=inline_bytes, clock=clock.now)
    writer.append(table(1))
    writer.append(table(2))
    assert len(rows_of(ps.open_shard(location, clock=clock.now).snapshot())) == 3
    assert shard.inspect.state().lease_fence_ms <= real + 1000 + layout.CLOCK_LEAD_MS


@pytest.mark.parametrize("inline", [False, True])
def test_a_shard_fenced_in_the_future_by_an_older_gc_takes_writes(tmp_path, clock, inline):
    """A fence an older gc committed hours ahead (before fences were bounded) no longer
    refuses every write until real time catches up: a writer's write ids start their leases
    at the shard's time as it reads it, the fence included. Before: `LeaseExpired`."""
    from persistshard.core.statemachine import leases

    inline_bytes = 1 << 16 if inline else 0  # the writes' parts inline, or all files
    location = str(tmp_path / "s")
    opened = {"maintenance": False, "inline_bytes": inline_bytes, "clock": clock.now}
    ps.open_shard(location, **opened).append(table(0))
    leases.fence(ps.open_shard(location, clock=clock.now)._machine, clock.ms + 6 * 3_600_000)
    writer = ps.open_shard(location, **opened)
    writer.append(table(1))
    writer.append(table(2))
    assert len(rows_of(ps.open_shard(location, clock=clock.now).snapshot())) == 3


def test_a_gc_clock_behind_or_jumping_loses_no_commit(tmp_path, clock):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, clock=clock.now)
    for t in range(ROLLUP_EVERY * 2):
        start = clock.ms
        if t % 5 == 0 and t > 0:  # (gc of a location without a shard is NoShard)
            clock.ms = start - DAY_MS  # a gc whose clock is a day behind
            ps.open_shard(location, clock=clock.now).gc(dry_run=False, retention_seconds=0)
        elif t % 5 == 2:
            clock.ms = start + 3_600_000  # a gc whose clock jumps an hour ahead
            ps.open_shard(location, clock=clock.now).gc(dry_run=False, retention_seconds=0)
        clock.ms = start + 100
        shard.append(table(t))
        shard.compact()
    fresh = ps.open_shard(location, clock=clock.now)
    assert len(rows_of(fresh.snapshot())) == ROLLUP_EVERY * 2
    assert fresh.verify().ok


# --- cost --------------------------------------------------------------------------------


class LogReads(BlobWrapper):
    """Counts the log entries read (gets of ``consensus/v...``)."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.reads = 0

    def get(self, key: str) -> bytes | None:
        if key.startswith("consensus/v"):
            self.reads += 1
        return self.inner.get(key)


def test_gc_reads_only_the_entries_since_its_last_run(tmp_path, clock):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, clock=clock.now)
    shard.append(table(0))
    retained = 30 * ROLLUP_EVERY
    for t in range(retained):
        shard.seal(t + 2)  # cheap commits; all inside gc's retention window
    counting = LogReads(open_blob(location))
    gc = ps.Shard(location, blob=counting, maintenance=False, clock=clock.now)
    gc.gc(dry_run=False)
    first = counting.reads
    assert first >= retained  # the first run reads the retained log once
    counting.reads = 0
    gc.gc(dry_run=False)
    assert counting.reads <= 2 * ROLLUP_EVERY, counting.reads
    for t in range(5):
        shard.seal(retained + 2 + t)
    counting.reads = 0
    report = ps.Shard(location, blob=counting, maintenance=False, clock=clock.now).gc(dry_run=False)
    assert counting.reads <= 2 * ROLLUP_EVERY + 5, counting.reads
    assert report.head_version == shard.inspect.state().version
    assert len(rows_of(ps.open_shard(location, clock=clock.now).snapshot())) == 1


class GcBeforeFirstPartRead(BlobWrapper):
    """A store whose first read of a part lets ``meanwhile`` run first (another process's
    compaction and gc at retention 0, between this compaction's plan and its reads)."""

    def __init__(self, inner, meanwhile) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.meanwhile = meanwhile

    def _maybe(self, key: str) -> None:
        if key.startswith("parts/") and self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()

    def get(self, key: str) -> bytes | None:
        self._maybe(key)
        return self.inner.get(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self._maybe(key)
        return self.inner.get_range(key, offset, length)


def test_a_compaction_whose_inputs_gc_collected_is_a_state_conflict(tmp_path, clock):
    """A compaction plans on a state, then another process compacts the same batches and gc
    (retention 0) deletes them before this one reads them: a lost race (`StateConflict`: run
    it again), not `CorruptData`; the shard stays whole. Before: `CorruptData`."""
    from persistshard.core.storage.recent import RECENT

    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(4):
        writer.append(table(t))
    RECENT.clear()  # the inputs must be read from the store, not this process's memory

    def meanwhile() -> None:
        other = ps.open_shard(location, maintenance=False, clock=clock.now)
        other.compact()
        clock.advance(10)
        other.gc(dry_run=False, retention_seconds=0)

    blob = GcBeforeFirstPartRead(open_blob(location), meanwhile)
    late = ps.Shard(location, blob=blob, maintenance=False, clock=clock.now)
    late.inspect.state()
    with pytest.raises(StateConflict, match="VersionCollected"):
        late.compact()
    fresh = ps.open_shard(location, clock=clock.now)
    assert len(rows_of(fresh.snapshot())) == 4 and fresh.verify().ok


def test_an_upsert_whose_current_rows_gc_collected_retries_on_the_newest_state(tmp_path, clock):
    """An upsert reads the current rows of the keys it replaces at one state; another process
    compacts those rows' batches and gc (retention 0) deletes them before the read: a lost
    race, retried on the newest state (as after an `UpperMismatch`), never `CorruptData`.
    Before: `CorruptData`."""
    from persistshard.core.storage.recent import RECENT

    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for k in range(4):
        writer.upsert(pa.table({"k": [k], "v": [f"a{k}"]}), key_columns=["k"])
    RECENT.clear()

    def meanwhile() -> None:
        other = ps.open_shard(location, maintenance=False, clock=clock.now)
        other.compact()
        clock.advance(10)
        other.gc(dry_run=False, retention_seconds=0)

    late = ps.Shard(
        location,
        blob=GcBeforeFirstPartRead(open_blob(location), meanwhile),
        maintenance=False,
        inline_bytes=0,
        clock=clock.now,
    )
    late.inspect.state()
    late.upsert(pa.table({"k": [1, 9], "v": ["b1", "b9"]}), key_columns=["k"])
    got = {
        (r["k"], r["v"]) for r in ps.open_shard(location, clock=clock.now).snapshot().to_pylist()
    }
    assert got == {(0, "a0"), (1, "b1"), (2, "a2"), (3, "a3"), (9, "b9")}
