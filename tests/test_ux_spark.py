"""What a Spark user sees, tried as a new user would: the history as SQL, streams restarted
without their checkpoint, streams over a read-only location, and what the catalog shows
(or, on Spark 4.3, cannot show) about a table. Canaries pin the Spark behaviour the docs
describe, so a Spark upgrade that changes it fails here."""

from __future__ import annotations

import shutil
from collections import Counter

import pyarrow as pa
import pytest
from ux_helpers import probe_read_only, read_only

import persistshard as ps

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def registered(spark):
    ps.register(spark)
    return spark


def two_commits(location: str) -> ps.Shard:
    shard = ps.open_shard(location)
    shard.append(pa.table({"id": [1, 2], "_time": [0, 0], "_diff": [1, 1]}))
    shard.append(pa.table({"id": [1], "_time": [1], "_diff": [-1]}))
    return shard


# --- history as SQL --------------------------------------------------------------------------


def test_history_as_a_table_function(registered, tmp_path):
    spark = registered
    location = str(tmp_path / "h")
    shard = two_commits(location)
    shard.advance_since(1)
    rows = spark.sql(f"SELECT * FROM persistshard_history('{location}') ORDER BY version").collect()
    expected = shard.history()
    assert [r["version"] for r in rows] == [h["version"] for h in expected] == [1, 2, 3]
    assert [r["kind"] for r in rows] == [h["kind"] for h in expected]
    assert [r["summary"] for r in rows] == [h["summary"] for h in expected]
    assert [r["commit_id"] for r in rows] == [h["id"] for h in expected]
    assert all(r["committed_at"] is not None for r in rows)
    # it is a relation like any other: filter, aggregate, join
    appends = spark.sql(
        f"SELECT count(*) AS n FROM persistshard_history('{location}') WHERE kind = 'append'"
    ).collect()
    assert appends[0]["n"] == 2


def test_history_of_a_location_without_a_shard(registered, tmp_path):
    with pytest.raises(Exception, match=r"NoShard: no shard at .*takes a location, not a table"):
        registered.sql(f"SELECT * FROM persistshard_history('{tmp_path / 'nothing'}')").collect()
    with pytest.raises(Exception, match=r"InvalidOption: persistshard_history takes the shard"):
        registered.sql("SELECT * FROM persistshard_history('')").collect()


# --- streams restarted without their checkpoint ------------------------------------------------


