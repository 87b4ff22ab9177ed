"""The reads of tests/test_jvm_scan.py: the same shards read through the JVM companion
(``format("persistshard")``) and through the Python source (registered again under
``persistshard_python``), in a Spark session that has the companion.

`collect` runs them in a given session: the run's shared one when it has the companion
(tests/conftest.py), else this module's own (``python tests/jvm_scan_session.py WORKDIR``
with the companion jar's cache in ``PERSISTSHARD_COMPANION_CACHE``: a JVM of its own, as
``spark.jars`` applies only when a session starts), which prints one line ``RESULT <json>``.
Either way the result is, per case, both sides' rows as sorted ``[repr(row), count]`` pairs
(or the error text) and the companion's physical plan.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa


def rows_of(df: Any) -> list[list[Any]]:
    counts = Counter(repr(tuple(r)) for r in df.collect())
    return [[k, v] for k, v in sorted(counts.items())]


def outcome(make: Any) -> dict[str, Any]:
    try:
        return {"rows": rows_of(make())}
    except Exception as e:
        text = str(e)
        for line in text.splitlines():  # the first line naming a persistshard error class
            for name in ("NotSealed", "SinceViolation", "NoShard", "InvalidOption", "NegativeDiff"):
                if f"{name}: " in line:  # Spark may show the class name twice
                    text = line[line.index(f"{name}: ") :]
                    return {"error": text.replace(f"{name}: {name}: ", f"{name}: ")}
        return {"error": text.splitlines()[0] if text else type(e).__name__}


#: A read: its options (``__schema`` a user schema) and what the test does to the frame.
Read = tuple[dict[str, str], Any]

#: The reads of every shard, by label.
COMMON: dict[str, Read] = {
    "snapshot": ({}, None),
    "count": ({}, lambda df: df.groupBy().count()),
    "with_diff": ({"with_diff": "true"}, None),
}
#: The reads of one shard of those `collect` writes, by label.
MORE: dict[str, dict[str, Read]] = {
    "appends": {
        "as_of 0": ({"as_of": "0"}, None),
        "sum of one column": ({}, lambda df: df.selectExpr("sum(id)")),
        "filtered": ({}, lambda df: df.filter("id < 120 OR id >= 1490")),
        "filtered strings": ({}, lambda df: df.filter("s = '5' AND maybe IS NULL")),
        "filtered dates": ({}, lambda df: df.filter("day < DATE'2024-01-10'")),
        "user schema": ({"__schema": "s STRING, id BIGINT"}, None),
        "unknown column": ({"__schema": "id BIGINT, nope STRING"}, None),
        "where": ({"where": "id < 50"}, None),
        "unsealed as_of": ({"as_of": "9"}, None),
    },
    "retractions": {
        "as_of 0": ({"as_of": "0"}, None),
        "as_of 1": ({"as_of": "1"}, None),
        "one column": ({}, lambda df: df.select("v")),
        "updates": ({"updates_from": "0"}, None),
    },
    "nested": {
        "nested columns": ({}, lambda df: df.select("m", "arr", "st", "id")),
        "struct field": ({}, lambda df: df.filter("st.a < 100").select("st.b")),
    },
    "evolved": {
        "as_of 0": ({"as_of": "0"}, None),
        "one column": ({}, lambda df: df.select("extra")),
    },
    "fixed": {
        "filtered decimals": ({}, lambda df: df.filter("dec < 0 AND i32 IS NOT NULL")),
        "sums": ({}, lambda df: df.selectExpr("sum(dec)", "sum(big)", "sum(i32)", "max(day)")),
    },
}


def reads(name: str) -> dict[str, Read]:
    """The reads of shard ``name``."""
    return {**COMMON, **MORE[name]}


#: Every case `collect` returns: "shard: read", and the read of a shard never written.
CASES: tuple[str, ...] = (
    *(f"{name}: {label}" for name in MORE for label in reads(name)),
    "missing: snapshot",
)


def companion_session(**conf: str) -> Any:
    """A small local session built with ``ps.configure_spark`` (the companion), plus
    ``conf``; tests/companion_sql_session.py starts its session here too."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import persistshard as ps

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = ps.configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def collect(spark: Any, work: Path) -> dict[str, Any]:
    """Write the shards under ``work`` and read them both ways in ``spark`` (a session with
    the companion). What it leaves in the session: the Python source registered under
    ``persistshard_python`` (a registration cannot be undone; the name is this module's)."""
    import persistshard as ps
    from persistshard.datasource.source import PersistShardDataSource

    class PythonOnly(PersistShardDataSource):
        @classmethod
        def name(cls) -> str:
            return "persistshard_python"

    spark.dataSource.register(PythonOnly)
    conf = spark._jsparkSession.sessionState().conf()
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource
    provider = lookup.lookupDataSource("persistshard", conf).getName()

    shards: dict[str, str] = {}

    # Appends through Spark: inline parts and part files, many types, chunks of few rows.
    appends = str(work / "appends")
    for i, inline in enumerate(("4096", "0", "4096", "0")):
        lo = i * 500
        spark.range(lo, lo + 500).selectExpr(
            "id",
            "CAST(id % 37 AS STRING) AS s",
            "id / 4.0 AS d",
            "CAST(id % 3 AS INT) AS small",
            "DATE_ADD(DATE'2024-01-01', CAST(id % 400 AS INT)) AS day",
            "CAST(id AS DECIMAL(12, 2)) AS dec",
            "id % 2 = 0 AS flag",
            "TIMESTAMP'2024-01-01 00:00:00' + MAKE_INTERVAL(0, 0, 0, 0, 0, 0, id) AS ts",
            "CASE WHEN id % 5 = 0 THEN NULL ELSE CAST(id AS STRING) END AS maybe",
        ).write.format("persistshard").option("inline_bytes", inline).option(
            "chunk_bytes", "4096"
        ).mode("append").save(appends)
    shards["appends"] = appends

    # Retractions and multiplicities (diffs of -1 and 2), written by the Python API.
    retractions = str(work / "retractions")
    shard = ps.open_shard(retractions, inline_bytes=0)
    ids = list(range(300))
    shard.append(
        pa.table({"id": ids, "v": [f"v{i}" for i in ids], "_time": [0] * 300, "_diff": [2] * 300}),
        new_upper=1,
    )
    gone = ids[::3]
    shard.append(
        pa.table(
            {"id": gone, "v": [f"v{i}" for i in gone], "_time": [1] * 100, "_diff": [-1] * 100}
        ),
        new_upper=2,
    )
    shard.append(pa.table({"id": [1000], "v": ["late"], "_time": [2], "_diff": [1]}), new_upper=3)
    shards["retractions"] = retractions

    # A column added later (merge_schema): older parts lack it and read it as nulls.
    evolved = str(work / "evolved")
    spark.range(100).selectExpr("id").write.format("persistshard").option("inline_bytes", "0").mode(
        "append"
    ).save(evolved)
    spark.range(100, 150).selectExpr("id", "CAST(id AS STRING) AS extra").write.format(
        "persistshard"
    ).option("merge_schema", "true").mode("append").save(evolved)
    shards["evolved"] = evolved

    # Fixed-width columns the reader decodes into Java arrays (ints, dates, bigints, doubles,
    # decimals of precision <= 18) and one it does not (a decimal of precision 30), with nulls,
    # negatives, extremes, random values (stored plain: they do not compress) and chunks whose
    # row counts are not multiples of 8.
    fixed = str(work / "fixed")
    n = 2003
    rng = random.Random(38)

    def maybe(i: int, v: Any) -> Any:
        return None if i % 7 == 3 else v

    limit = 10**18 - 1
    table = pa.table(
        {
            "i32": pa.array(
                [maybe(i, rng.randint(-(2**31), 2**31 - 1)) for i in range(n)], pa.int32()
            ),
            "day": pa.array(
                [maybe(i + 1, date(1992, 1, 1) + timedelta(days=i % 2500)) for i in range(n)],
                pa.date32(),
            ),
            "big": pa.array(
                [maybe(i + 2, rng.randint(-(2**62), 2**62)) for i in range(n)], pa.int64()
            ),
            "dbl": pa.array([maybe(i + 3, rng.uniform(-1e9, 1e9)) for i in range(n)], pa.float64()),
            "dec": pa.array(
                [
                    maybe(
                        i + 4,
                        Decimal(rng.choice((-limit, limit, rng.randint(-limit, limit)))).scaleb(-3),
                    )
                    for i in range(n)
                ],
                pa.decimal128(18, 3),
            ),
            "small": pa.array(
                [maybe(i + 5, Decimal(i % 200 - 100).scaleb(-2)) for i in range(n)],
                pa.decimal128(9, 2),
            ),
            "wide": pa.array(
                [maybe(i + 6, Decimal(-(10**28) + i).scaleb(-4)) for i in range(n)],
                pa.decimal128(30, 4),
            ),
            "_time": pa.array([0] * n, pa.int64()),
            "_diff": pa.array([1] * n, pa.int64()),
        }
    )
    ps.open_shard(fixed, inline_bytes=0, chunk_bytes=12_000).append(table, new_upper=1)
    shards["fixed"] = fixed

    # Nested columns over many chunks: a struct (with null structs), a list and a map. Every
    # chunk after the first is decoded into the vectors of the chunk before it unless the
    # reader gives each chunk its own (a struct's second chunk once failed to load).
    nested = str(work / "nested")
    spark.range(3000).selectExpr(
        "id",
        "IF(id % 17 = 3, NULL, NAMED_STRUCT('a', CAST(id AS INT), 'b', CAST(id % 5 AS STRING)))"
        " AS st",
        "IF(id % 13 = 4, NULL, SEQUENCE(0, CAST(id % 4 AS INT))) AS arr",
        "MAP(CONCAT('k', CAST(id % 3 AS STRING)), id) AS m",
    ).write.format("persistshard").option("inline_bytes", "0").option("chunk_bytes", "4096").mode(
        "append"
    ).save(nested)
    shards["nested"] = nested

    result: dict[str, Any] = {"provider": provider, "cases": {}}
    for name, path in shards.items():
        for label, (options, shape) in reads(name).items():
            opts = dict(options)
            user_schema = opts.pop("__schema", None)

            def frame(
                fmt: str,
                opts: dict[str, str] = opts,
                user_schema: Any = user_schema,
                shape: Any = shape,
            ) -> Any:
                reader = spark.read.format(fmt).options(**opts)
                if user_schema is not None:
                    reader = reader.schema(user_schema)
                df = reader.load(path)  # noqa: B023 (called within this iteration)
                return df if shape is None else shape(df)

            case: dict[str, Any] = {"plan": ""}

            def companion(case: dict[str, Any] = case, frame: Any = frame) -> Any:
                df = frame("persistshard")
                # Planned once: the collect that follows runs this plan.
                case["plan"] = df._jdf.queryExecution().executedPlan().toString()
                return df

            case["companion"] = outcome(companion)
            case["python"] = outcome(lambda frame=frame: frame("persistshard_python"))
            result["cases"][f"{name}: {label}"] = case

    # The bytes Spark's optimizer sees for a scan of every column and of one column.
    from persistshard.core.shard import read_state

    def optimizer_bytes(df: Any) -> int:
        return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())

    whole = spark.read.format("persistshard").load(appends)
    state = read_state(ps.open_shard(appends))
    result["optimizer_bytes"] = {
        "all": optimizer_bytes(whole),
        "id": optimizer_bytes(whole.select("id")),
        "stored": sum(r.size for r in state.parts()),
    }

    missing = str(work / "missing")
    result["cases"]["missing: snapshot"] = {
        "companion": outcome(lambda: spark.read.format("persistshard").load(missing)),
        "python": outcome(lambda: spark.read.format("persistshard_python").load(missing)),
        "plan": "",
    }

    # Writes, overwrites and streams through the companion's name land as the Python source's.
    written = str(work / "written")
    spark.range(10).write.format("persistshard").mode("append").save(written)
    spark.range(5, 12).write.format("persistshard").mode("overwrite").save(written)
    result["overwrite"] = sorted(
        r.id for r in spark.read.format("persistshard").load(written).collect()
    )
    stream_out = str(work / "stream-out")
    query = (
        spark.readStream.format("persistshard")
        .option("changes", "true")
        .load(written)
        .writeStream.format("persistshard")
        .option("writer_id", "w1")
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start(stream_out)
    )
    try:
        query.awaitTermination(300)
    finally:
        query.stop()  # a stream still running after 300 s: not left in the session
    result["stream"] = sorted(
        (r.id, r._diff)
        for r in spark.read.format("persistshard")
        .option("with_diff", "true")
        .load(stream_out)
        .collect()
    )
    shutil.rmtree(work / "checkpoint", ignore_errors=True)
    result["workers"] = python_reads_and_their_workers(spark, retractions, work)
    result["per_query"] = round_trips_and_freshness(spark, work)
    return result


