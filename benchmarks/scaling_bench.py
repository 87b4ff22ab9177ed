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

Task size (issue 27): users do not size their partitions for us. The same table at a fixed
total (``task_total`` rows) is appended in partitions of each of ``task_rows`` rows, ours and
the pass-through alternating, each round into a fresh directory: a task past a third of its
``memory_budget`` (85 MiB of the default 256 MiB, about 1.6M rows of this table) sorts
externally, spilling sorted runs (`persistshard.core.write.external`). The quick size shrinks
the budget with the tasks (``task_budget``) so that its large tasks spill too.

Targets: append at most 1.3x the pass-through at 16M rows (issue 14; 2M rows is the Spark
benchmark's row) and at every task size (issue 27); the other ratios are figures. The plots
show throughput (rows per second) against size, one per operation with the three
contenders (flat lines are linear cost), and the append's against rows per task.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
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
#: Append target against the pass-through at every task size (issue 27).
APPEND_TARGET_TASKS = 1.3
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


def _fresh_write(
    write: Callable[[DataFrame, str], None], df: DataFrame, tmp: str, counter: Any
) -> Callable[[], float]:
    """A contender: ``write(df)`` into a fresh directory under ``tmp``, timed, then removed."""

    def go() -> float:
        path = f"{tmp}/t{next(counter)}"
        start = time.perf_counter()
        write(df, path)
        elapsed = time.perf_counter() - start
        shutil.rmtree(path, True)
        return elapsed

    return go


def task_size_appends(
    spark: Any,
    total: int,
    task_rows: tuple[int, ...],
    budget: int | None,
    rounds: int,
    ours: bool,
    missing: str | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Append ``total`` rows in partitions of each of ``task_rows`` rows, ours against the
    pass-through (alternating rounds, a fresh directory each); the measurements and a
    throughput series against task size."""
    measurements = []
    tput: dict[str, list[float | None]] = {PASS: [], OURS: []}

    def ours_append(df: DataFrame, path: str) -> None:
        writer = df.write.format("persistshard").mode("append")
        if budget is not None:
            writer = writer.option("memory_budget", str(budget))
        writer.save(path)

    for per_task in task_rows:
        df = make_frame(spark, total, partitions=max(1, total // per_task))
        counter = itertools.count()
        with tempfile.TemporaryDirectory(prefix="psbench-tasks-") as tmp:
            plan: dict[str, Callable[[], float | None]] = {
                PASS: _fresh_write(a.passthrough_write, df, tmp, counter)
            }
            if ours:
                plan[OURS] = _fresh_write(ours_append, df, tmp, counter)
            times = alternate(plan, rounds)
        df.unpersist()
        what = f"append {human(total)} rows, {human(per_task)}-row tasks"
        if ours:
            measurements.append(
                measurement(what, OURS, PASS, times[OURS], times[PASS], target=APPEND_TARGET_TASKS)
            )
        else:
            measurements.append(
                skipped(what, OURS, PASS, missing or "", target=APPEND_TARGET_TASKS)
            )
        for name, ts in times.items():
            tput[name].append(total / sorted(ts)[len(ts) // 2] / 1e6)
    series = {
        "id": "tasks_write_throughput",
        "title": f"Spark append of {human(total)} rows: throughput against rows per task",
        "x_label": "rows per task",
        "y_label": "million rows per second (median)",
        "x": list(task_rows),
        "lines": {k: v for k, v in tput.items() if v},
        "log_x": True,
        "x_tick_labels": [human(t) for t in task_rows],
    }
    return measurements, series


def run(
    sizes: tuple[int, ...] = (1_000_000, 4_000_000, 16_000_000),
    rounds: int = 3,
    task_total: int = 12_000_000,
    task_rows: tuple[int, ...] = (1_000_000, 3_000_000, 6_000_000),
    task_budget: int | None = None,
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    spark = a.spark_session()
    missing = a.persistshard_available(spark)
    ours = missing is None
    task_measurements, task_series = task_size_appends(
        spark, task_total, task_rows, task_budget, rounds, ours, missing
    )
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
    series.append(task_series)
    measurements.extend(task_measurements)
    budget_text = (
        "the default memory_budget (256 MiB)"
        if task_budget is None
        else f"memory_budget {task_budget / 2**20:g} MiB"
    )
    return {
        "title": "Scaling: Spark append, snapshot read and overwrite against size and task size",
        "description": (
            f"Sizes {', '.join(human(s) for s in sizes)} rows of the Spark benchmark's table "
            "(id, name, value), one partition per 1M rows (at least 2), local[2]; three "
            "contenders: persistshard, the pass-through Python source (the ceiling of the "
            "Python path) and Spark parquet. Append: ours appends into a new shard; the others "
            "write a new directory. Read: snapshot read + sum(value). Overwrite: each table, "
            'written once, is overwritten through `mode("overwrite")` with 1% of its rows '
            "changed each round (ours writes only the difference). Ratios are ours / the "
            "pass-through and ours / parquet; the plots show each one's throughput against "
            "size (flat is linear). Task size: "
            f"{human(task_total)} rows appended in tasks of "
            f"{', '.join(human(t) for t in task_rows)} rows, ours (with {budget_text}) against "
            "the pass-through, alternating. See `benchmarks/scaling_bench.py`."
        ),
        "params": {
            "sizes": list(sizes),
            "master": "local[2]",
            "rows_per_partition": 1_000_000,
            "task_total": task_total,
            "task_rows": list(task_rows),
            "task_budget": task_budget,
        },
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