def _copy_stream(spark, source: str, target: str, checkpoint: str) -> None:
    q = (
        spark.readStream.format("persistshard")
        .option("changes", True)
        .load(source)
        .writeStream.format("persistshard")
        .option("writer_id", "copy")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    try:
        q.awaitTermination(180)
    finally:
        q.stop()


def test_a_stream_restarted_without_its_checkpoint_says_what_happened(spark, tmp_path):
    source, target, ck = (str(tmp_path / n) for n in ("src", "dst", "ck"))
    two_commits(source)
    _copy_stream(spark, source, target, ck)
    out = ps.open_shard(target)
    before = out.inspect.state()
    assert before.upper == 2 and before.writers == {"copy": 0}
    shutil.rmtree(ck)  # the checkpoint is lost: Spark starts from batch 0 and the snapshot
    with pytest.raises(Exception) as e:
        _copy_stream(spark, source, target, ck)
    text = str(e.value)
    assert "InvalidUpdates: _time 1 is below the write's lower 2" in text
    assert "restarted without its checkpoint" in text
    assert "writer 'copy' already committed micro-batches up to 0" in text
    assert ".option('updates_from', 2)" in text and "Nothing was written" in text
    assert ps.open_shard(target).inspect.state() == before


# --- streams over a read-only location -------------------------------------------------------


def _stream_rows(spark, location: str, checkpoint: str, **options: str) -> Counter:
    seen: list = []
    reader = spark.readStream.format("persistshard").option("changes", True)
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load(location)
        .writeStream.foreachBatch(lambda df, _: seen.extend(tuple(r) for r in df.collect()))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(180)
        if q.exception() is not None:
            raise q.exception()
    finally:
        q.stop()
    return Counter(seen)


def test_a_streaming_read_of_a_read_only_location(spark, tmp_path):
    """A hold is a commit: on a location this process may only read, the stream says so and
    names the way out (read without a hold), which then works."""
    location = str(tmp_path / "ro")
    two_commits(location)
    probe_read_only(location)
    before = ps.open_shard(location).inspect.state()
    with read_only(location):
        with pytest.raises(Exception) as e:
            _stream_rows(spark, location, str(tmp_path / "ck1"))
        text = str(e.value)
        assert "StorageError: a streaming read holds the shard's since" in text
        assert "PermissionError" in text and ".option('hold', 'false')" in text
        assert "Indeterminate" not in text and "HoldExpired" not in text
        rows = _stream_rows(spark, location, str(tmp_path / "ck2"), hold="false")
    assert rows == Counter({(2, 1, 1): 1})  # the snapshot at upper - 1 = 1
    assert ps.open_shard(location).inspect.state() == before


def test_hold_false_with_a_reader_id_is_refused(spark, tmp_path):
    location = str(tmp_path / "s")
    two_commits(location)
    with pytest.raises(Exception, match=r"InvalidOption: option hold is false, but .*reader_id"):
        _stream_rows(spark, location, str(tmp_path / "ck"), hold="false", reader_id="r")


# --- what Spark 4.3 shows, and cannot show, of a table (canaries) -------------------------------


def test_partition_by_is_refused_by_spark_before_the_source_is_asked(spark, tmp_path):
    """Canary: Spark 4.3 checks partitionBy against the table's partitioning in the JVM,
    before any Python call (a Python table has none), so the message is Spark's own; nothing
    is written. the README says so. If this fails, Spark now asks the source: refuse
    partitionBy there with our own message."""
    df = spark.createDataFrame([(1, "a")], "id BIGINT, v STRING")
    for name in ("new", "old"):
        location = str(tmp_path / name)
        if name == "old":
            df.write.format("persistshard").mode("append").save(location)
        before = ps.open_shard(location).inspect.state()
        with pytest.raises(Exception, match="partitioning or clustering columns do not match"):
            df.write.format("persistshard").mode("append").partitionBy("v").save(location)
        assert ps.open_shard(location).inspect.state() == before


def test_what_the_catalog_shows_of_a_table(spark, tmp_path, has_companion_catalog):
    """Canary for the README (What the catalog shows): DESCRIBE TABLE EXTENDED and SHOW
    CREATE TABLE of a Python source's table show neither USING persistshard nor the LOCATION
    (Spark 4.3 builds them from the Python table's properties, which
    PythonDataSourceV2.getTable leaves empty), but SHOW TABLE EXTENDED reads the catalog entry
    and shows both; DROP TABLE keeps the shard. The companion's session catalog hands Spark
    the catalog's properties, so there DESCRIBE and SHOW CREATE TABLE show both too."""
    location = str(tmp_path / "t")
    spark.sql(
        f"CREATE TABLE ux_t USING persistshard LOCATION '{location}' "
        "OPTIONS (columns 'id BIGINT, v STRING')"
    )
    try:
        spark.sql("INSERT INTO ux_t VALUES (1, 'a')")
        described = {r[0]: r[1] for r in spark.sql("DESCRIBE TABLE EXTENDED ux_t").collect()}
        ddl = spark.sql("SHOW CREATE TABLE ux_t").collect()[0][0]
        if has_companion_catalog:
            assert described["Provider"] == "persistshard", described
            assert location in described["Location"], described
            assert "USING persistshard" in ddl and "LOCATION" in ddl and location in ddl, ddl
        else:
            assert "Location" not in described and "Provider" not in described
            assert "USING" not in ddl and "LOCATION" not in ddl
        info = spark.sql("SHOW TABLE EXTENDED LIKE 'ux_t'").collect()[0]["information"]
        assert "Provider: persistshard" in info and "Type: EXTERNAL" in info
        assert f"Location: file:{location}" in info
    finally:
        spark.sql("DROP TABLE IF EXISTS ux_t")
    assert ps.open_shard(location).upper == 1  # DROP TABLE of an EXTERNAL table keeps it


@pytest.mark.parametrize("inline_bytes", [0, 4096])
def test_a_batch_write_to_a_read_only_location(spark, tmp_path, inline_bytes):
    """A write to a location it may not write: StorageError, nothing applied. With part
    files (inline_bytes 0) the tasks cannot create parts: the message names the cause and
    the fix; at the inline default the tasks write nothing and the commit is refused."""
    location = str(tmp_path / "ro")
    two_commits(location)
    probe_read_only(location)
    before = ps.open_shard(location).inspect.state()
    df = spark.createDataFrame([(7,)], "id BIGINT")
    with read_only(location), pytest.raises(Exception) as e:
        df.write.format("persistshard").mode("append").option("inline_bytes", inline_bytes).save(
            location
        )
    text = str(e.value)
    if inline_bytes == 0:
        assert "StorageError: cannot write the shard at" in text, text[-2000:]
        assert "grant write access" in text
    else:
        assert "StorageError: " in text, text[-2000:]
    assert "Indeterminate" not in text
    assert ps.open_shard(location).inspect.state() == before
