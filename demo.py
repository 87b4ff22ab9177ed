"""The main job: a Spark session that writes a shard, time-travels, reads changes, runs SQL, and
ingests a partitioned stream into two outputs exactly once (reclocking).

    python -m persistshard.demo [DIRECTORY]

Everything goes to local files under DIRECTORY (a fresh temporary directory by default, removed
at the end, also when the demo fails; a DIRECTORY given is kept), and every step prints what it
does and what it saw. The first time it prints one of persistshard's terms (upper, sealed,
since, into-time) it explains it in one plain sentence (`GLOSSARY`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _say(text: str) -> None:
    """Print one of the demo's own lines (flushed, so Spark's output never interleaves)."""
    print(text, flush=True)


#: One plain sentence per term, printed the first time the demo shows the term.
GLOSSARY = {
    "upper": "The upper is the shard's write frontier: every update at a time below it is "
    "final, and the next write starts exactly at it.",
    "sealed": "A time is sealed once the upper has moved past it: its updates can no longer "
    "change, so it can be read as a snapshot.",
    "since": "The since is the read frontier: snapshots at any time at or after it are exact, "
    "while history before it may have been merged into it by compaction.",
    "into-time": "An into-time is a time of the output shards that a remap binding ties to a "
    "source frontier (an offset per source partition): the records below that frontier are "
    "written at that into-time or earlier.",
}
_explained: set[str] = set()


def _explain(*terms: str) -> None:
    """Print the `GLOSSARY` sentence of each term not explained yet."""
    for term in terms:
        if term not in _explained:
            _explained.add(term)
            _say(f"   ({term}) {GLOSSARY[term]}")


@contextmanager
def _workspace(given: str | None) -> Iterator[str]:
    """The demo's directory: ``given`` (kept), or a fresh temporary one, removed afterwards."""
    if given is not None:
        yield given
        return
    root = tempfile.mkdtemp(prefix="persistshard-demo-")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _show(title: str, df: DataFrame) -> None:
    rows = df.orderBy(*df.columns).collect()  # run the job before printing anything
    lines = [f"\n== {title} ({_plural(len(rows), 'row')})"]
    lines += ["   " + ", ".join(f"{k}={v}" for k, v in row.asDict().items()) for row in rows]
    _say("\n".join(lines))