def round_trips_and_freshness(spark: Any, work: Path) -> dict[str, Any]:
    """The companion's requests to the driver's bridge per query (`CompanionProvider`'s
    counts by kind) for a load and sum, a load and full read, and a failed load; and what
    two queries of one loaded frame see when another process appends in between."""
    provider = spark._jvm.persistshard.companion.CompanionProvider
    kinds = ("schema", "plan")

    def asked(run: Any) -> dict[str, int]:
        before = {k: int(provider.plannerRequests(k)) for k in kinds}
        run()
        return {k: int(provider.plannerRequests(k)) - before[k] for k in kinds}

    path = str(work / "per-query")
    spark.range(100).selectExpr("id", "id * 2 AS v").write.format("persistshard").mode(
        "append"
    ).save(path)

    def load() -> Any:
        return spark.read.format("persistshard").load(path)

    out: dict[str, Any] = {
        "sum": asked(lambda: load().agg({"v": "sum"}).collect()),
        "full": asked(lambda: load().collect()),
    }
    failed: dict[str, str] = {}

    def missing() -> None:
        try:
            spark.read.format("persistshard").load(str(work / "never-written"))
        except Exception as e:
            failed["class"] = type(e).__name__
            failed["text"] = str(e).splitlines()[0]

    out["missing"] = asked(missing)
    out["missing_error"] = failed
    df = spark.read.format("persistshard").load(path)
    out["counts"] = [df.count()]
    appended = (
        "import sys, pyarrow as pa, persistshard as ps; "
        "ps.open_shard(sys.argv[1]).append(pa.table({'id': [100, 101], 'v': [200, 202]}))"
    )
    subprocess.run([sys.executable, "-c", appended, path], check=True, timeout=120)
    out["counts"] += [df.count(), load().count()]
    return out


