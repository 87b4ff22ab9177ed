"""The JVM companion (issue 38): snapshot reads through the companion's columnar scan against
Spark's own parquet and against the Python source, medians of the same run.

- Read + sum: ``rows_sum`` rows of (id BIGINT, name STRING of 16 characters, value DOUBLE),
  ``spark.read...load(path).agg(sum("value"))``.
- One column of five: ``rows_five`` rows of five columns (id, name, value, a second double,
  a second string), ``sum(value)``: only one column is decoded by the companion and by parquet.

The session is built with ``ps.configure_spark`` (the companion jar on its classpath: the
format ``persistshard`` is the companion); the Python source is registered again under
``persistshard_python`` to be measured in the same session. Every contender's sum is checked.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from benchmarks.harness import alternate, measurement
from benchmarks.spark_bench import human

OURS = "persistshard (JVM companion)"
PARQUET = "Spark parquet"
PYTHON = "persistshard (Python source)"
#: Issue 38: reads with the companion at most 1.5x parquet's time.
TARGET = 1.5


def session() -> Any:
    """The benchmark's session: the benchmarks' settings plus the companion."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import persistshard as ps
    from persistshard.datasource.source import PersistShardDataSource

    builder = ps.configure_spark(
        SparkSession.builder.master("local[2]")
        .appName("persistshard-companion-benchmark")
        .config("spark.driver.memory", "4g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    class PythonSource(PersistShardDataSource):
        @classmethod
        def name(cls) -> str:
            return "persistshard_python"

    spark.dataSource.register(PythonSource)
    return spark


def frame(spark: Any, rows: int, wide: bool) -> Any:
    from pyspark.sql import functions as F

    cols = [
        F.col("id"),
        F.substring(F.sha2(F.col("id").cast("string"), 256), 1, 16).alias("name"),
        (F.col("id") * 0.5).alias("value"),
    ]
    if wide:
        cols += [
            (F.col("id") * 1.25).alias("other"),
            F.substring(F.sha2(F.col("id").cast("string"), 256), 17, 16).alias("label"),
        ]
    df = spark.range(rows, numPartitions=max(2, rows // 1_000_000)).select(*cols)
    return df.cache().localCheckpoint()


def contenders(spark: Any, df: Any, tmp: str, sums: dict[str, float]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    parquet, ours = f"{tmp}/parquet", f"{tmp}/shard"
    df.write.mode("overwrite").parquet(parquet)
    df.write.format("persistshard").mode("append").save(ours)

    def reader(name: str, load: Callable[[], Any]) -> Callable[[], None]:
        def go() -> None:
            sums[name] = load().agg(F.sum("value")).collect()[0][0]

        return go

    return {
        OURS: reader(OURS, lambda: spark.read.format("persistshard").load(ours)),
        PARQUET: reader(PARQUET, lambda: spark.read.parquet(parquet)),
        PYTHON: reader(PYTHON, lambda: spark.read.format("persistshard_python").load(ours)),
    }


def run(rows_sum: int = 16_000_000, rows_five: int = 2_000_000, rounds: int = 3) -> dict[str, Any]:
    spark = session()
    measurements = []
    notes = []
    for rows, wide in ((rows_sum, False), (rows_five, True)):
        n = human(rows)
        what = f"read + sum {n} rows" if not wide else f"sum of one column of five, {n} rows"
        df = frame(spark, rows, wide)
        expected = rows * (rows - 1) / 2 * 0.5
        sums: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="psbench-companion-") as tmp:
            times = alternate(contenders(spark, df, tmp, sums), rounds)
        for name, value in sums.items():
            if value is None or not math.isclose(value, expected, rel_tol=1e-9):
                raise AssertionError(f"{name} computed sum(value) = {value}, expected {expected}")
        df.unpersist()
        measurements.append(
            measurement(what, OURS, PARQUET, times[OURS], times[PARQUET], target=TARGET)
        )
        measurements.append(measurement(what, OURS, PYTHON, times[OURS], times[PYTHON]))
        notes.append(
            f"{what}: medians "
            + ", ".join(f"{k} {sorted(v)[len(v) // 2]:.3f} s" for k, v in times.items())
        )
    spark.stop()
    return {
        "title": "JVM companion: columnar snapshot reads",
        "description": (
            "A session built with `ps.configure_spark` (the companion jar on the classpath), "
            "local[2]. Read + sum: rows of (id BIGINT, name STRING of 16 characters, value "
            'DOUBLE), appended once, `spark.read.format(...).load(path).agg(sum("value"))`. '
            "One column of five: the same plus a second double and a second string, "
            '`sum(value)`. Contenders: the companion (`format("persistshard")`), Spark\'s '
            "parquet, and the Python source on the same shard (registered again as "
            "`persistshard_python`). Target (issue 38): at most 1.5x parquet."
        ),
        "params": {"rows_sum": rows_sum, "rows_five": rows_five, "master": "local[2]"},
        "measurements": measurements,
        "notes": notes,
    }
