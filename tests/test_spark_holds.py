"""Spark streaming reads hold the shard's since (one local session)."""

from __future__ import annotations

import time
import uuid

import pyarrow as pa
import pytest

import persistshard as ps

pytestmark = pytest.mark.spark


def _run_once(spark, location, checkpoint, seen, **options) -> None:
    reader = spark.readStream.format("persistshard").option("changes", True)
    for key, value in options.items():
        reader = reader.option(key, value)
    q = (
        reader.load(location)
        .writeStream.foreachBatch(lambda df, _: seen.extend(tuple(r) for r in df.collect()))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None


def test_a_stopped_stream_keeps_its_hold_and_resumes_exactly(spark, tmp_path):
    """A stream with a reader_id holds since at its committed position while it is stopped:
    advance_since stops there, compaction forwards nothing it still needs, and the restarted
    query reads every later update exactly (a retraction stays a retraction)."""
    location = str(tmp_path / f"shard-{uuid.uuid4().hex[:8]}")
    checkpoint = str(tmp_path / "ck")
    shard = ps.open_shard(location)
    shard.append(pa.table({"id": [1, 2], "_time": [0, 0], "_diff": [1, 1]}))
    seen: list[tuple] = []
    _run_once(spark, location, checkpoint, seen, reader_id="dash")
    assert sorted(seen) == [(1, 0, 1), (2, 0, 1)]
    held = shard.readers()["dash"][0]
    assert held <= 0  # everything up to time 0 was emitted; nothing later is needed yet

    for t in range(1, 6):  # id 1 toggles, id t arrives
        shard.append(pa.table({"id": [1, t + 10], "_time": [t, t], "_diff": [(-1) ** t, 1]}))
    assert shard.advance_since(5) == held  # the stopped stream holds since back
    shard.compact()

    seen.clear()
    _run_once(spark, location, checkpoint, seen, reader_id="dash")
    expected = [(1, t, (-1) ** t) for t in range(1, 6)] + [(t + 10, t, 1) for t in range(1, 6)]
    assert sorted(seen) == sorted(expected)
    assert shard.readers()["dash"][0] >= held


def test_a_stream_without_reader_id_holds_until_its_lease_runs_out(spark, tmp_path):
    """Without a reader_id the stream holds since under a fresh id; once the query is gone
    nobody renews it, and the lease (here 2 s) lets it go. (Spark 4.3 did not call the
    source's stop() in these runs, so the lease is what frees it.)"""
    location = str(tmp_path / f"shard-{uuid.uuid4().hex[:8]}")
    shard = ps.open_shard(location)
    shard.append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    shard.append(pa.table({"id": [2], "_time": [1], "_diff": [1]}))
    seen: list[tuple] = []
    _run_once(spark, location, str(tmp_path / "ck"), seen, reader_lease_seconds=2)
    assert sorted(seen) == [(1, 1, 1), (2, 1, 1)]
    ((reader, hold),) = shard.inspect.state().holds.items()  # live or run out, not yet dropped
    assert reader.startswith("stream-") and hold.lease_ms == 2000 and hold.since == 0
    time.sleep(max(0.0, hold.expires_ms / 1000 - time.time()) + 0.1)
    assert shard.readers() == {}
    assert shard.advance_since(1) == 1  # no longer held back, and the hold is dropped
    assert shard.inspect.state().holds == {}
