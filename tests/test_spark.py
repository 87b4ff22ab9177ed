"""The Spark format end to end, on one local session (pytest-spark)."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
import subprocess
import sys
import threading
import uuid
from collections import Counter

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

import persistshard as ps
from persistshard.datasource.writer import FAULT_PROPERTY

pytestmark = pytest.mark.spark


@pytest.fixture
def location(tmp_path) -> str:
    return str(tmp_path / f"shard-{uuid.uuid4().hex[:8]}")


def read(spark, location, **options):
    reader = spark.read.format("persistshard")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(location)


def counts(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def part_keys(location) -> set[str]:
    return {m.key for m in ps.open_shard(location)._blob.list("parts/")}


def test_registered_without_register_call(spark, location):
    spark.createDataFrame([(1, "a")], "id BIGINT, item STRING").write.format("persistshard").mode(
        "append"
    ).save(location)
    assert read(spark, location).collect() == [Row(id=1, item="a")]


ALL_TYPES = StructType(
    [
        StructField("b", ByteType()),
        StructField("s", ShortType()),
        StructField("i", IntegerType()),
        StructField("l", LongType()),
        StructField("f", FloatType()),
        StructField("d", DoubleType()),
        StructField("dec", DecimalType(10, 2)),
        StructField("big", DecimalType(38, 10)),
        StructField("str", StringType()),
        StructField("bin", BinaryType()),
        StructField("flag", BooleanType()),
        StructField("day", DateType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("arr", ArrayType(IntegerType())),
        StructField("m", MapType(StringType(), LongType())),
        StructField(
            "st",
            StructType(
                [StructField("x", IntegerType()), StructField("ys", ArrayType(StringType()))]
            ),
        ),
    ]
)


def test_round_trip_of_every_type(spark, location):
    ts = dt.datetime(2024, 2, 29, 12, 30, 15, 123456, tzinfo=dt.UTC)
    rows = [
        (
            1,
            2,
            3,
            4,
            1.5,
            -0.0,
            decimal.Decimal("12.34"),
            decimal.Decimal("1234567890.0123456789"),
            "héllo",
            b"\x00\xff",
            True,
            dt.date(2024, 2, 29),
            ts,
            dt.datetime(2024, 1, 1, 0, 0, 1),
            [1, None, 3],
            {"a": 1, "b": None},
            (7, ["p", None]),
        ),
        (
            -1,
            -2,
            -3,
            -(2**62),
            float("nan"),
            float("inf"),
            decimal.Decimal("-0.01"),
            None,
            "",
            b"",
            False,
            dt.date(1970, 1, 1),
            None,
            None,
            [],
            {},
            (None, []),
        ),
        tuple([None] * 17),
    ]
    df = spark.createDataFrame(rows, ALL_TYPES)
    df.write.format("persistshard").mode("append").save(location)
    back = read(spark, location)
    assert back.schema.simpleString() == df.schema.simpleString()

    def key(r: Row) -> str:
        return repr([("nan" if isinstance(v, float) and math.isnan(v) else v) for v in r])

    want = sorted(key(r) for r in df.collect())
    got = sorted(key(r) for r in back.collect())
    assert got == want
    neg_zero = [r.d for r in back.collect() if r.d == 0.0]
    assert neg_zero and math.copysign(1, neg_zero[0]) == -1.0


def test_time_travel_across_appends(spark, location):
    for t, rows in enumerate([[(1, "a")], [(2, "b")], [(3, "c")]]):
        spark.createDataFrame(rows, "id BIGINT, item STRING").write.format("persistshard").mode(
            "append"
        ).save(location)
        assert ps.open_shard(location).upper == t + 1
    assert counts(read(spark, location, as_of=0)) == Counter({(1, "a"): 1})
    assert counts(read(spark, location, as_of=1)) == Counter({(1, "a"): 1, (2, "b"): 1})
    assert counts(read(spark, location)) == Counter({(1, "a"): 1, (2, "b"): 1, (3, "c"): 1})
    with pytest.raises(Exception, match=r"NotSealed: as_of 3 is not sealed"):
        read(spark, location, as_of=3).collect()
    ps.open_shard(location).advance_since(2)
    with pytest.raises(Exception, match=r"SinceViolation: as_of 1 is before"):
        read(spark, location, as_of=1).collect()


def test_cdc_input_against_pandas_model(spark, location):
    """Updates with multiplicities and cancellations; every as_of and every change range
    must equal a pandas model that sums diffs."""
    import random

    rnd = random.Random(7)
    updates = [
        (rnd.randrange(20), rnd.choice(["x", "y"]), t, rnd.choice([-1, 1, 2]))
        for t in range(6)
        for _ in range(60)
    ]
    pdf = pd.DataFrame(updates, columns=["k", "v", "_time", "_diff"])
    # Make every running total non-negative by adding a large insert at time 0.
    base = pd.DataFrame(
        [(k, v, 0, 1000) for k in range(20) for v in ["x", "y"]],
        columns=["k", "v", "_time", "_diff"],
    )
    pdf = pd.concat([base, pdf], ignore_index=True)
    df = spark.createDataFrame(pdf).repartition(3)
    df.write.format("persistshard").mode("append").option("upper", 6).save(location)
    for as_of in range(6):
        model = pdf[pdf._time <= as_of].groupby(["k", "v"])._diff.sum()
        model = {k: d for k, d in model.items() if d != 0}
        got = read(spark, location, as_of=as_of, with_diff=True).collect()
        assert {(r.k, r.v): r._diff for r in got} == model
    changes = read(spark, location, updates_from=2, updates_to=5).collect()
    model = pdf[(pdf._time >= 2) & (pdf._time < 5)].groupby(["k", "v", "_time"])._diff.sum()
    assert {(r.k, r.v, r._time): r._diff for r in changes} == {
        k: d for k, d in model.items() if d != 0
    }
    expanded = read(spark, location, as_of=5).count()
    assert expanded == int(pdf._diff.sum())


def test_unsealed_rows_wait_for_upper(spark, location):
    df = spark.createDataFrame([(1, 0, 1), (2, 9, 1)], "id BIGINT, _time BIGINT, _diff BIGINT")
    df.write.format("persistshard").mode("append").option("upper", 5).save(location)
    assert counts(read(spark, location)) == Counter({(1,): 1})
    ps.open_shard(location).seal(10)
    assert counts(read(spark, location)) == Counter({(1,): 1, (2,): 1})


def test_time_and_diff_column_options(spark, location):
    df = spark.createDataFrame([(1, 3, 2), (2, 4, 1)], "id BIGINT, t BIGINT, n BIGINT")
    df.write.format("persistshard").mode("append").option("time_column", "t").option(
        "diff_column", "n"
    ).save(location)
    shard = ps.open_shard(location)
    assert shard.upper == 5
    assert shard.updates(0, 5).to_pylist() == [
        {"id": 1, "_time": 3, "_diff": 2},
        {"id": 2, "_time": 4, "_diff": 1},
    ]


def test_negative_net_diff_is_an_error(spark, location):
    spark.createDataFrame([(1, 0, -1)], "id BIGINT, _time BIGINT, _diff BIGINT").write.format(
        "persistshard"
    ).mode("append").save(location)
    with pytest.raises(Exception, match=r"NegativeDiff: 1 rows have a negative count"):
        read(spark, location).collect()
    assert read(spark, location, with_diff=True).collect() == [Row(id=1, _diff=-1)]


def test_self_correcting_overwrite_writes_only_the_difference(spark, location):
    n = 20_000
    first = spark.range(n).selectExpr("id", "concat('v', id) AS v")
    first.write.format("persistshard").mode("append").save(location)
    changed = spark.range(n).selectExpr(
        "id", "CASE WHEN id % 100 = 0 THEN concat('w', id) ELSE concat('v', id) END AS v"
    )
    changed.write.format("persistshard").mode("overwrite").save(location)
    shard = ps.open_shard(location)
    last = [h for h in shard.history() if h["kind"] == "overwrite"][-1]
    assert "upper 1 -> 2, 400 rows sealed" in last["summary"]  # 200 retractions + 200 inserts
    assert counts(read(spark, location)) == counts(changed)
    assert counts(read(spark, location, as_of=0)) == counts(first)


def test_racing_writers_one_wins(spark, location):
    """The loser's part files are swept (every part a file: option inline_bytes 0)."""
    spark.createDataFrame([(0,)], "id BIGINT").write.format("persistshard").mode("append").option(
        "compact", "false"
    ).option("inline_bytes", 0).save(location)

    def write(i: int):
        spark.createDataFrame([(i,)], "id BIGINT").write.format("persistshard").mode(
            "append"
        ).option("expected_upper", 1).option("compact", "false").option("inline_bytes", 0).save(
            location
        )

    write(1)
    with pytest.raises(Exception, match=r"UpperMismatch: expected upper 1, shard upper is 2"):
        write(2)
    assert counts(read(spark, location)) == Counter({(0,): 1, (1,): 1})
    assert part_keys(location) == ps.open_shard(location).inspect.state().part_keys()


