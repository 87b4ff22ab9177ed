"""Reclocking through Spark: the partitioned log source, the reclocking streaming sink, restarts
without the checkpoint, and two outputs sharing into-times (small data, availableNow)."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

import persistshard as ps
from persistshard.conformance.logsource import PartitionedLogSource, append_records

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def log_source(spark):
    spark.dataSource.register(PartitionedLogSource)
    return spark


def fill(root, topic, counts: dict[int, int], start: dict[int, int] | None = None) -> None:
    """Append ``counts[p]`` records to each partition, values ``"<p>-<offset>"``."""
    for p, n in counts.items():
        first = (start or {}).get(p, 0)
        append_records(str(root), topic, p, [f"{p}-{first + i}" for i in range(n)])


def values_of(shard: ps.Shard, as_of: int | None = None) -> Counter:
    snap = shard.snapshot(as_of).to_pylist()
    return Counter({r["v"]: r["_diff"] for r in snap})


def run_ingest(spark, src, out, remap, checkpoint, starting="earliest", cap=None) -> None:
    reader = spark.readStream.format("partitioned_log").option("startingOffsets", starting)
    if cap is not None:
        reader = reader.option("maxRecordsPerPartition", cap)
    q = (
        reader.load(str(src))
        .selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS v")
        .writeStream.format("persistshard")
        .option("writer_id", "ingest")
        .option("remap", str(remap))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    q.awaitTermination(180)
    if q.exception() is not None:
        raise q.exception()


def test_log_source_has_kafka_columns(log_source, tmp_path):
    spark = log_source
    fill(tmp_path / "src", "t", {0: 3, 1: 2})
    got = []
    q = (
        spark.readStream.format("partitioned_log")
        .option("startingOffsets", json.dumps({"t": {"0": 1}}))
        .load(str(tmp_path / "src"))
        .writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted((r.topic, r.partition, r.offset, r.value.decode()) for r in got) == [
        ("t", 0, 1, "0-1"),
        ("t", 0, 2, "0-2"),
        ("t", 1, 0, "1-0"),
        ("t", 1, 1, "1-1"),
    ]
    assert {type(r.timestamp).__name__ for r in got} == {"datetime"}
    assert all(r.key is None for r in got)


def test_sink_reclocks_and_restart_without_checkpoint_writes_nothing_twice(log_source, tmp_path):
    """Several micro-batches each mint one binding; then the checkpoint is deleted and the
    query restarts from the very beginning of the source: the replayed records reclock below
    the output's upper and are dropped; new records land exactly once."""
    spark = log_source
    src, out, remap, chk = (tmp_path / n for n in ("src", "out", "remap", "chk"))
    fill(src, "t", {0: 6, 1: 4, 2: 5})
    run_ingest(spark, src, out, remap, chk, cap=2)
    rmp = ps.open_remap(str(remap))
    shard = ps.open_shard(str(out))
    expected = Counter(f"{p}-{i}" for p, n in {0: 6, 1: 4, 2: 5}.items() for i in range(n))
    assert values_of(shard) == expected
    bindings = rmp.bindings()
    assert len(bindings) >= 3, bindings  # one per micro-batch, capped at 2 records/partition
    assert bindings[-1][1] == {"t:0": 6, "t:1": 4, "t:2": 5}
    assert shard.upper == bindings[-1][0] + 1
    # Every row sits at the into-time of the first binding that covers its record.
    for t, frontier in bindings:
        prefix = Counter(f"{k[2:]}-{i}" for k, n in frontier.items() for i in range(n))
        assert values_of(shard, t) == prefix
    assert json.loads(ps.resume_offsets(str(out), remap=str(remap))) == {
        "t": {"0": 6, "1": 4, "2": 5}
    }

    shutil.rmtree(chk)
    fill(src, "t", {0: 2, 3: 1}, start={0: 6})
    run_ingest(spark, src, out, remap, chk, starting="earliest")
    expected.update(["0-6", "0-7", "3-0"])
    assert values_of(shard) == expected  # nothing twice
    assert shard.verify().ok

    shutil.rmtree(chk)
    fill(src, "t", {1: 1}, start={1: 4})
    run_ingest(spark, src, out, remap, chk, starting=ps.resume_offsets(str(out), remap=str(remap)))
    expected.update(["1-4"])
    assert values_of(shard) == expected


