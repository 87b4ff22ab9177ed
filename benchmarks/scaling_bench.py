"""Scaling: Spark append, snapshot read + sum and overwrite at growing sizes, three contenders.

The same table as the Spark benchmark (`benchmarks.spark_bench.make_frame`), one cached
DataFrame per size with one partition per 1M rows (at least 2), so tasks stay the same size
and the growth shown is the growth of the work, not of one task's memory. Contenders:
persistshard, the pass-through Python source (`benchmarks.anchors.PassThroughIPC`, the
ceiling of the Python path) and Spark's native parquet. At each size they alternate, as in
every benchmark:

- append: each round writes the DataFrame into a fresh directory (ours: ``mode("append")``
  into a new shard; the others overwrite a new directory);
- snapshot read + sum(value) of the table each contender wrote once (sums checked);
- overwrite: each contender's table, written once with the DataFrame (untimed), is
  overwritten every round through the public interface (ours:
  ``df.write.format("persistshard").mode("overwrite")``, a self-correcting overwrite that
  writes only the difference), alternately with a copy in which 1% of the rows (``id % 100
  == 0``) have a changed value and with the original, so every round changes 1% of the rows.

Targets: append at most 1.3x the pass-through at 16M rows (issue 14; 2M rows is the Spark
benchmark's row); the other ratios are figures. The plots show throughput (rows per second)
against size, one per operation with the three contenders: flat lines are linear cost.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from benchmarks import anchors as a
from benchmarks.harness import alternate, measurement, skipped
from benchmarks.spark_bench import (
    OURS,
    PARQUET,
    PASS,
    check_sums,
    human,
    make_frame,
    read_contenders,
    write_contenders,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Append target against the pass-through at the largest size (issue 14: 16M rows).
APPEND_TARGET_LARGEST = 1.3
#: Snapshot read + sum target against the pass-through at the largest size (issue 14: 16M rows).
READ_TARGET_LARGEST = 1.3
CHANGED_EVERY = 100  # ids divisible by this change in the overwrite rounds (1%)


def _ours_overwrite(df: DataFrame, path: str) -> None:
    df.write.format("persistshard").mode("overwrite").save(path)


def _passthrough_overwrite(df: DataFrame, path: str) -> None:
    a.passthrough_write(df, path)  # it always replaces the directory's files


def overwrite_contenders(
    base: DataFrame, changed: DataFrame, tmp: str, ours: bool
) -> tuple[dict[str, Callable[[], float | None]], Callable[[], None]]:
    """Each contender's table written once with ``base`` (untimed); each call of a contender
    overwrites it with the other of ``changed`` / ``base`` (1% of the rows differ), timed.
    Returns the contenders and a cleanup."""
    plan: dict[str, Callable[[DataFrame, str], None]] = {
        PARQUET: a.parquet_write,
        PASS: _passthrough_overwrite,
    }
    if ours:
        plan[OURS] = _ours_overwrite
    out: dict[str, Callable[[], float | None]] = {}
    paths = []
    for i, (name, write) in enumerate(plan.items()):
        path = f"{tmp}/o{i}"
        paths.append(path)
        (a.persistshard_append if name == OURS else write)(base, path)
        frames = itertools.cycle([changed, base])

        def go(
            write: Callable[[DataFrame, str], None] = write,
            path: str = path,
            frames: Any = frames,
        ) -> None:
            write(next(frames), path)

        out[name] = go

    def cleanup() -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    return out, cleanup


def run(
    sizes: tuple[int, ...] = (1_000_000, 4_000_000, 16_000_000), rounds: int = 3
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    spark = a.spark_session()
    missing = a.persistshard_available(spark)
    ours = missing is None
    names = [PARQUET, PASS] + ([OURS] if ours else [])
    ops = ("append", "read + sum", "overwrite 1%")
    measurements = []
    tput: dict[str, dict[str, list[float | None]]] = {op: {n: [] for n in names} for op in ops}
    stored: dict[str, list[int]] = {n: [] for n in names}
    for rows in sizes:
        df = make_frame(spark, rows, partitions=max(2, rows // 1_000_000))
        expected = df.agg(F.sum("value")).collect()[0][0]
        changed = df.select(
            "id",
            "name",
            F.when(F.col("id") % CHANGED_EVERY == 0, F.col("value") + 1.0)
            .otherwise(F.col("value"))
            .alias("value"),
        ).cache()
        changed.count()
        times: dict[str, dict[str, list[float]]] = {}
        with tempfile.TemporaryDirectory(prefix="psbench-scaling-") as tmp:
            times["append"] = alternate(write_contenders(df, tmp, ours), rounds)
            readers, sums, bytes_ = read_contenders(spark, df, tmp, ours)
            times["read + sum"] = alternate(readers, rounds)
            check_sums(sums, expected)
            overwriters, cleanup = overwrite_contenders(df, changed, tmp, ours)
            times["overwrite 1%"] = alternate(overwriters, rounds)
            cleanup()
        changed.unpersist()
        df.unpersist()
        n = human(rows)
        for op in ops:
            what = f"{op} {n} rows"
            for anchor in (PASS, PARQUET):
                largest = {"append": APPEND_TARGET_LARGEST, "read + sum": READ_TARGET_LARGEST}
                target = largest.get(op) if anchor == PASS and rows == max(sizes) else None
                if ours:
                    measurements.append(
                        measurement(
                            what, OURS, anchor, times[op][OURS], times[op][anchor], target=target
                        )
                    )
                else:
                    measurements.append(skipped(what, OURS, anchor, missing or "", target=target))
            for name in names:
                t = sorted(times[op][name])[len(times[op][name]) // 2]
                tput[op][name].append(rows / t / 1e6)
        for name in names:
            stored[name].append(bytes_[name])
    x = list(sizes)
    series = [
        {
            "id": f"{sid}_throughput",
            "title": f"Spark {title} throughput against size",
            "x_label": "rows",
            "y_label": "million rows per second (median)",
            "x": x,
            "lines": tput[op],
            "log_x": True,
            "x_tick_labels": [human(s) for s in sizes],
        }
        for op, sid, title in (
            ("append", "write", "append (write)"),
            ("read + sum", "read", "snapshot read + sum"),
            ("overwrite 1%", "overwrite", "overwrite (1% of rows changed)"),
        )
    ]
    return {
        "title": "Scaling: Spark append, snapshot read and overwrite against size",
        "description": (
            f"Sizes {', '.join(human(s) for s in sizes)} rows of the Spark benchmark's table "
            "(id, name, value), one partition per 1M rows (at least 2), local[2]; three "
            "contenders: persistshard, the pass-through Python source (the ceiling of the "
            "Python path) and Spark parquet. Append: ours appends into a new shard; the others "
            "write a new directory. Read: snapshot read + sum(value). Overwrite: each table, "
            'written once, is overwritten through `mode("overwrite")` with 1% of its rows '
            "changed each round (ours writes only the difference). Ratios are ours / the "
            "pass-through and ours / parquet; the plots show each one's throughput against "
            "size (flat is linear). See `benchmarks/scaling_bench.py`."
        ),
        "params": {"sizes": list(sizes), "master": "local[2]", "rows_per_partition": 1_000_000},
        "measurements": measurements,
        "series": series,
        "notes": [
            "bytes stored: "
            + "; ".join(
                f"{name} " + ", ".join(f"{b / 2**20:.0f} MiB" for b in bs)
                for name, bs in stored.items()
            )
        ],
        "extra": {"bytes": stored},
    }
