"""Scaling: Spark write and snapshot read + sum at growing sizes, persistshard vs parquet.

The same table as the Spark benchmark (`benchmarks.spark_bench.make_frame`), one cached
DataFrame per size with one partition per 1M rows (at least 2), so tasks stay the same size
and the growth shown is the growth of the work, not of one task's memory. At each size the
contenders alternate as in every benchmark; the pass-through Python source runs too, as the
ceiling of the Python path. The plot shows throughput (rows per second) against size: flat
lines are linear cost.
"""

from __future__ import annotations

import tempfile
from typing import Any

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


def run(
    sizes: tuple[int, ...] = (1_000_000, 4_000_000, 16_000_000), rounds: int = 3
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    spark = a.spark_session()
    missing = a.persistshard_available(spark)
    ours = missing is None
    names = [PARQUET, PASS] + ([OURS] if ours else [])
    measurements = []
    write_tput: dict[str, list[float | None]] = {f"{n} write": [] for n in names}
    read_tput: dict[str, list[float | None]] = {f"{n} read": [] for n in names}
    stored: dict[str, list[int]] = {n: [] for n in names}
    for rows in sizes:
        df = make_frame(spark, rows, partitions=max(2, rows // 1_000_000))
        expected = df.agg(F.sum("value")).collect()[0][0]
        with tempfile.TemporaryDirectory(prefix="psbench-scaling-") as tmp:
            writes = alternate(write_contenders(df, tmp, ours), rounds)
            readers, sums, bytes_ = read_contenders(spark, df, tmp, ours)
            reads = alternate(readers, rounds)
            check_sums(sums, expected)
        df.unpersist()
        n = human(rows)
        for op, times, tput in (("write", writes, write_tput), ("read + sum", reads, read_tput)):
            what = f"{op} {n} rows"
            for anchor in (PARQUET, PASS):
                if ours:
                    measurements.append(measurement(what, OURS, anchor, times[OURS], times[anchor]))
                else:
                    measurements.append(skipped(what, OURS, anchor, missing or ""))
            for name in names:
                t = sorted(times[name])[len(times[name]) // 2]
                tput[f"{name} {op.split()[0]}"].append(rows / t / 1e6)
        for name in names:
            stored[name].append(bytes_[name])
    x = list(sizes)
    return {
        "title": "Scaling: Spark write and snapshot read against size",
        "description": (
            f"Sizes {', '.join(human(s) for s in sizes)} rows of the Spark benchmark's table "
            "(id, name, value), one partition per 1M rows (at least 2), local[2]. Write: ours "
            "appends into a new shard; parquet and the pass-through source write a new "
            "directory. Read: snapshot read + sum(value). Ratios are ours / parquet and ours "
            "/ the pass-through; the plots show how each one's throughput changes with size "
            "(flat is linear)."
        ),
        "params": {"sizes": list(sizes), "master": "local[2]", "rows_per_partition": 1_000_000},
        "measurements": measurements,
        "series": [
            {
                "id": "write_throughput",
                "title": "Spark write throughput against size",
                "x_label": "rows",
                "y_label": "million rows per second (median)",
                "x": x,
                "lines": write_tput,
                "log_x": True,
                "x_tick_labels": [human(s) for s in sizes],
            },
            {
                "id": "read_throughput",
                "title": "Spark snapshot read + sum throughput against size",
                "x_label": "rows",
                "y_label": "million rows per second (median)",
                "x": x,
                "lines": read_tput,
                "log_x": True,
                "x_tick_labels": [human(s) for s in sizes],
            },
        ],
        "notes": [
            "bytes stored: "
            + "; ".join(
                f"{name} " + ", ".join(f"{b / 2**20:.0f} MiB" for b in bs)
                for name, bs in stored.items()
            )
        ],
        "extra": {"bytes": stored},
    }