def test_two_outputs_from_foreach_batch_share_into_times(log_source, tmp_path):
    """foreachBatch splits each micro-batch into two outputs (even and odd offsets) with the
    micro-batch's frontier: as of every into-time, both outputs reflect the same source
    prefix, the one bound at that time."""
    from persistshard.datasource.reclock import frontier_of

    spark = log_source
    src, remap = tmp_path / "src", str(tmp_path / "remap")
    outs = {"even": str(tmp_path / "even"), "odd": str(tmp_path / "odd")}
    fill(src, "t", {0: 5, 1: 3})

    def each(df, batch_id):
        df = df.selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS v")
        whole = frontier_of(df)
        for name, parity in (("even", 0), ("odd", 1)):
            (
                df.where(f"offset % 2 = {parity}")
                .write.format("persistshard")
                .mode("append")
                .option("remap", remap)
                .option("source_frontier", whole)
                .save(outs[name])
            )

    def run(starting="earliest"):
        q = (
            spark.readStream.format("partitioned_log")
            .option("startingOffsets", starting)
            .option("maxRecordsPerPartition", 2)
            .load(str(src))
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None

    run()
    fill(src, "t", {1: 2}, start={1: 3})
    run()
    bindings = ps.open_remap(remap).bindings()
    assert len(bindings) >= 3
    shards = {name: ps.open_shard(loc) for name, loc in outs.items()}
    assert {s.upper for s in shards.values()} == {bindings[-1][0] + 1}
    for t, frontier in bindings:
        prefix = [(k[2:], i) for k, n in frontier.items() for i in range(n)]
        for name, parity in (("even", 0), ("odd", 1)):
            want = Counter(f"{p}-{i}" for p, i in prefix if i % 2 == parity)
            assert values_of(shards[name], t) == want, (name, t)
    # A restart without the checkpoint from the resumption frontier changes nothing.
    before = {name: s.inspect.state().version for name, s in shards.items()}
    shutil.rmtree(tmp_path / "chk")
    run(ps.resume_offsets(outs["odd"], remap=remap))
    assert {name: s.upper for name, s in shards.items()} == {
        name: bindings[-1][0] + 1 for name in shards
    }
    assert before == {name: s.inspect.state().version for name, s in shards.items()}


def test_reclocking_options_are_checked(log_source, tmp_path):
    spark = log_source
    df = spark.createDataFrame([("a", 1, "x")], "part STRING, offset BIGINT, v STRING")
    remap = str(tmp_path / "remap")
    with pytest.raises(Exception, match="InvalidOption: option source_partition_column names"):
        df.write.format("persistshard").mode("append").option("remap", remap).save(
            str(tmp_path / "o")
        )
    with pytest.raises(Exception, match="InvalidOption: option source_offset_column needs"):
        df.write.format("persistshard").mode("append").option("source_offset_column", "o").save(
            str(tmp_path / "o")
        )
    bad = spark.createDataFrame([(None, 1, "x")], "partition STRING, offset BIGINT, v STRING")
    with pytest.raises(Exception, match="InvalidUpdates: 1 records have a null partition"):
        bad.write.format("persistshard").mode("append").option("remap", remap).save(
            str(tmp_path / "o")
        )
    neg = spark.createDataFrame([("a", -3, "x")], "partition STRING, offset BIGINT, v STRING")
    with pytest.raises(Exception, match="InvalidUpdates: partition 'a' has negative offset -3"):
        neg.write.format("persistshard").mode("append").option("remap", remap).save(
            str(tmp_path / "o")
        )
    assert ps.open_remap(remap).upper == 0 and ps.open_shard(str(tmp_path / "o")).upper == 0
    good = spark.createDataFrame(
        [("a", 0, "x"), ("a", 1, "y")], "partition STRING, offset INT, v STRING"
    )
    good.write.format("persistshard").mode("append").option("remap", remap).save(
        str(tmp_path / "o")
    )
    assert ps.open_remap(remap).bindings() == [(0, {"a": 2})]
    assert ps.open_shard(str(tmp_path / "o")).upper == 1
