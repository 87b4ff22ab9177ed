"""Row-level DELETE through the JVM companion (issue 38): ``DELETE FROM t WHERE id % 100 = r``
on a table of ``rows`` rows (id BIGINT, name STRING of 16 characters, value DOUBLE), 1% of
its rows per statement, a different 1% each round.

- Bytes: what the DELETE's commit added (its ``bytes_added`` in the shard's history: the
  retractions' parts) against the bytes the table's parts held before it. Target (issue 38):
  at most 3% of the table for a 1% delete.
- Time: the DELETE against a query that reads and selects the same rows
  (``SELECT count(*) FROM t WHERE id % 100 = r``), in the same session: what writing and
  committing the retractions adds to finding them.

The table is created with a column list, so its scans are the companion's columnar ones.
Every DELETE is checked: the rows it removed are gone, the others are there.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from benchmarks.companion_bench import frame, session
from benchmarks.harness import measurement
from benchmarks.spark_bench import human

DELETE = "DELETE FROM (JVM companion)"
SELECT = "SELECT count(*) of the same rows"
RETRACTIONS = "bytes the DELETE wrote"
TABLE = "bytes of the table"
#: Issue 38: a DELETE of 1% of the rows writes at most 3% of the table's bytes.
TARGET = 0.03


def live_bytes(location: str) -> int:
    """The bytes of the parts the shard's state holds, from its history's commit metrics."""
    import persistshard as ps

    total = 0
    for entry in ps.open_shard(location).history():
        metrics = entry.get("metrics") or {}
        total += int(metrics.get("bytes_added", 0)) - int(metrics.get("bytes_removed", 0))
    return total


def run(rows: int = 4_000_000, rounds: int = 3) -> dict[str, Any]:
    import persistshard as ps

    spark = session()
    n = human(rows)
    deletes: list[float] = []
    selects: list[float] = []
    written: list[float] = []
    tables: list[float] = []
    with tempfile.TemporaryDirectory(prefix="psbench-rowlevel-") as tmp:
        location = f"{tmp}/shard"
        df = frame(spark, rows, wide=False)
        df.write.format("persistshard").mode("append").save(location)
        df.unpersist()
        spark.sql(
            "CREATE TABLE rowlevel_bench (id BIGINT, name STRING, value DOUBLE) "
            f"USING persistshard LOCATION '{location}'"
        )
        remaining = rows
        for r in range(rounds + 1):  # round 0 warms up
            where = f"id % 100 = {r}"
            began = time.perf_counter()
            found = spark.sql(f"SELECT count(*) FROM rowlevel_bench WHERE {where}").collect()[0][0]
            selected = time.perf_counter() - began
            before = live_bytes(location)
            upper = ps.open_shard(location).upper
            began = time.perf_counter()
            spark.sql(f"DELETE FROM rowlevel_bench WHERE {where}").collect()
            deleted = time.perf_counter() - began
            shard = ps.open_shard(location)
            commit = next(
                e for e in reversed(shard.history()) if f"upper {upper} -> " in e["summary"]
            )
            remaining -= found
            left = spark.sql(f"SELECT count(*) FROM rowlevel_bench WHERE {where}").collect()[0][0]
            total = spark.sql("SELECT count(*) FROM rowlevel_bench").collect()[0][0]
            if found != rows // 100 or left != 0 or total != remaining:
                raise AssertionError(
                    f"DELETE {where}: found {found}, left {left}, table {total} (expected "
                    f"{rows // 100}, 0, {remaining})"
                )
            if r == 0:
                continue
            deletes.append(deleted)
            selects.append(selected)
            written.append(float(commit["metrics"]["bytes_added"]))
            tables.append(float(before))
        spark.sql("DROP TABLE rowlevel_bench")
    spark.stop()
    what = f"DELETE of 1% of {n} rows"
    return {
        "title": "JVM companion: row-level DELETE",
        "description": (
            "A session built with `ps.configure_spark`, local[2]. A table of rows (id BIGINT, "
            "name STRING of 16 characters, value DOUBLE) appended once, created with a column "
            "list and LOCATION; each round `DELETE FROM t WHERE id % 100 = r` removes 1% of "
            "the rows (a different 1% per round). Bytes: the DELETE's commit (`bytes_added` "
            "in the shard's history: its retractions) against the table's live bytes before "
            "it; target (issue 38): at most 3%. Time: the DELETE against `SELECT count(*)` of "
            "the same rows, which finds them without writing."
        ),
        "params": {"rows": rows, "master": "local[2]"},
        "measurements": [
            measurement(
                f"{what}: bytes written",
                RETRACTIONS,
                TABLE,
                written,
                tables,
                target=TARGET,
                unit="B",
            ),
            measurement(f"{what}: time", DELETE, SELECT, deletes, selects),
        ],
        "notes": [
            f"{what}: medians DELETE {sorted(deletes)[len(deletes) // 2]:.2f} s, SELECT "
            f"{sorted(selects)[len(selects) // 2]:.2f} s; wrote "
            f"{sorted(written)[len(written) // 2]:,.0f} B of a "
            f"{sorted(tables)[len(tables) // 2]:,.0f} B table"
        ],
    }
