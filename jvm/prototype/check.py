"""Build the JVM companion twice and check what it is for, in a Spark session of its own.

Usage: ``python jvm/prototype/check.py [--without]`` with the Python that has pyspark and
persistshard (installed, or on ``PYTHONPATH`` so Spark's workers find
``pyspark_persistshard``). Needs ``javac`` (a JDK 17+). Exits non-zero on the first failed
check; prints one line per check.

Not a pytest test on purpose (docs/design.md, "JVM companion"): it needs a JDK, which
the README's machine ("Java 17") need not have, and a test suite must not skip; it also needs
its own JVM, since ``spark.jars`` only takes effect when a session's JVM starts.

``--without`` runs the same statements without the jar (nothing is built) and prints what
each one gives instead of failing: the pure-Python results the companion is compared with.

Checks, each against a pure-Python failure that SPARK-HAZARDS.md records on Spark 4.3:
- the jar is byte-for-byte reproducible (two builds, same bytes);
- the format name resolves to the companion when the jar is on the classpath;
- a catalog table's OPTIONS reach its reads (``OPTIONS (as_of '0')`` pins the snapshot);
- ``INSERT INTO t SELECT * FROM u`` and ``INSERT OVERWRITE t SELECT ... FROM u`` change t, never u;
- with filter pushdown on, an unfiltered action after a filtered ``explain`` (one DataFrame,
  one view) and a union of two filtered scans return every row they should.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMPANION = "persistshard.companion.CompanionProvider"


def build(out: Path) -> bytes:
    subprocess.run(["bash", str(HERE / "build.sh"), sys.executable, str(out)], check=True)
    return out.read_bytes()


WITHOUT = "--without" in sys.argv[1:]


def check(what: str, got: Any, expected: Any) -> None:
    if WITHOUT:
        print(f"{'same' if got == expected else 'DIFF'} {what}: {got!r}")
        return
    if got != expected:
        raise SystemExit(f"FAIL {what}: got {got!r}, expected {expected!r}")
    print(f"ok   {what}")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="persistshard-companion-"))
    jar = work / "a.jar"
    if not WITHOUT:
        check("reproducible build", build(jar) == build(work / "b.jar"), True)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import persistshard as ps

    builder = SparkSession.builder.master("local[2]")
    if not WITHOUT:
        builder = builder.config("spark.jars", str(jar))
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    conf = spark._jsparkSession.sessionState().conf()
    jvm: Any = spark._jvm
    lookup = jvm.org.apache.spark.sql.execution.datasources.DataSource
    check(
        "format resolves to the companion",
        lookup.lookupDataSource("persistshard", conf).getName(),
        COMPANION,
    )

    import pyarrow as pa

    def count(sql: str) -> int:
        row = spark.sql(sql).first()
        return -1 if row is None else int(row[0])

    pinned = str(work / "pinned")
    shard = ps.open_shard(pinned)
    for t in (0, 1):
        first = list(range(5 * t, 5 * t + 5))
        rows = pa.table({"id": first, "_time": [t] * 5, "_diff": [1] * 5})
        shard.append(rows, new_upper=t + 1)
    spark.sql(f"CREATE TABLE pinned USING persistshard LOCATION '{pinned}' OPTIONS (as_of '0')")
    check(
        "table OPTIONS reach reads (as_of '0')",
        count("SELECT count(*) FROM pinned"),
        5,
    )

    for name in ("t", "u"):
        spark.sql(
            f"CREATE TABLE {name} USING persistshard LOCATION '{work / name}' "
            "OPTIONS (columns 'id BIGINT, item STRING')"
        )
    spark.sql("INSERT INTO t VALUES (1, 'apple')")
    spark.sql("INSERT INTO u VALUES (5, 'fig'), (6, 'kiwi')")

    def ids(table: str) -> list[int]:
        return sorted(r.id for r in spark.sql(f"SELECT id FROM {table}").collect())

    spark.sql("INSERT INTO t SELECT * FROM u")
    check("INSERT INTO t SELECT * FROM u: t", ids("t"), [1, 5, 6])
    check("INSERT INTO t SELECT * FROM u: u unchanged", ids("u"), [5, 6])
    spark.sql("INSERT OVERWRITE t SELECT * FROM u WHERE id > 100")
    check("INSERT OVERWRITE t SELECT ... FROM u: t", ids("t"), [])
    check("INSERT OVERWRITE t SELECT ... FROM u: u unchanged", ids("u"), [5, 6])

    path = str(work / "pushed")
    spark.range(100).selectExpr("id", "CAST(id AS STRING) AS item").write.format(
        "persistshard"
    ).mode("append").save(path)
    df = spark.read.format("persistshard").load(path)
    df.filter("id < 10")._jdf.queryExecution().executedPlan()  # plans (pushes) like explain()
    check("count after a filtered plan of the same DataFrame", df.count(), 100)
    both = df.filter("id = 1").union(df.filter("id = 2")).collect()
    check("union of two filtered scans", sorted(r.id for r in both), [1, 2])
    df.createOrReplaceTempView("pv")
    spark.sql("SELECT * FROM pv WHERE id = 7")._jdf.queryExecution().executedPlan()
    check("view: count after a filtered plan", count("SELECT count(*) FROM pv"), 100)
    spark.stop()
    print("all checks passed")


if __name__ == "__main__":
    main()
