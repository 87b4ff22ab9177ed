"""Retention and after-commit maintenance from Spark: the write options ``retention`` and
``maintenance``, and SQL ``OPTIONS (retention ...)`` at CREATE TABLE (issue 26 item 3)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.statemachine.retention import Retention

pytestmark = pytest.mark.spark


def _trace_rows(loc: str) -> int:
    return sum(b.num_rows for b in ps.open_shard(loc).inspect.state().trace)


def test_sql_table_with_retention_overwritten_five_times_holds_distinct_rows(spark, tmp_path):
    """Without a retention since never moves, so even a compacted table keeps every update of
    every overwrite; with ``OPTIONS (retention '1 version')`` since follows the upper and the
    compacted table stores one update per distinct row."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    loc = str(tmp_path / name)
    spark.sql(
        f"CREATE TABLE {name} USING persistshard LOCATION '{loc}' "
        "OPTIONS (columns 'id BIGINT, item STRING', retention '1 version')"
    )
    try:
        assert ps.open_shard(loc).inspect.retention() == Retention(versions=1)
        for r in range(5):
            spark.sql(f"INSERT OVERWRITE {name} VALUES (1, 'a{r}'), (2, 'b{r}'), (3, 'c{r}')")
        shard = ps.open_shard(loc)
        assert shard.since == shard.upper - 1
        assert _trace_rows(loc) == 3 + 4 * 6  # 3 inserts, then 3 retractions + 3 inserts each
        ps.open_shard(loc).compact()  # (`ps.compact(spark, loc)` does the same in tasks)
        state = ps.open_shard(loc).inspect.state()
        assert _trace_rows(loc) == 3  # bounded by the distinct rows
        assert len(state.parts()) == 1
        assert sorted(r["item"] for r in spark.table(name).collect()) == ["a4", "b4", "c4"]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_write_options_retention_and_maintenance(spark, tmp_path):
    loc = str(tmp_path / "s")
    shard = ps.open_shard(loc, maintenance=False)
    for i in range(7):
        shard.append(pa.table({"id": pa.array([i], pa.int64())}))
    df = spark.createDataFrame([(100,)], "id BIGINT")
    (
        df.write.format("persistshard")
        .option("maintenance", "false")
        .option("retention", "2 versions")
        .mode("append")
        .save(loc)
    )
    state = ps.open_shard(loc).inspect.state()
    assert state.retention == Retention(versions=2)
    assert len(state.trace) == 8  # a due merge, but maintenance was off
    df.write.format("persistshard").mode("append").save(loc)
    state = ps.open_shard(loc).inspect.state()
    assert len(state.trace) <= 2  # the driver ran the due merge after its commit
    assert state.since == state.retention_marks[-2][1] - 1
    with pytest.raises(Exception, match="InvalidOption: option retention"):
        df.write.format("persistshard").option("retention", "7 days").mode("append").save(loc)


def test_upsert_writes_honour_the_maintenance_option(spark, tmp_path):
    """An upsert write (option ``key_columns``) with ``maintenance`` false leaves the due
    merge alone, as a plain write does; with the default the driver runs it after the
    commit."""
    loc = str(tmp_path / "u")
    shard = ps.open_shard(loc, maintenance=False)
    for i in range(7):
        shard.append(pa.table({"id": pa.array([i], pa.int64()), "v": pa.array([str(i)])}))
    df = spark.createDataFrame([(100, "x")], "id BIGINT, v STRING")
    upsert = df.write.format("persistshard").option("key_columns", "id").mode("append")
    upsert.option("maintenance", "false").save(loc)
    assert (
        len(ps.open_shard(loc).inspect.state().trace) == 8
    )  # a due merge, but maintenance was off
    upsert.option("maintenance", "true").save(loc)
    assert len(ps.open_shard(loc).inspect.state().trace) <= 2  # the driver ran the due merge
