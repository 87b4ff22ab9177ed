"""The statements of tests/test_companion_rowlevel.py: DELETE, UPDATE and MERGE INTO through
the JVM companion on tables of shards written with the Python API, in a Spark session that
has the companion.

`collect` runs them in a given session: the run's shared one when it has the companion
(tests/conftest.py), else this module's own (``python tests/rowlevel_session.py WORKDIR``
with the companion jar's cache in ``PERSISTSHARD_COMPANION_CACHE``: a JVM of its own, as
``spark.jars`` applies only when a session starts), which prints one line ``RESULT <json>``.
Either way the result is, per case, the shard's contents read back with the Python API (rows
with multiplicities), the model's, what the statement committed (the updates at its time),
the uppers, the error text of a statement that must fail and the parts no version
references.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

Row = tuple[int | None, str | None]


def rows(n: int) -> Counter[Row]:
    """The starting contents: duplicates (multiplicities 1 to 3), null strings, null ids."""
    out: Counter[Row] = Counter()
    for i in range(n):
        out[(i, None if i % 7 == 0 else f"s{i % 5}")] = 1 + i % 3
    out[(None, "nullid")] = 2
    out[(None, None)] = 1
    return out


def listed(model: Counter[Row]) -> list[list[Any]]:
    return sorted([[repr(k), v] for k, v in model.items() if v != 0])


def collect(spark: Any, work: Path) -> dict[str, Any]:
    """Run the statements in ``spark`` (a session with the companion) on tables of shards
    under ``work``. The session is left as found: its tables, view and functions have names
    of this call's own (``rowlevel_<name>_<tag>``) and are dropped at the end (the shards
    stay in ``work``)."""
    tag = uuid.uuid4().hex[:8]
    made: list[tuple[str, str]] = []  # (kind, name) to drop, in order

    def named(kind: str, short: str) -> str:
        name = f"rowlevel_{short}_{tag}"
        made.append((kind, name))
        return name

    try:
        return _statements(spark, work, named)
    finally:
        for kind, name in reversed(made):
            if kind == "view":
                spark.catalog.dropTempView(name)
            elif kind == "function":
                spark.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {name}")
            else:
                spark.sql(f"DROP TABLE IF EXISTS {name}")


def _statements(spark: Any, work: Path, named: Callable[[str, str], str]) -> dict[str, Any]:
    from pyspark.sql.functions import udf
    from pyspark.sql.types import BooleanType

    import persistshard as ps

    def create(short: str, model: Counter[Row], columns: bool = False) -> tuple[Any, str]:
        """The shard ``work/short`` holding ``model``, and the table over it."""
        name = named("table", short)
        location = str(work / short)
        shard = ps.open_shard(location, inline_bytes=0)
        items = sorted(model.items(), key=repr)
        shard.append(
            pa.table(
                {
                    "id": pa.array([k[0] for k, _ in items], pa.int64()),
                    "s": pa.array([k[1] for k, _ in items], pa.string()),
                    "_time": pa.array([0] * len(items), pa.int64()),
                    "_diff": pa.array([v for _, v in items], pa.int64()),
                }
            ),
            new_upper=1,
        )
        listing = "(id BIGINT, s STRING) " if columns else ""
        spark.sql(
            f"CREATE TABLE {name} {listing}USING persistshard LOCATION '{location}' "
            "OPTIONS (inline_bytes '0')"
        )
        return shard, name

    def contents(shard: Any) -> list[list[Any]]:
        snap = ps.open_shard(shard.location).snapshot().to_pylist()
        return listed(Counter({(r["id"], r["s"]): r["_diff"] for r in snap}))

    def committed(shard: Any, time: int) -> list[list[Any]]:
        ups = ps.open_shard(shard.location).updates(time, time + 1).to_pylist()
        total: Counter[Row] = Counter()
        for r in ups:
            total[(r["id"], r["s"])] += r["_diff"]
        return listed(total)

    def orphans(shard: Any) -> int:
        report = ps.open_shard(shard.location).gc(dry_run=True, retention_seconds=0)
        return len(report.orphaned_parts) + report.leased_parts

    def run(sql: str) -> str | None:
        try:
            spark.sql(sql).collect()
        except Exception as e:
            text = str(e)
            for name in ("UpperMismatch", "ValueError", "InvalidOption", "InvalidUpdates"):
                if f"{name}: " in text:
                    return text[text.index(f"{name}: ") :].splitlines()[0]
            return text.splitlines()[0]
        return None

    cases: dict[str, dict[str, Any]] = {}

    def case(name: str, shard: Any, sql: str, model: Counter[Row], fails: bool = False) -> None:
        before = ps.open_shard(shard.location).upper
        error = run(sql)
        after = ps.open_shard(shard.location).upper
        cases[name] = {
            "error": error,
            "rows": contents(shard),
            "model": listed(model),
            "upper_before": before,
            "upper_after": after,
            "committed": committed(shard, before) if after > before else [],
            "orphans": orphans(shard),
            "fails": fails,
        }

    # DELETE through the Python source's scan (a table without a column list).
    model = rows(60)
    a, ta = create("a", model)
    deleted = Counter({k: v for k, v in model.items() if (k[0] is not None and k[0] % 4 == 0)})
    deleted.update({k: v for k, v in model.items() if k[1] is None and k not in deleted})
    model = model - deleted
    case("delete", a, f"DELETE FROM {ta} WHERE id % 4 = 0 OR s IS NULL", model)
    cases["delete"]["retractions"] = listed(Counter({k: -v for k, v in deleted.items()}))

    # UPDATE: the matching rows' old versions retracted, the new ones inserted.
    updated = Counter({k: v for k, v in model.items() if k[0] is not None and k[0] % 5 == 1})
    for k, v in updated.items():
        model[k] -= v
        model[(k[0], "u")] += v
    case("update", a, f"UPDATE {ta} SET s = 'u' WHERE id % 5 = 1", +model)

    # MERGE: matched delete, matched update, not matched insert (a null key never matches).
    spark.createDataFrame(
        [(3, "del"), (6, "new6"), (7, "new7"), (500, "ins"), (None, "nullsrc")],
        "id BIGINT, s STRING",
    ).createOrReplaceTempView(src := named("view", "src"))
    source = {3: "del", 6: "new6", 7: "new7", 500: "ins"}
    merged: Counter[Row] = Counter()
    for k, v in model.items():
        if k[0] in source and source[k[0]] == "del":
            continue
        merged[(k[0], source[k[0]]) if k[0] in source else k] += v
    targets = {k[0] for k in model}
    merged.update({(i, t): 1 for i, t in source.items() if i not in targets})
    merged[(None, "nullsrc")] += 1
    case(
        "merge",
        a,
        f"MERGE INTO {ta} AS a USING {src} AS src ON a.id = src.id "
        "WHEN MATCHED AND src.s = 'del' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET s = src.s "
        "WHEN NOT MATCHED THEN INSERT *",
        merged,
    )

    # DELETE through the companion's columnar scan (a table with a column list).
    model = rows(40)
    b, tb = create("b", model, columns=True)
    plan = spark.sql(f"EXPLAIN DELETE FROM {tb} WHERE s = 's1'").collect()[0][0]
    cases["plan"] = {"text": plan}
    case(
        "columnar delete",
        b,
        f"DELETE FROM {tb} WHERE s = 's1'",
        Counter({k: v for k, v in model.items() if k[1] != "s1"}),
    )

    # A race: another writer commits while the DELETE runs (after it read the table).
    model = rows(30)
    r, tr = create("r", model)
    marker, raced_location = str(work / "raced"), r.location

    def racer(i: int | None) -> bool:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return True
        other = ps.open_shard(raced_location)
        other.append(
            pa.table(
                {
                    "id": pa.array([1000], pa.int64()),
                    "s": pa.array(["racer"], pa.string()),
                    "_time": pa.array([other.upper], pa.int64()),
                    "_diff": pa.array([1], pa.int64()),
                }
            )
        )
        return True

    spark.udf.register(racing := named("function", "racer"), udf(racer, BooleanType()))
    raced = model.copy()
    raced[(1000, "racer")] = 1
    case("race", r, f"DELETE FROM {tr} WHERE {racing}(id) AND id < 10", raced, fails=True)
    cases["race"]["raced"] = os.path.exists(marker)

    # A statement that fails in its tasks writes nothing.
    model = rows(30)
    f, tf = create("f", model)

    def boom(i: int | None) -> bool:
        if i == 29:
            raise ValueError("boom at 29")
        return i is not None and i % 2 == 0

    spark.udf.register(booming := named("function", "boom"), udf(boom, BooleanType()))
    case("failure", f, f"DELETE FROM {tf} WHERE {booming}(id)", model, fails=True)

    # Pooled writers, one write task per statement (one partition each, no shuffle of more).
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        cases["pool"] = _pooled_writers(spark, work, named, create, case, cases)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
    return {"cases": cases}


def _pooled_writers(
    spark: Any,
    work: Path,
    named: Callable[[str, str], str],
    create: Callable[..., tuple[Any, str]],
    case: Callable[..., None],
    cases: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Statements one after another, each of one write task, and the ``bridge writes``
    workers of the session's JVM after each (`bridge_readers`): a DELETE, a MERGE, a DELETE
    and a MERGE on a shard storing nanosecond timestamps (Spark's microsecond rows cast to
    them), a DELETE whose write fails in Python (a shard storing second timestamps, which
    Spark's microsecond rows cannot be stored as), a DELETE whose task Spark aborts after
    handing rows to its worker (a Python UDF raising on the task's 15,000th row), then a
    DELETE on the first table again; last, a DELETE on nanoseconds Spark cannot hold. Each
    statement's outcome is a case of its own (`case`)."""
    from jvm_scan_session import bridge_readers
    from pyspark.sql.functions import udf
    from pyspark.sql.types import BooleanType

    import persistshard as ps

    def workers() -> list[int]:
        return bridge_readers(spark, b"writes")

    model = rows(40)
    p, tp = create("pool", model)
    model = Counter({k: v for k, v in model.items() if k[0] is None or k[0] % 3 != 0})
    case("pool delete", p, f"DELETE FROM {tp} WHERE id % 3 = 0", model)
    pool: dict[str, Any] = {"first": workers()}

    spark.createDataFrame([(1, "m1"), (600, "m600")], "id BIGINT, s STRING").coalesce(
        1
    ).createOrReplaceTempView(src := named("view", "pool_src"))
    merged: Counter[Row] = Counter()
    for k, v in model.items():
        merged[(1, "m1") if k[0] == 1 else k] += v
    merged[(600, "m600")] += 1
    case(
        "pool merge",
        p,
        f"MERGE INTO {tp} AS t USING {src} AS src ON t.id = src.id "
        "WHEN MATCHED THEN UPDATE SET s = src.s WHEN NOT MATCHED THEN INSERT *",
        merged,
    )
    pool["merge"] = workers()

    def timestamped(short: str, unit: str, values: list[int]) -> tuple[Any, str]:
        """A shard ``work/short`` of rows (i + 1, letter, ``values[i]``) with ``t`` a
        ``timestamp[unit, UTC]`` column, as pandas data gives (the Python API's), and the
        table over it."""
        location = str(work / short)
        shard = ps.open_shard(location, inline_bytes=0)
        shard.append(
            pa.table(
                {
                    "id": pa.array(range(1, len(values) + 1), pa.int64()),
                    "s": pa.array([chr(ord("a") + i) for i in range(len(values))], pa.string()),
                    "t": pa.array(values, pa.timestamp(unit, tz="UTC")),
                    "_time": pa.array([0] * len(values), pa.int64()),
                    "_diff": pa.array([1] * len(values), pa.int64()),
                }
            ),
            new_upper=1,
        )
        name = named("table", short.replace("-", "_"))
        spark.sql(
            f"CREATE TABLE {name} USING persistshard LOCATION '{location}' "
            "OPTIONS (inline_bytes '0')"
        )
        return shard, name

    def stamps(shard: Any) -> list[list[Any]]:
        """The shard's (id, t in its stored unit, diff), sorted: the exact stored values."""
        snap = ps.open_shard(shard.location).snapshot()
        ts = snap.column("t").cast(pa.int64()).to_pylist()
        return sorted([r["id"], t, r["_diff"]] for r, t in zip(snap.to_pylist(), ts, strict=True))

    # A shard storing nanoseconds (whole microseconds: what Spark's rows hold): Spark's
    # microsecond rows are cast to the stored unit (core/write/validate.widens), and the
    # rows a statement leaves keep their stored values.
    ns, tn = timestamped("pool-ns", "ns", [10_000, 20_000, 30_000])
    case("ns delete", ns, f"DELETE FROM {tn} WHERE id = 1", Counter({(2, "b"): 1, (3, "c"): 1}))
    cases["ns delete"]["stamps"] = stamps(ns)
    spark.createDataFrame(
        [(2, "m2", 7), (9, "m9", 8)], "id BIGINT, s STRING, us BIGINT"
    ).selectExpr("id", "s", "timestamp_micros(us) AS t").coalesce(1).createOrReplaceTempView(
        nsrc := named("view", "pool_ns_src")
    )
    case(
        "ns merge",
        ns,
        f"MERGE INTO {tn} AS t USING {nsrc} AS src ON t.id = src.id "
        "WHEN MATCHED THEN UPDATE SET s = src.s WHEN NOT MATCHED THEN INSERT *",
        Counter({(2, "m2"): 1, (3, "c"): 1, (9, "m9"): 1}),
    )
    cases["ns merge"]["stamps"] = stamps(ns)

    # A shard storing seconds: Spark's microseconds cannot be stored as seconds without loss
    # for every value, so the DELETE's write fails in Python, in the pooled worker.
    seconds, tsec = timestamped("pool-s", "s", [10, 20])
    case(
        "pool python failure",
        seconds,
        f"DELETE FROM {tsec} WHERE id = 1",
        Counter({(1, "a"): 1, (2, "b"): 1}),
        fails=True,
    )
    pool["failed"] = workers()

    big_model: Counter[Row] = Counter({(i, "big"): 1 for i in range(20_000)})
    big, tbig = create("pool_big", big_model)
    seen = [0]

    def aborting(i: int | None) -> bool:
        seen[0] += 1
        if seen[0] == 15_000:
            raise ValueError("abort at the task's row 15000")
        return True

    spark.udf.register(fn := named("function", "pool_abort"), udf(aborting, BooleanType()))
    case("pool abort", big, f"DELETE FROM {tbig} WHERE {fn}(id)", big_model, fails=True)
    pool["aborted"] = workers()

    model = Counter({k: v for k, v in merged.items() if k[0] is None or k[0] % 3 != 1})
    case("pool after abort", p, f"DELETE FROM {tp} WHERE id % 3 = 1", model)
    pool["after"] = workers()

    # Nanoseconds Spark cannot see (its rows hold microseconds): the statement's rows would
    # not be the stored ones, so it must fail, changing nothing.
    fine, tfine = timestamped("pool-ns-fine", "ns", [10_001, 20_000])
    case(
        "ns sub-microsecond",
        fine,
        f"DELETE FROM {tfine} WHERE id = 2",
        Counter({(1, "a"): 1, (2, "b"): 1}),
        fails=True,
    )
    cases["ns sub-microsecond"]["stamps"] = stamps(fine)
    return pool


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import persistshard as ps

    spark = ps.configure_spark(
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.catalogImplementation", "in-memory")
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    result = collect(spark, Path(sys.argv[1]))
    spark.stop()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
