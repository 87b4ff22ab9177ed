"""The complete-mode streaming sink: a streaming aggregation kept as a self-correcting
materialized view (small data, availableNow, one query restarted on its checkpoint)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

import persistshard as ps
from persistshard.conformance.logsource import PartitionedLogSource, append_records

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def log_source(spark):
    spark.dataSource.register(PartitionedLogSource)
    return spark


def run_counts(spark, src, out, checkpoint) -> None:
    q = (
        spark.readStream.format("partitioned_log")
        .load(str(src))
        .selectExpr("CAST(value AS STRING) AS k")
        .groupBy("k")
        .count()
        .writeStream.format("persistshard")
        .outputMode("complete")
        .option("writer_id", "counts")
        .option("memory_budget", 1 << 20)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    q.awaitTermination(180)
    if q.exception() is not None:
        raise q.exception()


def view(shard: ps.Shard, as_of: int | None = None) -> dict[str, int]:
    rows = shard.snapshot(as_of).to_pylist()
    assert all(r["_diff"] == 1 for r in rows)
    return {r["k"]: r["count"] for r in rows}


def test_complete_mode_keeps_the_aggregation_and_writes_only_changed_groups(log_source, tmp_path):
    """After each micro-batch the snapshot is the query's result; the updates between two
    micro-batch times are only the changed groups (retraction + insertion); a replayed
    micro-batch (its commit lost from the checkpoint) writes nothing twice."""
    spark = log_source
    src, out, chk = tmp_path / "src", str(tmp_path / "out"), tmp_path / "chk"
    append_records(str(src), "t", 0, ["a", "b", "a", "c"])
    run_counts(spark, src, out, chk)
    shard = ps.open_shard(out)
    first = shard.upper
    assert view(shard) == {"a": 2, "b": 1, "c": 1}

    append_records(str(src), "t", 0, ["b", "d"])
    run_counts(spark, src, out, chk)
    assert view(shard) == {"a": 2, "b": 2, "c": 1, "d": 1}
    assert view(shard, first - 1) == {"a": 2, "b": 1, "c": 1}  # time travel to batch 0
    changes = Counter(
        (r["k"], r["count"], r["_diff"]) for r in shard.updates(first, shard.upper).to_pylist()
    )
    assert changes == Counter({("b", 1, -1): 1, ("b", 2, 1): 1, ("d", 1, 1): 1})

    # Crash point: the shard committed the last micro-batch but Spark did not record it.
    commits = chk / "commits"
    last = max(int(n) for n in os.listdir(commits) if n.isdigit())
    os.remove(commits / str(last))
    if (commits / f".{last}.crc").exists():
        os.remove(commits / f".{last}.crc")
    version, upper = shard.inspect.state().version, shard.upper
    run_counts(spark, src, out, chk)  # Spark replays batch `last` with the same id
    assert shard.upper == upper and view(shard) == {"a": 2, "b": 2, "c": 1, "d": 1}
    assert [h for h in shard.history() if h["version"] > version and h["kind"] == "overwrite"] == []
    assert shard.inspect.state().writers["counts"] == last
    kinds = [h["kind"] for h in shard.history()]
    assert "overwrite" in kinds


def test_complete_mode_refuses_remap(log_source, tmp_path):
    spark = log_source
    append_records(str(tmp_path / "src"), "t", 0, ["a"])
    with pytest.raises(Exception, match=r"InvalidOption: outputMode\('complete'\)"):
        q = (
            spark.readStream.format("partitioned_log")
            .load(str(tmp_path / "src"))
            .groupBy("partition")
            .count()
            .writeStream.format("persistshard")
            .outputMode("complete")
            .option("writer_id", "x")
            .option("remap", str(tmp_path / "remap"))
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start(str(tmp_path / "out"))
        )
        q.awaitTermination(120)
        if q.exception() is not None:
            raise q.exception()