def test_retried_task_leaves_no_orphan_parts(spark, location):
    """Each task fails once after writing its parts and is retried; the commit sees only
    the successful attempts, and the failed attempts' part files are swept (every part a
    file: option inline_bytes 0)."""
    sc = spark.sparkContext
    sc.setLocalProperty(FAULT_PROPERTY, "after_write")
    try:
        spark.range(1000).repartition(2).write.format("persistshard").mode("append").option(
            "compact", "false"
        ).option("inline_bytes", 0).save(location)
    finally:
        sc.setLocalProperty(FAULT_PROPERTY, None)
    shard = ps.open_shard(location)
    assert read(spark, location).count() == 1000
    assert part_keys(location) == shard.inspect.state().part_keys()


@pytest.mark.parametrize(
    ("rows", "schema", "options", "message"),
    [
        ([(1, None)], "id BIGINT, _diff BIGINT", {}, "InvalidUpdates: _diff has 1 null"),
        ([(1, 0)], "id BIGINT, _diff BIGINT", {}, "InvalidUpdates: _diff has 1 zero"),
        ([(1, 0)], "id BIGINT, _time BIGINT", {}, r"InvalidUpdates: _time 0 is below"),
        ([("x",)], "id STRING", {}, r"InvalidUpdates: columns \(id string\) do not match"),
        ([(1,)], "id BIGINT", {"colour": "red"}, "InvalidOption: unknown option colour"),
    ],
)
def test_failed_write_leaves_shard_unchanged(spark, location, rows, schema, options, message):
    spark.createDataFrame([(1,)], "id BIGINT").write.format("persistshard").mode("append").save(
        location
    )
    before = ps.open_shard(location).inspect.state()
    files = part_keys(location)
    writer = spark.createDataFrame(rows, schema).write.format("persistshard").mode("append")
    for k, v in options.items():
        writer = writer.option(k, v)
    with pytest.raises(Exception, match=message):
        writer.save(location)
    after = ps.open_shard(location).inspect.state()
    assert (after.version, after.upper) == (before.version, before.upper)
    assert part_keys(location) == files


