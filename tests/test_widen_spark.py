"""Spark writes into a shard made with the Python API from pandas-like data: timestamp[ns]
columns (Spark hands writers microseconds) and int64 columns written as INT are cast to the
stored types (`persistshard.core.write.validate.widens`) by every Spark write path: append,
overwrite, upsert, streaming; narrowing and an out-of-range timestamp are refused with nothing
written."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps

pytestmark = pytest.mark.spark

UTC = dt.UTC
T0 = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def _ns(d: dt.datetime) -> int:
    """``d`` (whole microseconds) in nanoseconds since the epoch."""
    delta = d - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (delta // dt.timedelta(microseconds=1)) * 1000


@pytest.fixture
def location(tmp_path: Any) -> str:
    """A shard written with the Python API: ``id int64, ts timestamp[ns, UTC], v string``."""
    loc = str(tmp_path / "ns")
    ps.open_shard(loc, inline_bytes=0).append(
        pa.table(
            {
                "id": pa.array([1, 2], pa.int64()),
                "ts": pa.array([_ns(T0), _ns(T0) + 1000], pa.timestamp("ns", tz="UTC")),
                "v": pa.array(["a", "b"], pa.string()),
            }
        )
    )
    return loc


STORED = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("ts", pa.timestamp("ns", tz="UTC")),
        pa.field("v", pa.string()),
    ]
)


def _contents(loc: str) -> list[tuple[int, int, str, int]]:
    """The shard's rows as (id, ts in ns, v, diff), after checking the snapshot and every part
    carry the stored types."""
    shard = ps.open_shard(loc)
    assert shard.schema == STORED
    from persistshard.core.storage.parts import read_part

    for p in shard.inspect.state().parts():
        schema = read_part(shard._blob, p).schema
        assert pa.schema([f for f in schema if not f.name.startswith("_")]) == STORED
    snap = shard.snapshot()
    ts = snap.column("ts").cast(pa.int64()).to_pylist()
    return sorted(
        (r["id"], t, r["v"], r["_diff"]) for r, t in zip(snap.to_pylist(), ts, strict=True)
    )


def _frame(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, "id INT, ts TIMESTAMP, v STRING")


def test_append_microseconds_and_int_into_a_nanosecond_shard(spark, location):
    later = T0 + dt.timedelta(days=1)
    _frame(spark, [(3, later, "c"), (4, None, "d")]).write.format("persistshard").mode(
        "append"
    ).save(location)
    assert _contents(location) == [
        (1, _ns(T0), "a", 1),
        (2, _ns(T0) + 1000, "b", 1),
        (3, _ns(later), "c", 1),
        (4, None, "d", 1),
    ]
    # Spark reads it back as microseconds, exactly (whole microseconds stored).
    got = (
        spark.read.format("persistshard")
        .load(location)
        .selectExpr("id", "unix_micros(ts) AS us", "v")
        .orderBy("id")
        .collect()
    )
    assert [tuple(r) for r in got] == [
        (1, _ns(T0) // 1000, "a"),
        (2, _ns(T0) // 1000 + 1, "b"),
        (3, _ns(later) // 1000, "c"),
        (4, None, "d"),
    ]


def test_overwrite_into_a_nanosecond_shard(spark, location):
    _frame(spark, [(9, T0, "z")]).write.format("persistshard").mode("overwrite").save(location)
    assert _contents(location) == [(9, _ns(T0), "z", 1)]


def test_upsert_by_a_nanosecond_key_written_in_microseconds(spark, location):
    changes = _frame(
        spark, [(20, T0 + dt.timedelta(microseconds=1), "B"), (30, T0 + dt.timedelta(hours=1), "C")]
    )
    changes.write.format("persistshard").mode("append").option("key_columns", "ts").save(location)
    assert _contents(location) == [
        (1, _ns(T0), "a", 1),
        (20, _ns(T0) + 1000, "B", 1),
        (30, _ns(T0 + dt.timedelta(hours=1)), "C", 1),
    ]


def test_upsert_by_an_int64_key_written_as_int(spark, tmp_path):
    loc = str(tmp_path / "keyed")
    ps.open_shard(loc).upsert(
        pa.table(
            {
                "id": pa.array([1, 2**40], pa.int64()),
                "ts": pa.array([_ns(T0), 7], pa.timestamp("ns", tz="UTC")),
                "v": pa.array(["a", "big"], pa.string()),
            }
        ),
        "id",
    )
    _frame(spark, [(1, T0, "A"), (3, None, "c")]).write.format("persistshard").mode(
        "append"
    ).option("key_columns", "id").save(loc)
    assert _contents(loc) == [(1, _ns(T0), "A", 1), (3, None, "c", 1), (2**40, 7, "big", 1)]


def test_streaming_append_into_a_nanosecond_shard(spark, location, tmp_path):
    source = tmp_path / "in"
    _frame(spark, [(5, T0 + dt.timedelta(seconds=5), "e")]).write.parquet(str(source))
    stream = spark.readStream.schema("id INT, ts TIMESTAMP, v STRING").parquet(str(source))
    q = (
        stream.writeStream.format("persistshard")
        .option("writer_id", "widen")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(location)
    )
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    assert (5, _ns(T0 + dt.timedelta(seconds=5)), "e", 1) in _contents(location)
    assert len(_contents(location)) == 3


def test_sql_insert_into_a_table_over_a_nanosecond_shard(spark, location):
    name = "widen_ns_insert"
    spark.sql(f"CREATE TABLE {name} USING persistshard LOCATION '{location}'")
    try:
        _frame(spark, [(6, T0, "f")]).createOrReplaceTempView("widen_src")
        spark.sql(f"INSERT INTO {name} SELECT id, ts, v FROM widen_src")
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.catalog.dropTempView("widen_src")
    assert (6, _ns(T0), "f", 1) in _contents(location)


def _state(loc: str) -> tuple[Any, ...]:
    shard = ps.open_shard(loc)
    return shard.upper, shard.history(), sorted(p.key for p in shard.inspect.state().parts())


def test_a_timestamp_beyond_nanoseconds_is_refused_with_nothing_written(spark, location):
    before = _state(location)
    late = dt.datetime(2300, 6, 7, 8, 9, 10, tzinfo=UTC)
    frame = _frame(spark, [(7, T0, "g"), (8, late, "h")])
    for mode, options in (("append", {}), ("overwrite", {}), ("append", {"key_columns": "id"})):
        with pytest.raises(Exception) as e:
            frame.write.format("persistshard").mode(mode).options(**options).save(location)
        text = str(e.value)
        assert "InvalidUpdates: " in text, text
        assert "column ts" in text and "2300-06-07 08:09:10" in text, text
        assert location in text, text
        assert _state(location) == before, (mode, options)
    report = ps.open_shard(location).gc(dry_run=True, retention_seconds=0)
    assert report.orphaned_parts == [] and report.leased_parts == 0


def test_narrowing_is_still_refused_naming_every_column(spark, tmp_path):
    loc = str(tmp_path / "narrow")
    ps.open_shard(loc).append(
        pa.table(
            {
                "n": pa.array([1], pa.int32()),
                "f": pa.array([1.0], pa.float32()),
                "ts": pa.array([1], pa.timestamp("us")),
            }
        )
    )
    before = _state(loc)
    frame = spark.createDataFrame(
        [(1, 1.0, T0)], "n BIGINT, f DOUBLE, ts TIMESTAMP"
    )  # ts: zoned, the shard's is naive
    with pytest.raises(Exception) as e:
        frame.write.format("persistshard").mode("append").save(loc)
    text = str(e.value)
    assert "InvalidUpdates: " in text, text
    assert (
        "retyped: n is int64, the shard has int32; f is double, the shard has float; "
        "ts is timestamp[us, tz=UTC], the shard has timestamp[us]"
    ) in text, text
    assert _state(loc) == before


def test_merge_schema_adds_a_column_with_its_written_type(spark, location):
    frame = spark.createDataFrame([(3, T0, "c", 5)], "id INT, ts TIMESTAMP, v STRING, n INT")
    frame.write.format("persistshard").mode("append").option("merge_schema", "true").save(location)
    shard = ps.open_shard(location)
    assert shard.schema == pa.schema([*STORED, pa.field("n", pa.int32())])
    got = shard.snapshot().sort_by("id")
    assert got.column("n").to_pylist() == [None, None, 5]
    assert got.column("ts").cast(pa.int64()).to_pylist() == [_ns(T0), _ns(T0) + 1000, _ns(T0)]
