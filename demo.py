"""The main job: a Spark session that writes a shard, time-travels, reads changes and runs SQL.

    python -m persistshard.demo [DIRECTORY]

Everything goes to local files under DIRECTORY (a fresh temporary directory by default), and
every step prints what it does and what it saw.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _say(text: str) -> None:
    """Print one of the demo's own lines (flushed, so Spark's output never interleaves)."""
    print(text, flush=True)


def _show(title: str, df: DataFrame) -> None:
    rows = df.orderBy(*df.columns).collect()  # run the job before printing anything
    lines = [f"\n== {title} ({_plural(len(rows), 'row')})"]
    lines += ["   " + ", ".join(f"{k}={v}" for k, v in row.asDict().items()) for row in rows]
    _say("\n".join(lines))


def main(argv: list[str]) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import persistshard as ps

    root = argv[0] if argv else tempfile.mkdtemp(prefix="persistshard-demo-")
    orders = os.path.join(root, "orders")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("persistshard demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Filter pushdown: the reader applies WHERE filters itself and skips chunks whose
        # column statistics rule them out. Off by default in Spark; without it Spark reads
        # every row and filters afterwards (same answers, more work).
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    _say(f"persistshard {ps.__version__} demo, shard at {orders}")

    def append(rows: list[tuple[int, str, int]], note: str) -> None:
        df = spark.createDataFrame(rows, "id BIGINT, item STRING, qty BIGINT")
        df.write.format("persistshard").mode("append").save(orders)
        upper = ps.open_shard(orders).upper
        _say(f"\nappend ({note}): {_plural(len(rows), 'row')} -> upper {upper}")

    append([(1, "apple", 3), (2, "pear", 1), (3, "plum", 7)], "time 0")
    append([(4, "fig", 2)], "time 1")
    # A CDC batch: retract the old plum row, insert the corrected one (time 2).
    cdc = spark.createDataFrame(
        [(3, "plum", 7, 2, -1), (3, "plum", 5, 2, 1)],
        "id BIGINT, item STRING, qty BIGINT, _time BIGINT, _diff BIGINT",
    )
    cdc.write.format("persistshard").mode("append").save(orders)
    _say("\nappend (a change at time 2: plum 7 -> 5) as _time/_diff updates")

    def read() -> DataFrameReader:
        return spark.read.format("persistshard")

    _show("snapshot now (upper - 1 = 2)", read().load(orders))
    _show("time travel: as_of 0", read().option("as_of", 0).load(orders))
    _show(
        "changes in [1, 3)", read().option("updates_from", 1).option("updates_to", 3).load(orders)
    )

    desired = spark.createDataFrame(
        [(1, "apple", 3), (3, "plum", 5), (4, "fig", 2), (5, "kiwi", 9)],
        "id BIGINT, item STRING, qty BIGINT",
    )
    desired.write.format("persistshard").mode("overwrite").save(orders)
    shard = ps.open_shard(orders)
    last = [h for h in shard.history() if h["kind"] == "overwrite"][-1]
    _say(f"\noverwrite (self-correcting): wrote only the difference: {last['summary']}")
    _show("what the overwrite changed (time 3)", read().option("updates_from", 3).load(orders))

    spark.sql(f"CREATE TABLE orders USING persistshard LOCATION '{orders}'")
    spark.sql("INSERT INTO orders VALUES (6, 'lime', 4)")
    _say("\nSQL: CREATE TABLE orders ... LOCATION; INSERT INTO orders VALUES (6, 'lime', 4)")
    _show(
        "SQL: SELECT item, qty FROM orders WHERE qty > 3 (the filter is pushed to the reader)",
        spark.sql("SELECT item, qty FROM orders WHERE qty > 3"),
    )
    _show(
        "SQL: SELECT * FROM orders WITH ('as_of' = '1')",
        spark.sql("SELECT * FROM orders WITH ('as_of' = '1')"),
    )
    # A change table over the same shard: its SELECTs keep _time and _diff.
    spark.sql(
        f"CREATE TABLE orders_changes USING persistshard LOCATION '{orders}' "
        "OPTIONS (changes 'true')"
    )
    _show(
        "SQL: SELECT * FROM orders_changes WITH ('updates_from' = '3')",
        spark.sql("SELECT * FROM orders_changes WITH ('updates_from' = '3')"),
    )

    shard.advance_since(shard.upper - 1)
    report = shard.compact()
    _say(
        f"\nadvance since to {shard.since} and compact: batches {report.batches_before} -> "
        f"{report.batches_after}; verify: {'ok' if shard.verify().ok else 'PROBLEMS'}"
    )
    _say(
        "\nhistory:\n"
        + "\n".join(f"   v{h['version']}: {h['kind']}: {h['summary']}" for h in shard.history())
    )
    spark.sql("DROP TABLE orders")
    spark.sql("DROP TABLE orders_changes")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