def test_reads_stay_consistent_while_committing(spark, location):
    """A thread keeps committing (retract one row, insert another: always 100 rows); every
    Spark read sees exactly one version, so always 100 distinct rows. The thread commits
    about a hundred times a second, many times during each read; unthrottled, it took the
    driver's CPU from the reads and grew the log by thousands of versions."""
    shard = ps.open_shard(location)
    shard.append(pa.table({"id": list(range(100)), "_time": [0] * 100, "_diff": [1] * 100}))
    stop = threading.Event()

    def churn():
        s = ps.open_shard(location)
        i = 0
        while not stop.wait(0.01):
            t = s.upper
            s.compare_and_append(
                pa.table({"id": [i, 100 + i], "_time": [t, t], "_diff": [-1, 1]}), t, t + 1
            )
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    overlapped = 0
    try:
        for _ in range(6):
            before = shard.upper
            rows = read(spark, location, max_partitions=4, partition_bytes=1).collect()
            assert len(rows) == 100 and len({r.id for r in rows}) == 100
            overlapped += shard.upper > before
    finally:
        stop.set()
        worker.join()
    assert overlapped >= 3, "the commits did not run during the reads"


def test_key_range_partitions_consolidate_correctly(spark, location):
    """Many parts with overlapping keys, read as several key-range partitions: each row's
    updates must meet in one task."""
    for t in range(4):
        df = spark.range(0, 3000, numPartitions=3).selectExpr(
            "id % 997 AS k", f"{t} AS _time", "CAST(IF(id % 2 = 0, 1, -1) AS BIGINT) AS _diff"
        )
        df.write.format("persistshard").mode("append").option("compact", "false").save(location)
    model = ps.open_shard(location).snapshot()
    got = read(spark, location, with_diff=True, partition_bytes=1, max_partitions=8)
    assert got.rdd.getNumPartitions() > 1
    assert {(r.k, r._diff) for r in got.collect()} == {
        (r["k"], r["_diff"]) for r in model.to_pylist()
    }


