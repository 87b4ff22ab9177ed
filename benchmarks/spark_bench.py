"""Spark: persistshard's append and snapshot read against Spark's parquet and the pass-through
Python source (issue 5).

Data: ``rows`` rows of (id BIGINT, name STRING of 16 characters, value DOUBLE), generated
once with `spark.range`, cached and counted before any timing; local[2]. Every round writes
each contender to a fresh directory (ours: ``mode("append")`` into a new shard; the anchors
overwrite), then the read rounds compute ``sum(value)`` over the table each contender wrote
once. The sums are checked against each other: a fast wrong answer does not count.

Targets (issues 5 and 14): our append at most 1.2x the pass-through's time, our snapshot
read at most 1.3x the pass-through's. The pass-through source (`benchmarks.anchors.PassThroughIPC`)
writes Arrow IPC with no commit protocol and reads with no consolidation: the ceiling of the
Python path.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from benchmarks import anchors as a
from benchmarks.harness import alternate, measurement, skipped

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Snapshot read + sum against the pass-through at 2M rows (issue 14; 16M rows:
#: `benchmarks.scaling_bench`).
TARGET = 1.1
#: Append against the pass-through at 2M rows (issue 14; 16M rows: `benchmarks.scaling_bench`).
APPEND_TARGET = 1.2
OURS = "persistshard"
PARQUET = "Spark parquet"
PASS = "pass-through IPC"


def make_frame(spark: SparkSession, rows: int, partitions: int = 2) -> DataFrame:
    """The benchmark table, cached and materialized: id, name (16 hex characters), value."""
    from pyspark.sql import functions as F

    df = spark.range(0, rows, 1, partitions).select(
        F.col("id"),
        F.substring(F.sha2(F.col("id").cast("string"), 256), 1, 16).alias("name"),
        F.rand(seed=7).alias("value"),
    )
    df = df.cache()
    df.count()
    return df


def human(rows: int) -> str:
    if rows >= 1_000_000 and rows % 100_000 == 0:
        return f"{rows / 1_000_000:g}M"
    if rows >= 1_000 and rows % 1_000 == 0:
        return f"{rows // 1_000}k"
    return str(rows)


def timed(fn: Callable[[], Any], cleanup: Callable[[], Any] | None = None) -> float:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if cleanup is not None:
        cleanup()
    return elapsed


def write_contenders(df: DataFrame, tmp: str, ours: bool) -> dict[str, Callable[[], float | None]]:
    """Each contender writes ``df`` to a fresh directory per round (removed after timing)."""
    counter = itertools.count()

    def contender(write: Callable[[DataFrame, str], None]) -> Callable[[], float]:
        def go() -> float:
            path = f"{tmp}/w{next(counter)}"
            return timed(lambda: write(df, path), lambda: shutil.rmtree(path, True))

        return go

    out: dict[str, Callable[[], float | None]] = {
        PARQUET: contender(a.parquet_write),
        PASS: contender(a.passthrough_write),
    }
    if ours:
        out[OURS] = contender(a.persistshard_append)
    return out


def read_contenders(
    spark: SparkSession, df: DataFrame, tmp: str, ours: bool
) -> tuple[dict[str, Callable[[], float | None]], dict[str, float], dict[str, int]]:
    """Each contender's table, written once (untimed); per round, a fresh read of it and
    sum(value). Returns the contenders, the sums they compute (filled in as they run) and
    the bytes each stored."""
    sums: dict[str, float] = {}
    stored: dict[str, int] = {}
    plan: dict[str, tuple[Callable[[DataFrame, str], None], Callable[[Any, str], Any]]] = {
        PARQUET: (a.parquet_write, a.parquet_sum),
        PASS: (a.passthrough_write, a.passthrough_sum),
    }
    if ours:
        plan[OURS] = (a.persistshard_append, a.persistshard_sum)
    out: dict[str, Callable[[], float | None]] = {}
    for i, (name, (write, read)) in enumerate(plan.items()):
        path = f"{tmp}/r{i}"
        write(df, path)
        stored[name] = a.directory_bytes(path)

        def go(read: Callable[[Any, str], Any] = read, path: str = path, name: str = name) -> None:
            sums[name] = read(spark, path)

        out[name] = go
    return out, sums, stored


def check_sums(sums: dict[str, float], expected: float) -> None:
    for name, value in sums.items():
        if value is None or not math.isclose(value, expected, rel_tol=1e-9):
            raise AssertionError(f"{name} computed sum(value) = {value}, expected {expected}")


def run(rows: int = 2_000_000, rounds: int = 5) -> dict[str, Any]:
    from pyspark.sql import functions as F

    spark = a.spark_session()
    missing = a.persistshard_available(spark)
    ours = missing is None
    n = human(rows)
    df = make_frame(spark, rows)
    expected = df.agg(F.sum("value")).collect()[0][0]
    with tempfile.TemporaryDirectory(prefix="psbench-spark-") as tmp:
        writes = alternate(write_contenders(df, tmp, ours), rounds)
        readers, sums, stored = read_contenders(spark, df, tmp, ours)
        reads = alternate(readers, rounds)
        check_sums(sums, expected)
    df.unpersist()

    what_w, what_r = f"append {n} rows", f"snapshot read {n} rows + sum(value)"
    measurements = []
    for what, times in ((what_w, writes), (what_r, reads)):
        pass_target = APPEND_TARGET if what == what_w else TARGET
        for anchor, target in ((PASS, pass_target), (PARQUET, None)):
            if ours:
                measurements.append(
                    measurement(what, OURS, anchor, times[OURS], times[anchor], target=target)
                )
            else:
                measurements.append(skipped(what, OURS, anchor, missing or "", target=target))
        measurements.append(
            measurement(
                what,
                PASS,
                PARQUET,
                times[PASS],
                times[PARQUET],
                note="the cost of the Python data source path itself, for reference",
            )
        )
    if ours:
        measurements.append(
            measurement(
                f"bytes stored, {n} rows",
                OURS,
                PARQUET,
                [stored[OURS]],
                [stored[PARQUET]],
                unit="bytes",
                extra={"bytes": stored},
            )
        )
    return {
        "title": "Spark data source: append and snapshot read",
        "description": (
            f"{n} rows (id BIGINT, name STRING of 16 characters, value DOUBLE), cached, "
            'local[2]. Append: `df.write.format("persistshard").mode("append").save(path)` '
            "into a new shard each round. Snapshot read: "
            '`spark.read.format("persistshard").load(path).agg(sum("value"))`. Anchors: '
            "Spark's native parquet, and a minimal pass-through Python source (Arrow IPC zstd, "
            "one file per task, no commit protocol, no consolidation: the ceiling of the "
            "Python path). Targets: append at most 1.2x the pass-through's time, read 1.3x."
        ),
        "params": {"rows": rows, "master": "local[2]", "partitions": 2},
        "measurements": measurements,
        "notes": [
            f"bytes stored: {', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in stored.items())}"
        ],
    }