def main(argv: list[str], spark: SparkSession | None = None) -> int:
    """Run the demo in ``argv[0]`` (kept) or a temporary directory (removed), on ``spark`` when
    given (left running: the caller owns it) or on a local session it starts and stops."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with _workspace(argv[0] if argv else None) as root:
        code = _run(root, spark)
    if not argv:
        _say(f"\n(removed the demo's temporary directory {root})")
    return code


def _run(root: str, given: SparkSession | None = None) -> int:
    from pyspark.sql import SparkSession

    import persistshard as ps

    orders = os.path.join(root, "orders")
    spark = given or (
        SparkSession.builder.master("local[2]")
        .appName("persistshard demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    _say(f"persistshard {ps.__version__} demo, shard at {orders}")

    def append(rows: list[tuple[int, str, int]], note: str) -> None:
        df = spark.createDataFrame(rows, "id BIGINT, item STRING, qty BIGINT")
        df.write.format("persistshard").mode("append").save(orders)
        upper = ps.open_shard(orders).upper
        _say(
            f"\nappend ({note}): {_plural(len(rows), 'row')} -> upper {upper} "
            f"(time {upper - 1} is sealed)"
        )
        _explain("upper", "sealed")

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
        "SQL: SELECT item, qty FROM orders WHERE qty > 3",
        spark.sql("SELECT item, qty FROM orders WHERE qty > 3"),
    )
    # The `where` option is applied by the reader itself: chunks whose column statistics
    # rule it out are never decoded (Spark's own WHERE filters the rows it is handed).
    _show(
        "SQL: SELECT * FROM orders WITH ('where' = 'id >= 4') (chunks pruned by the reader)",
        spark.sql("SELECT * FROM orders WITH ('where' = 'id >= 4')"),
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

    # A reader hold: since may not pass it, so this reader's history stays exact.
    with shard.register_reader("dashboard", lease_seconds=60) as hold:
        hold.downgrade_since(2)
        reached = shard.advance_since(shard.upper - 1)
        _say(
            f"\nreader 'dashboard' holds since at 2: advance_since({shard.upper - 1}) stops at "
            f"{reached}; its change read from 3 stays exact: "
            f"{_plural(shard.updates(3, shard.upper).num_rows, 'update')}"
        )
        _explain("since")
        with shard.listen(as_of=2, timeout=0.5) as changes:
            for updates, frontier in changes:
                _say(f"   listen from 2: {_plural(updates.num_rows, 'row')} up to {frontier}")
    shard.advance_since(shard.upper - 1)  # the hold is released: since moves on
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
    upserts(spark, root)
    together(spark, root)
    ingest(spark, root)
    if given is None:
        spark.stop()
    return 0


def upserts(spark: SparkSession, root: str) -> None:
    """Upserts by key: each row replaces the row with the same key; a change read between two
    upserts shows only the rows that changed."""
    import persistshard as ps

    stock = os.path.join(root, "stock")
    schema = "item STRING, qty BIGINT, deleted BOOLEAN"

    def upsert(rows: list[tuple[str, int, bool]], note: str) -> None:
        (
            spark.createDataFrame(rows, schema)
            .write.format("persistshard")
            .mode("append")
            .option("key_columns", "item")
            .option("delete_column", "deleted")
            .save(stock)
        )
        _say(f"\nupsert by item ({note}) -> upper {ps.open_shard(stock).upper}")

    upsert([("apple", 10, False), ("pear", 4, False), ("plum", 6, False)], "three items")
    upsert(
        [("apple", 10, False), ("pear", 3, False), ("plum", 0, True), ("fig", 8, False)],
        "apple unchanged, pear 4 -> 3, plum deleted, fig new",
    )
    read = spark.read.format("persistshard")
    _show("stock now", read.load(stock))
    _show("what the second upsert changed", read.option("updates_from", 1).load(stock))


def together(spark: SparkSession, root: str) -> None:
    """A transaction over two shards: both DataFrames land at one time, or neither."""
    import persistshard as ps

    invoices, payments = os.path.join(root, "invoices"), os.path.join(root, "payments")
    txns = ps.open_txns(os.path.join(root, "_txns"))
    txns.register(invoices, payments)
    t = ps.write_together(
        spark,
        {
            invoices: spark.createDataFrame([(1, 30), (2, 12)], "invoice BIGINT, amount BIGINT"),
            payments: spark.createDataFrame([(1, 30)], "invoice BIGINT, paid BIGINT"),
        },
        txns=os.path.join(root, "_txns"),
    )
    upper = ps.open_shard(invoices).upper
    same = "the same" if ps.open_shard(payments).upper == upper else "NOT the same"
    _say(
        f"\none transaction over invoices and payments -> both written at time {t}; their "
        f"upper is {same} ({upper})"
    )
    read = spark.read.format("persistshard")
    _show("invoices", read.load(invoices))
    _show("payments", read.load(payments))


def ingest(spark: SparkSession, root: str) -> None:
    """Reclocking: a partitioned log (Kafka's columns, local files) streamed into two outputs
    that share one remap shard; the checkpoint is deleted and the query restarts from
    `resume_offsets`; every record is in each output exactly once."""
    import shutil
    from collections import Counter

    import persistshard as ps
    from persistshard.conformance.logsource import (
        PartitionedLogSource,
        append_records,
        end_offsets,
    )
    from persistshard.datasource.reclock import frontier_of

    spark.dataSource.register(PartitionedLogSource)
    log, remap = os.path.join(root, "log"), os.path.join(root, "clicks_remap")
    outputs = {"even": os.path.join(root, "clicks_even"), "odd": os.path.join(root, "clicks_odd")}
    checkpoint = os.path.join(root, "clicks_checkpoint")

    def produce(counts: dict[int, int]) -> None:
        ends = end_offsets(log)
        for p, n in counts.items():
            start = ends.get(f"clicks:{p}", 0)
            append_records(log, "clicks", p, [f"click {p}/{start + i}" for i in range(n)])

    def each(df: DataFrame, batch_id: int) -> None:
        df = df.selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value")
        whole = frontier_of(df)  # the frontier of the whole micro-batch, for both outputs
        for name, parity in (("even", 0), ("odd", 1)):
            (
                df.where(f"offset % 2 = {parity}")
                .write.format("persistshard")
                .mode("append")
                .option("remap", remap)
                .option("source_frontier", whole)
                .save(outputs[name])
            )

    def run(starting: str) -> None:
        q = (
            spark.readStream.format("partitioned_log")
            .option("startingOffsets", starting)
            .option("maxRecordsPerPartition", 3)
            .load(log)
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    produce({0: 5, 1: 4})
    run("earliest")
    _say(f"\ningest: {len(ps.open_remap(remap).bindings())} micro-batches, one binding each:")
    _explain("into-time")
    for t, frontier in ps.open_remap(remap).bindings():
        _say(f"   into-time {t}: {frontier}")
    produce({0: 2, 1: 3})
    shutil.rmtree(checkpoint)
    resume = ps.resume_offsets(outputs["even"], remap=remap)
    _say(f"checkpoint deleted; more records arrive; restart from resume_offsets: {resume}")
    run(resume)
    _say("and once more from the very beginning (every record replayed):")
    shutil.rmtree(checkpoint)
    run("earliest")
    for name, location in outputs.items():
        shard = ps.open_shard(location)
        counts = Counter(
            r["value"] for r in shard.snapshot().to_pylist() for _ in range(r["_diff"])
        )
        twice = sorted(v for v, c in counts.items() if c > 1)
        _say(
            f"   output {name}: {sum(counts.values())} records, upper {shard.upper}, "
            f"{'none' if not twice else twice} written twice"
        )
    frontier = ps.open_remap(remap).source_upper_at(ps.open_shard(outputs["odd"]).upper)
    _say(f"   both outputs at into-time {ps.open_shard(outputs['odd']).upper - 1} cover {frontier}")

    # A streaming aggregation kept as a table: complete mode writes each micro-batch's result
    # as the table's contents, committing only the groups that changed.
    view = os.path.join(root, "clicks_per_partition")

    def count_clicks() -> None:
        (
            spark.readStream.format("partitioned_log")
            .option("startingOffsets", "earliest")
            .load(log)
            .groupBy("partition")
            .count()
            .writeStream.format("persistshard")
            .outputMode("complete")
            .option("writer_id", "clicks-per-partition")
            .option("checkpointLocation", os.path.join(root, "view_checkpoint"))
            .trigger(availableNow=True)
            .start(view)
            .awaitTermination()
        )

    count_clicks()
    first = ps.open_shard(view).upper
    produce({1: 2})
    count_clicks()
    shard = ps.open_shard(view)
    _say(f"\nclicks per partition (complete mode), two micro-batches -> upper {shard.upper}:")
    for r in sorted(shard.snapshot().to_pylist(), key=lambda r: r["partition"]):
        _say(f"   partition {r['partition']}: {r['count']} clicks")
    _say("   changed by the second micro-batch (partition 0 did not change):")
    for r in sorted(shard.updates(first, shard.upper).to_pylist(), key=lambda r: r["_diff"]):
        _say(f"   partition {r['partition']}: {r['count']} clicks, diff {r['_diff']:+d}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