def test_sql_create_insert_overwrite_select(spark, tmp_path):
    loc = str(tmp_path / "orders")
    spark.sql(
        f"CREATE TABLE orders USING persistshard LOCATION '{loc}' "
        "OPTIONS (columns 'id BIGINT, item STRING')"
    )
    try:
        spark.sql("INSERT INTO orders VALUES (1, 'apple'), (2, 'pear')")
        spark.sql("INSERT INTO orders VALUES (3, 'plum')")
        assert counts(spark.sql("SELECT * FROM orders")) == Counter(
            {(1, "apple"): 1, (2, "pear"): 1, (3, "plum"): 1}
        )
        spark.sql(
            f"INSERT OVERWRITE orders WITH ('path' = '{loc}') SELECT id, item FROM orders "
            "WHERE id > 1"
        )
        assert counts(spark.sql("SELECT * FROM orders")) == Counter(
            {(2, "pear"): 1, (3, "plum"): 1}
        )
        old = spark.sql("SELECT * FROM orders WITH ('as_of' = '0')")
        assert counts(old) == Counter({(1, "apple"): 1, (2, "pear"): 1})
        assert ps.open_shard(loc).upper == 3
        spark.sql(f"CREATE TABLE old_orders USING persistshard LOCATION '{loc}'")
        assert spark.table("old_orders").count() == 2
    finally:
        spark.sql("DROP TABLE IF EXISTS orders")
        spark.sql("DROP TABLE IF EXISTS old_orders")


def test_sql_without_location_says_how(spark):
    # The Python source refuses the first statement that reaches it; the companion's session
    # catalog refuses the CREATE itself (tests/test_companion_sql.py).
    try:
        with pytest.raises(Exception, match=r"InvalidOption: no shard location.*CREATE TABLE"):
            spark.sql("CREATE TABLE nowhere (id BIGINT) USING persistshard")
            spark.sql("INSERT INTO nowhere VALUES (1)")
    finally:
        spark.sql("DROP TABLE IF EXISTS nowhere")


def test_streaming_read_snapshot_then_updates(spark, location, tmp_path):
    shard = ps.open_shard(location)
    shard.append(pa.table({"id": [1, 2], "_time": [0, 0], "_diff": [1, 1]}))
    stream = spark.readStream.format("persistshard").option("changes", True).load(location)
    seen: list[set] = []

    def run_once():
        q = (
            stream.writeStream.foreachBatch(
                lambda df, _: seen.append({tuple(r) for r in df.collect()})
            )
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)

    run_once()
    assert set().union(*seen) == {(1, 0, 1), (2, 0, 1)}
    seen.clear()
    shard.append(pa.table({"id": [1, 3], "_time": [1, 1], "_diff": [-1, 1]}))
    run_once()  # resumes from the checkpoint: only the new updates
    assert set().union(*seen) == {(1, 1, -1), (3, 1, 1)}


def test_streaming_read_without_changes_says_how(spark, location):
    ps.open_shard(location).append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    stream = spark.readStream.format("persistshard").load(location)
    with pytest.raises(Exception, match=r"add .option\('changes', True\)"):
        stream.writeStream.format("memory").queryName("nope").start().awaitTermination(60)


def test_streaming_write_exactly_once(spark, location, tmp_path):
    """Micro-batches of a rate source are committed once each: ids are consecutive from 0
    and none repeats."""
    import time

    source = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    q = (
        source.selectExpr("value AS id")
        .writeStream.format("persistshard")
        .option("writer_id", "rate-1")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="1 second")
        .start(location)
    )
    shard = ps.open_shard(location)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if q.exception() is not None:
                raise q.exception()
            if shard.inspect.state().writers.get("rate-1", -1) >= 2:
                break
            time.sleep(0.5)
    finally:
        q.stop()
    ids = [r["id"] for r in shard.snapshot().to_pylist() for _ in range(r["_diff"])]
    assert shard.inspect.state().writers["rate-1"] >= 2, "fewer than three micro-batches committed"
    assert ids and len(ids) == len(set(ids)), "a micro-batch was committed twice"
    assert sorted(ids) == list(range(len(ids)))