def bridge_readers(spark: Any, command: bytes = b"reads") -> list[int]:
    """The process ids of the ``bridge reads`` (or ``command``) workers the session's JVM
    runs (its children: in local mode the executors are the driver's JVM)."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    jvm = int(bean.getPid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if parent == jvm and b"persistshard.datasource.bridge" in argv and command in argv:
            found.append(int(entry))
    return sorted(found)


def python_reads_and_their_workers(spark: Any, retractions: str, work: Path) -> dict[str, Any]:
    """Partitions the Python source reads for the companion (a shard with retractions), read
    again and again: which ``bridge reads`` workers served them, around a read that failed in
    Python (a negative count) and one abandoned early (``LIMIT 1`` of a large partition)."""
    import persistshard as ps

    def snapshot() -> list[list[Any]]:
        return rows_of(spark.read.format("persistshard").load(retractions))

    out: dict[str, Any] = {"rows": snapshot(), "after_first": bridge_readers(spark)}
    out["again"] = snapshot()
    out["after_again"] = bridge_readers(spark)

    negative = str(work / "negative")
    ps.open_shard(negative).append(pa.table({"id": [1], "_time": [0], "_diff": [-1]}), new_upper=1)
    out["failed"] = outcome(lambda: spark.read.format("persistshard").load(negative))
    out["after_failed"] = bridge_readers(spark)

    big = str(work / "big")
    n = 200_000
    ps.open_shard(big, inline_bytes=0).append(
        pa.table({"id": list(range(n)), "_time": [0] * n, "_diff": [2] * n}), new_upper=1
    )
    out["limited"] = len(spark.read.format("persistshard").load(big).limit(1).collect())
    out["after_limited"] = snapshot()
    out["workers_at_end"] = bridge_readers(spark)
    return out


def main() -> None:
    spark = companion_session()
    result = collect(spark, Path(sys.argv[1]))
    spark.stop()
    print("RESULT " + json.dumps(result))


_ = (date, datetime, timezone, Decimal)  # the row reprs name these types

if __name__ == "__main__":
    main()
