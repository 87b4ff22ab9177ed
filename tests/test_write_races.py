"""A write whose tasks saw different uppers lost a race, and says so with `UpperMismatch`.

Spark runs a write's tasks one after another or in parallel, and each task of a streaming write
reads the output's upper when it starts. A writer that commits to the output between two tasks
makes them see different uppers; the driver's commit then finds the shard moved under the
write. That is the lost race of the error table (`UpperMismatch`: re-read, retry), not bad
input (`InvalidUpdates`: fix the data). Expected in each interleaving below: `UpperMismatch`
naming both uppers and the shard, the concurrent writer's commit kept, nothing of the losing
write applied and none of its part files left behind.
"""

from __future__ import annotations

import pathlib
from dataclasses import replace

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.datasource import reclock
from persistshard.datasource.options import WriteOptions
from persistshard.datasource.sinks import PersistShardStreamWriter, stream_task
from persistshard.datasource.writer import describe_write
from persistshard.errors import UpperMismatch

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
RECLOCKED = StructType(
    [
        StructField("partition", StringType()),
        StructField("offset", LongType()),
        StructField("v", StringType()),
    ]
)


def files_of(location: str, write_id: str) -> list[str]:
    """The files under ``location`` whose path names ``write_id`` (a write's parts)."""
    root = pathlib.Path(location)
    return [str(p) for p in root.rglob("*") if p.is_file() and write_id in str(p)]


def test_stream_tasks_at_different_uppers_are_an_upper_mismatch(tmp_path):
    location = str(tmp_path / "out")
    shard = ps.open_shard(location, inline_bytes=0)
    shard.append(pa.table({"id": [0], "v": ["seed"]}))
    options = {"path": location, "writer_id": "w", "compact": "false", "inline_bytes": "0"}
    opts = WriteOptions.parse(options, SCHEMA)
    batch = pa.record_batch({"id": [1, 2], "v": ["a", "b"]})
    first = stream_task(opts, SCHEMA, False, [batch], 0, "q")  # sees upper 1
    shard.append(pa.table({"id": [9], "v": ["racer"]}))  # another writer: upper 2
    second = stream_task(opts, SCHEMA, False, [batch], 0, "q")  # sees upper 2
    assert {first.lower, second.lower} == {1, 2}
    before = shard.inspect.state()
    with pytest.raises(UpperMismatch) as caught:
        PersistShardStreamWriter(options, SCHEMA, False).commit([first, second], 0)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert str(caught.value).startswith("UpperMismatch") and location in str(caught.value)
    after = shard.inspect.state()
    assert (after.version, after.upper) == (before.version, before.upper)
    assert sorted(r["id"] for r in shard.snapshot().to_pylist()) == [0, 9]
    assert files_of(location, first.write_id) == []  # the losing write's parts are swept


def test_reclocked_tasks_at_different_uppers_are_an_upper_mismatch(tmp_path):
    location = str(tmp_path / "out")
    remap = str(tmp_path / "remap")
    shard = ps.open_shard(location, inline_bytes=0)
    shard.append(pa.table({"partition": ["t:0"], "offset": [0], "v": ["seed"]}))
    options = {"path": location, "remap": remap, "compact": "false", "inline_bytes": "0"}
    opts = WriteOptions.parse(options, RECLOCKED)
    spec = reclock.spec_of(opts, RECLOCKED, location)
    bindings = ps.open_remap(remap).pinned()

    def task(offsets: list[int]) -> reclock.ReclockTaskWritten:
        d = describe_write(opts, RECLOCKED, False, ps.open_shard(location))
        batch = pa.record_batch(
            {
                "partition": pa.array(["t:1"] * len(offsets)),
                "offset": pa.array(offsets, pa.int64()),
                "v": pa.array([f"t:1/{o}" for o in offsets]),
            }
        )
        return reclock.reclock_task(d, spec, iter([batch]), bindings)

    first = task([0, 1])  # sees the output's upper 1
    shard.append(pa.table({"partition": ["x"], "offset": [0], "v": ["racer"]}))  # upper 2
    second = task([2, 3])  # sees upper 2
    assert {first.lower, second.lower} == {1, 2}
    before = shard.inspect.state()
    d = replace(describe_write(opts, RECLOCKED, False, shard), write_id="driver")
    with pytest.raises(UpperMismatch) as caught:
        reclock.commit_reclocked(d, spec, [first, second], compact=False, maintenance=False)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert str(caught.value).startswith("UpperMismatch") and location in str(caught.value)
    after = shard.inspect.state()
    assert (after.version, after.upper) == (before.version, before.upper)
    assert sorted(r["v"] for r in shard.snapshot().to_pylist()) == ["racer", "seed"]
    assert files_of(location, first.write_id) == files_of(location, second.write_id) == []