def test_streaming_commit_replay_is_a_no_op(location):
    """Spark replays a micro-batch after a failed commit: committing the same (writer id,
    batch id) again must change nothing and must delete the replay's parts."""
    from pyspark.sql.types import StructType as ST

    from persistshard.datasource.options import WriteOptions
    from persistshard.datasource.sinks import PersistShardStreamWriter
    from persistshard.datasource.writer import StreamTaskWritten, describe_write, write_task

    schema = ST([StructField("id", LongType())])
    opts = {"path": location, "writer_id": "w", "compact": "false"}
    shard = ps.open_shard(location)

    def attempt(batch_id: int):
        d = describe_write(WriteOptions.parse(opts), schema, False, shard)
        out = write_task(d, [pa.record_batch({"id": [batch_id]})], d.lower)
        msg = StreamTaskWritten(
            out.sealed, out.unsealed, out.max_time, out.rows_in, d.lower, d.write_id
        )
        PersistShardStreamWriter(opts, schema, False).commit([msg], batch_id)

    attempt(0)
    attempt(1)
    version = shard.inspect.state().version
    attempt(1)  # replay
    assert shard.inspect.state().version == version
    assert {r["id"] for r in shard.snapshot().to_pylist()} == {0, 1}
    assert {m.key for m in shard._blob.list("parts/")} == shard.inspect.state().stored_part_keys()


