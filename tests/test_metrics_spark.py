"""A Spark write's driver commit records its operation metrics (rows from the tasks' reports,
bytes and parts of their parts, the tasks' store requests), and ``persistshard_history`` shows
them as a map. One small write on the session SparkSession."""

from __future__ import annotations

import pytest

import persistshard as ps

pytestmark = pytest.mark.spark


def test_spark_write_commit_records_metrics_and_sql_shows_them(spark, tmp_path):
    location = str(tmp_path / "s")
    df = spark.range(0, 50, numPartitions=2).selectExpr("id", "id * 2 AS v")
    # every part a file (option inline_bytes 0): the tasks' puts are what is counted below
    df.write.format("persistshard").mode("append").option("inline_bytes", 0).save(location)
    shard = ps.open_shard(location)
    [entry] = [h for h in shard.history() if h["commit"] == "append"]
    m = entry["metrics"]
    parts = [p for b in shard.inspect.state().trace for p in b.parts]
    assert m["operation"] == "spark write"
    assert m["rows_in"] == 50 and m["rows_added"] == 50 and m["rows_removed"] == 0
    assert m["parts_added"] == len(parts) >= 2  # one per task at least
    assert m["bytes_added"] == sum(p.size for p in parts)
    # every task wrote at least its part (a put) and the driver's commit made requests too
    assert m["task_store_requests"] >= m["parts_added"]
    assert m["store_requests"] > m["task_store_requests"]

    ps.register(spark)
    rows = spark.sql(
        f"SELECT version, metrics FROM persistshard_history('{location}') ORDER BY version"
    ).collect()
    by_version = {r["version"]: r["metrics"] for r in rows}
    shown = by_version[entry["version"]]
    assert shown == {k: v for k, v in m.items() if k != "operation"}
    total = spark.sql(
        f"SELECT sum(metrics['rows_added']) AS n FROM persistshard_history('{location}')"
    ).collect()[0]["n"]
    assert total == 50


def test_a_spark_write_reports_the_duration_of_the_whole_write(spark, tmp_path):
    """``duration_ms`` of a Spark write's entry counts from the write's mint on the driver,
    through its tasks, to its commit: not the driver's commit alone."""
    import time

    def slow(batches):  # each task takes at least a second
        time.sleep(1.0)
        yield from batches

    location = str(tmp_path / "s")
    df = spark.range(0, 10, numPartitions=2).selectExpr("id")
    df.mapInArrow(slow, "id BIGINT").write.format("persistshard").mode("append").save(location)
    [entry] = [h for h in ps.open_shard(location).history() if h["commit"] == "append"]
    assert entry["metrics"]["operation"] == "spark write"
    assert entry["metrics"]["duration_ms"] >= 1000
