"""Reads that lose a race with gc (issue 36, item 2): a read pinned to a version whose parts gc
collected (the version was replaced, and the retention window has passed) gets
`VersionCollected`, a `StateConflict` that says to read again, on every read path: the eager
reads (`Shard.snapshot`, `Shard.updates`), the lazy scans (met while iterating), `listen` and
the Spark batch reader's tasks. A part the newest version still names that is missing stays
`CorruptData`. The races are with gc deleting part files, so the writers here write every part
as a file (``inline_bytes=0``)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.storage.blob import BlobWrapper, open_blob
from persistshard.errors import CorruptData, StateConflict, VersionCollected


def table(t: int, n: int = 1) -> pa.Table:
    return pa.table({"id": list(range(t * n, (t + 1) * n)), "_time": [t] * n, "_diff": [1] * n})


def collect(location: str, clock) -> None:  # type: ignore[no-untyped-def]
    """Replace every part (compaction), let the retention window pass and gc at retention 0:
    every version before the compaction is no longer live, and its parts are gone."""
    other = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    other.compact()
    clock.advance(2000)
    other.append(table(other.upper))
    report = other.gc(dry_run=False, retention_seconds=0)
    assert report.parts


class GcAtFirstPartRead(BlobWrapper):
    """A blob that runs ``before`` once, just before the first ranged read of a part: gc
    runs between the moment a read pinned its version and the moment it reads a part."""

    def __init__(self, location: str, before: Callable[[], None]) -> None:
        super().__init__(open_blob(location))
        self.before: Callable[[], None] | None = before

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if key.startswith("parts/") and self.before is not None:
            before, self.before = self.before, None
            before()
        return super().get_range(key, offset, length)


def _shard(tmp_path, clock, n: int = 4) -> tuple[str, ps.Shard]:  # type: ignore[no-untyped-def]
    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(n):
        writer.append(table(t))
    reader = ps.Shard(
        location,
        blob=GcAtFirstPartRead(location, lambda: collect(location, clock)),
        maintenance=False,
        clock=clock.now,
    )
    return location, reader


def _check(error: BaseException, location: str) -> None:
    assert isinstance(error, VersionCollected) and isinstance(error, StateConflict)
    assert not isinstance(error, CorruptData)
    text = str(error)
    assert text.startswith("VersionCollected: "), text
    assert "read again" in text and location in text and "parts/" in text, text
    assert "version 4" in text, text  # the pinned version (four appends)


def test_a_snapshot_that_loses_a_race_with_gc_is_version_collected(tmp_path, clock):
    location, reader = _shard(tmp_path, clock)
    with pytest.raises(VersionCollected) as info:
        reader.snapshot()
    _check(info.value, location)
    assert reader.snapshot().num_rows == 5  # reading again works


def test_updates_that_lose_a_race_with_gc_are_version_collected(tmp_path, clock):
    location, reader = _shard(tmp_path, clock)
    with pytest.raises(VersionCollected) as info:
        reader.updates(0, 4)
    _check(info.value, location)
    assert reader.updates(0, 4).num_rows == 4


def test_a_change_scan_consumed_after_gc_is_version_collected(tmp_path, clock):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(4):
        shard.append(table(t))
    scan = shard.scan_updates(0, 4)
    collect(location, clock)
    with pytest.raises(VersionCollected) as info:
        scan.to_arrow()
    _check(info.value, location)
    assert shard.scan_updates(0, 4).to_arrow().num_rows == 4


def test_a_scan_that_meets_a_collected_part_while_iterating_is_version_collected(tmp_path, clock):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    n = 30  # more parts than a scan reads ahead of its consumer
    for t in range(n):
        shard.append(table(t, 100))
    batches = shard.scan().to_batches()
    first = next(batches)  # the scan has started: footers read, some parts decoded
    assert first.num_rows
    collect(location, clock)
    with pytest.raises(VersionCollected) as info:
        for _ in batches:
            pass
    assert "read again" in str(info.value) and f"version {n}" in str(info.value)
    assert shard.scan().to_arrow().num_rows == n * 100 + 1


def test_a_scan_through_the_arrow_stream_is_version_collected(tmp_path, clock):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(4):
        shard.append(table(t))
    scan = shard.scan()
    collect(location, clock)
    with pytest.raises(VersionCollected):
        scan.to_arrow_batch_reader().read_all()


def test_listen_that_loses_a_race_with_gc_delivers_on_the_next_call(tmp_path, clock):
    location, reader = _shard(tmp_path, clock)
    with reader.listen(3, timeout=0) as listener:
        with pytest.raises(VersionCollected) as info:
            next(listener)
        assert "read again" in str(info.value) and location in str(info.value)
        updates, frontier = next(listener)  # nothing was delivered: it reads again
        assert frontier == 4 and updates.num_rows == 4


def test_the_spark_reader_task_that_meets_a_collected_part_is_version_collected(tmp_path, clock):
    from pyspark.sql.types import LongType, StructField, StructType

    from persistshard.datasource.reader import PersistShardReader, read_partition

    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(4):
        shard.append(table(t))
    schema = StructType([StructField("id", LongType())])
    reader = PersistShardReader({"path": location}, schema)
    partitions = reader.partitions()  # the driver pinned version 4
    collect(location, clock)
    for partition in partitions:
        with pytest.raises(VersionCollected) as info:
            list(reader.read(partition))
        _check(info.value, location)  # Spark shows the text: it starts with the class name
        with pytest.raises(VersionCollected):
            read_partition(partition)  # (the streaming reader's tasks)
    again = PersistShardReader({"path": location}, schema)
    assert sum(b.num_rows for p in again.partitions() for b in again.read(p)) == 5


def test_a_part_missing_from_the_newest_version_stays_corrupt_on_every_path(tmp_path):
    from pyspark.sql.types import LongType, StructField, StructType

    from persistshard.datasource.reader import PersistShardReader

    location = tmp_path / "s"
    shard = ps.open_shard(str(location), maintenance=False, inline_bytes=0)
    for t in range(3):
        shard.append(table(t))
    schema = StructType([StructField("id", LongType())])
    reader = PersistShardReader({"path": str(location)}, schema)
    partitions = reader.partitions()
    scan = shard.scan()
    (location / shard.inspect.state().trace[0].parts[0].key).unlink()
    shard.append(table(3))  # a newer version, which still names the missing part
    for read in (
        shard.snapshot,
        lambda: shard.updates(0, 3),
        scan.to_arrow,
        lambda: [b for p in partitions for b in reader.read(p)],
    ):
        with pytest.raises(CorruptData) as info:
            read()
        assert not isinstance(info.value, StateConflict)


def test_a_missing_part_of_the_newest_version_is_corrupt_even_when_pinned_earlier(tmp_path, clock):
    """The pinned version was replaced, but not its part: the newest version names it too,
    so its absence is damage, not a race."""
    location = tmp_path / "s"
    shard = ps.open_shard(str(location), maintenance=False, inline_bytes=0, clock=clock.now)
    shard.append(table(0))
    scan = shard.scan()
    clock.advance(2000)
    shard.append(table(1))
    (location / shard.inspect.state().trace[0].parts[0].key).unlink()
    with pytest.raises(CorruptData):
        scan.to_arrow()


class GcAtFirstRollupRead(BlobWrapper):
    """A blob that runs ``before`` once, just before the first read of a state rollup."""

    def __init__(self, location: str, before: Callable[[], None]) -> None:
        super().__init__(open_blob(location))
        self.before: Callable[[], None] | None = before

    def get(self, key: str) -> bytes | None:
        if key.startswith("rollups/") and self.before is not None:
            before, self.before = self.before, None
            before()
        return super().get(key)


def test_a_state_read_whose_rollup_gc_removed_while_the_head_moved_reads_the_new_head(
    tmp_path, clock
):
    """One level down: the state read itself (a head whose entry names a rollup, which gc
    removes once writers moved past the next rollup) starts again from the new head rather
    than report `CorruptData` (`StateMachine._read_state`)."""
    from persistshard.core.statemachine.machine import SHARED_STATES
    from persistshard.core.storage.layout import ROLLUP_EVERY

    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
    for t in range(ROLLUP_EVERY + 1):  # the head names the rollup of version ROLLUP_EVERY
        writer.append(table(t))
    removed: list[str] = []

    def move_on_and_collect() -> None:
        other = ps.open_shard(location, maintenance=False, inline_bytes=0, clock=clock.now)
        for _ in range(ROLLUP_EVERY):
            other.append(table(other.upper))
        clock.advance(2000)
        other.append(table(other.upper))
        removed.extend(other.gc(dry_run=False, retention_seconds=0).rollups)
        SHARED_STATES.clear()

    SHARED_STATES.clear()  # as in a fresh process: the reader rebuilds the state from a rollup
    reader = ps.Shard(
        location,
        blob=GcAtFirstRollupRead(location, move_on_and_collect),
        maintenance=False,
        clock=clock.now,
    )
    state = reader.inspect.state()
    assert removed, "gc removed no rollup under the reader"
    assert (
        state.version
        == 2 * ROLLUP_EVERY + 2
        == ps.open_shard(location, clock=clock.now).inspect.state().version
    )
    assert reader.snapshot().num_rows == 2 * ROLLUP_EVERY + 2