def test_hive_catalog_keeps_the_location(tmp_path):
    """With enableHiveSupport(), a new process reading the same metastore still finds the
    shard (the location travels in the catalog's field metadata), and the provenance rule
    holds there too (tests/test_sql_provenance.py runs without Hive)."""
    script = f"""
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.warehouse.dir", {str(tmp_path / "wh")!r})
         .enableHiveSupport().getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
if sys.argv[1] == "create":
    spark.sql("CREATE TABLE h USING persistshard LOCATION {str(tmp_path / "h")!r} "
              "OPTIONS (columns 'id BIGINT')")
    spark.sql("CREATE TABLE hu USING persistshard LOCATION {str(tmp_path / "hu")!r} "
              "OPTIONS (columns 'id BIGINT')")
    print("EMPTY", spark.sql("SELECT * FROM h").collect())
    spark.sql("INSERT INTO h VALUES (1), (2)")
    spark.sql("INSERT INTO hu VALUES (7)")
else:
    print("CATALOG", spark.conf.get("spark.sql.catalog.spark_catalog", ""))
    spark.sql("INSERT INTO h VALUES (3)")
    for statement in ("INSERT INTO h SELECT * FROM hu", "INSERT OVERWRITE h TABLE hu"):
        try:
            spark.sql(statement)
            print("WROTE", statement)
        except Exception as e:
            print("REFUSED", "refused to write" in str(e))
    print("ROWS", sorted(r.id for r in spark.sql("SELECT * FROM h").collect()))
    print("SOURCE", sorted(r.id for r in spark.sql("SELECT * FROM hu").collect()))
"""
    path = tmp_path / "hive_job.py"
    path.write_text(script)
    # Spark finds pyspark_persistshard by scanning sys.path; an editable install is not seen
    # by that scan, so name the directory that holds the module.
    import os

    import pyspark_persistshard

    env = {**os.environ, "PYTHONPATH": os.path.dirname(pyspark_persistshard.__file__)}
    for step in ("create", "read"):
        out = subprocess.run(
            [sys.executable, str(path), step],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        if step == "create":
            assert "EMPTY []" in out.stdout  # a created table reads as empty
    from persistshard.datasource.companion import SESSION_CATALOG

    if f"CATALOG {SESSION_CATALOG}" in out.stdout:
        # The companion's catalog (the run's PYSPARK_SUBMIT_ARGS reach the job) gives every
        # table statement its table's location: both writes land in h, from hu's rows.
        assert out.stdout.count("WROTE ") == 2, out.stdout
        assert "ROWS [7]" in out.stdout
    else:
        # With Hive's catalog too, a write from another table is refused and changes nothing.
        assert out.stdout.count("REFUSED True") == 2, out.stdout
        assert "ROWS [1, 2, 3]" in out.stdout
    assert "SOURCE [7]" in out.stdout


def test_duplicate_rows_across_tasks_count_correctly(spark, location):
    """The same row written by several tasks lands in several parts; a plain snapshot
    repeats it once per copy (the unconsolidated fast path), with_diff sums the copies."""
    df = spark.createDataFrame([(1, "x")] * 7 + [(2, "y")] * 2, "id BIGINT, v STRING")
    df.repartition(3).write.format("persistshard").mode("append").option("compact", "false").save(
        location
    )
    assert counts(read(spark, location)) == Counter({(1, "x"): 7, (2, "y"): 2})
    assert counts(read(spark, location, with_diff=True)) == Counter(
        {(1, "x", 7): 1, (2, "y", 2): 1}
    )


def test_two_streams_batch_ids_do_not_collide(location):
    """Two streaming writers both commit their micro-batch 0: the trace batches they create
    must have distinct ids (compaction identifies batches by id)."""
    from pyspark.sql.types import StructType as ST

    from persistshard.datasource.options import WriteOptions
    from persistshard.datasource.sinks import PersistShardStreamWriter
    from persistshard.datasource.writer import StreamTaskWritten, describe_write, write_task

    schema = ST([StructField("id", LongType())])
    shard = ps.open_shard(location)
    for writer in ("a", "b"):
        opts = {"path": location, "writer_id": writer, "compact": "false"}
        d = describe_write(WriteOptions.parse(opts), schema, False, shard)
        out = write_task(d, [pa.record_batch({"id": [ord(writer)]})], d.lower)
        msg = StreamTaskWritten(
            out.sealed, out.unsealed, out.max_time, out.rows_in, d.lower, d.write_id
        )
        PersistShardStreamWriter(opts, schema, False).commit([msg], 0)
    ids = [b.id for b in shard.inspect.state().trace]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert shard.inspect.state().writers == {"a": 0, "b": 0}


def test_the_shared_sessions_catalog_lives_in_memory(spark):
    """The shared session's catalog is Spark's in-memory one (pyproject.toml's
    ``spark_options``), not a Hive metastore: a run killed between a CREATE TABLE and its DROP
    leaves no table for the next run to trip over, as a ``metastore_db`` in the working
    directory did, and no session pays for starting Hive's metastore. Hive's catalog has a
    test of its own (`test_hive_catalog_keeps_the_location`, sessions of its own)."""
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.sql.catalogImplementation") == "in-memory"
    catalog = spark._jsparkSession.sharedState().externalCatalog().unwrapped()
    assert catalog.getClass().getSimpleName() == "InMemoryCatalog"


def test_python_workers_import_the_installed_pyspark(spark):
    """The Python processes Spark starts import pyspark and py4j from the installed packages'
    compiled modules, not from Spark's ``pyspark.zip`` and ``py4j-*-src.zip`` (conftest's
    ``sitecustomize``): compiling the zip's sources at each start took a streaming source's
    runner past the 10 s Spark waits for it to connect back on loaded cores, and each task
    re-read the py4j zip's directory. They keep bytecode: with ``PYTHONDONTWRITEBYTECODE``
    in the run's environment, in the run's own directory (conftest's
    `_bytecode_for_the_run`)."""

    def probe(_: int) -> tuple[str, str, list[str], bool, str | None]:
        import sys

        import py4j
        import pyspark

        return (
            pyspark.__file__ or "",
            py4j.__file__ or "",
            list(sys.path),
            sys.dont_write_bytecode,
            sys.pycache_prefix,
        )

    ((pyspark_file, py4j_file, path, no_bytecode, prefix),) = (
        spark.sparkContext.parallelize([0], 1).map(probe).collect()
    )
    assert ".zip" not in pyspark_file and ".zip" not in py4j_file, (pyspark_file, py4j_file)
    spark_zips = [p for p in path if p.endswith("pyspark.zip") or "py4j-" in os.path.basename(p)]
    assert not spark_zips, path
    assert not no_bytecode
    assert prefix == os.environ.get("PYTHONPYCACHEPREFIX"), prefix
