"""Self-correcting overwrites in Spark: ``persistshard.overwrite`` (diff spread over tasks by
key range), ``mode("overwrite")`` with a small memory budget, and what a failure leaves."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

import persistshard as ps
from persistshard.core.storage.layout import PARTS_PREFIX
from persistshard.core.write.transaction import WriteTransaction


@pytest.fixture
def location(tmp_path) -> str:
    return str(tmp_path / f"shard-{uuid.uuid4().hex[:8]}")


def snapshot_counts(location: str) -> Counter:
    snap = ps.open_shard(location).snapshot()
    out: Counter = Counter()
    for r in snap.to_pylist():
        d = r.pop("_diff")
        out[tuple(r.values())] += d
    return out


def df_counts(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def stray_parts(location: str) -> set[str]:
    """Parts on storage that the newest state does not reference."""
    shard = ps.open_shard(location)
    referenced = shard.inspect.state().part_keys()
    return {m.key for m in shard._blob.list(PARTS_PREFIX)} - set(referenced)


def test_distributed_overwrite_is_exact_and_writes_only_the_difference(spark, location):
    """An overwrite creates a shard; then key-range tasks (several, budget far below the
    data) each diff their range: the snapshot is then the DataFrame, duplicates included,
    and only changed rows were written; an empty DataFrame then retracts everything."""
    n = 30_000
    first = spark.range(n).selectExpr("id", "concat('v', id) AS v")
    first_report = ps.overwrite(spark, first, location, compact=False)  # a new shard
    assert first_report.rows_written == n and snapshot_counts(location) == df_counts(first)
    changed = spark.range(n).selectExpr(
        "id", "CASE WHEN id % 100 = 0 THEN concat('w', id) ELSE concat('v', id) END AS v"
    )
    dupes = spark.createDataFrame([(7, "v7"), (n + 1, "new")], "id BIGINT, v STRING")
    desired = changed.unionByName(dupes).repartition(3)
    report = ps.overwrite(
        spark,
        desired,
        location,
        memory_budget=1 << 20,
        max_ranges=4,
        range_bytes=1 << 16,
        compact=False,
    )
    assert report.ranges > 1
    assert report.rows_written == 2 * 300 + 2  # 300 changed rows, (7, v7) twice, one new
    assert snapshot_counts(location) == df_counts(desired)
    shard = ps.open_shard(location)
    assert [h["kind"] for h in shard.history()][-1] in ("overwrite", "compact")
    assert not stray_parts(location)

    empty = spark.createDataFrame([], "id BIGINT, v STRING")
    ps.overwrite(spark, empty, location, memory_budget=1 << 20, compact=False)
    assert snapshot_counts(location) == Counter()
    assert ps.open_shard(location).snapshot(as_of=report.time).num_rows == n + 1


def test_overwrite_refused_by_a_racing_writer_leaves_the_shard_unchanged(
    spark, location, monkeypatch
):
    """A writer that moves the upper between the overwrite's mint and its commit wins; the
    overwrite fails with UpperMismatch, and none of its parts (staged or diff) remain."""
    spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, v STRING").write.format(
        "persistshard"
    ).mode("append").option("compact", "false").save(location)
    real = WriteTransaction.key_ranges  # planned between the staging and the diff jobs

    def racing(*args, **kwargs):
        import pyarrow as pa

        ps.open_shard(location).append(pa.table({"id": [3], "v": ["c"]}))
        return real(*args, **kwargs)

    monkeypatch.setattr(WriteTransaction, "key_ranges", racing)
    desired = spark.createDataFrame([(9, "z")], "id BIGINT, v STRING")
    with pytest.raises(ps.UpperMismatch, match=r"^UpperMismatch: expected upper 1, shard upper"):
        ps.overwrite(spark, desired, location)
    assert snapshot_counts(location) == Counter({(1, "a"): 1, (2, "b"): 1, (3, "c"): 1})
    assert not stray_parts(location)


def test_failed_tasks_leave_the_shard_unchanged_or_are_retried_cleanly(spark, location):
    """A staging task that fails for good (a zero diff is bad input) fails the overwrite
    before any commit and nothing of it stays; a task whose first attempt dies after writing
    its parts is retried, the overwrite is exact, and the dead attempt's parts are swept."""
    from persistshard.datasource.writer import FAULT_PROPERTY

    spark.createDataFrame([(1, "a")], "id BIGINT, v STRING").write.format("persistshard").mode(
        "append"
    ).option("compact", "false").save(location)
    before = ps.open_shard(location).inspect.state().version
    bad = spark.createDataFrame(
        [(1, "a", 1), (2, "b", 0)], "id BIGINT, v STRING, _diff BIGINT"
    ).repartition(2)
    with pytest.raises(Exception, match="InvalidUpdates"):
        ps.overwrite(spark, bad, location, compact=False)
    assert ps.open_shard(location).inspect.state().version == before
    assert not stray_parts(location)

    good = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id BIGINT, v STRING")
    sc = spark.sparkContext
    sc.setLocalProperty(FAULT_PROPERTY, "after_write")
    try:
        ps.overwrite(spark, good.repartition(2), location, compact=False)
    finally:
        sc.setLocalProperty(FAULT_PROPERTY, None)  # type: ignore[arg-type]
    assert snapshot_counts(location) == df_counts(good)
    assert not stray_parts(location)


def test_mode_overwrite_with_a_small_budget_and_schema_evolution(spark, location):
    """``mode("overwrite")`` goes through the same streaming diff (budget far below the
    data); with merge_schema a new column reads as null in the old rows, so every row whose
    new column is set is replaced, and rows whose new column is null stay."""
    n = 5_000
    spark.range(n).selectExpr("id", "concat('v', id) AS v").write.format("persistshard").mode(
        "append"
    ).save(location)
    wide = spark.range(n).selectExpr(
        "id", "concat('v', id) AS v", "CASE WHEN id < 10 THEN id END AS extra"
    )
    wide.write.format("persistshard").mode("overwrite").option("memory_budget", 1 << 20).option(
        "merge_schema", "true"
    ).save(location)
    assert snapshot_counts(location) == df_counts(wide)
    shard = ps.open_shard(location)
    last = [h for h in shard.history() if h["kind"] == "overwrite"][-1]
    assert "20 rows sealed" in last["summary"]
