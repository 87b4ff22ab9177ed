"""persistshard's benchmarks: one harness (`benchmarks.harness`), one registry (`REGISTRY`).

Run ``python -m benchmarks --help``. Each entry names the module whose ``run(...,
rounds)`` returns a result in the shape documented in `benchmarks.harness`, and what the
size knob passes to it: ``quick`` for a laptop, ``full`` for the figures of record.
"""

from __future__ import annotations

from benchmarks.harness import Benchmark

REGISTRY: tuple[Benchmark, ...] = (
    Benchmark(
        name="tpch",
        module="benchmarks.tpch_bench",
        summary="TPC-H: the 22 queries on persistshard tables vs Spark parquet (tpchgen-cli data)",
        sizes={"quick": {"sf": 0.1}, "full": {"sf": 1.0}},
        headings=("tpc-h",),
        uses_spark=True,
    ),
    Benchmark(
        name="tpch_companion",
        module="benchmarks.tpch_bench",
        summary="TPC-H: the 22 queries through the JVM companion vs Spark parquet (the tpch "
        "benchmark's setup, a session built with ps.configure_spark)",
        sizes={"quick": {"sf": 0.1, "companion": True}, "full": {"sf": 1.0, "companion": True}},
        uses_spark=True,
    ),
    Benchmark(
        name="spark",
        module="benchmarks.spark_bench",
        summary="Spark append and snapshot read + sum vs native parquet and a pass-through "
        "Python source",
        sizes={"quick": {"rows": 200_000}, "full": {"rows": 2_000_000}},
        headings=("spark data source",),
        uses_spark=True,
    ),
    Benchmark(
        name="companion",
        module="benchmarks.companion_bench",
        summary="Spark snapshot reads through the JVM companion vs native parquet and the "
        "Python source (read + sum; one column of five)",
        sizes={
            "quick": {"rows_sum": 1_000_000, "rows_five": 200_000},
            "full": {"rows_sum": 16_000_000, "rows_five": 2_000_000, "rows_five_large": 16_000_000},
        },
        headings=("jvm companion",),
        uses_spark=True,
        rounds={"full": 3},
    ),
    Benchmark(
        name="rowlevel",
        module="benchmarks.rowlevel_bench",
        summary="DELETE of 1% of the rows through the JVM companion: bytes written against "
        "the table's, time against selecting the same rows",
        sizes={"quick": {"rows": 400_000}, "full": {"rows": 4_000_000}},
        headings=("row-level",),
        uses_spark=True,
        rounds={"full": 3},
    ),
    Benchmark(
        name="s3",
        module="benchmarks.s3_bench",
        summary="Spark append and snapshot read on a local S3 server (moto) vs local files",
        sizes={"quick": {"rows": 200_000}, "full": {"rows": 2_000_000}},
        headings=("spark on s3",),
        uses_spark=True,
    ),
    Benchmark(
        name="scaling",
        module="benchmarks.scaling_bench",
        summary="Spark append, snapshot read and overwrite at growing sizes, three contenders; "
        "append against the pass-through at growing task sizes",
        sizes={
            "quick": {
                "sizes": (250_000, 500_000, 1_000_000),
                "task_total": 2_400_000,
                "task_rows": (200_000, 600_000, 1_200_000),
                "task_budget": 32 << 20,
            },
            "full": {
                "sizes": (1_000_000, 4_000_000, 16_000_000),
                "task_total": 12_000_000,
                "task_rows": (1_000_000, 3_000_000, 6_000_000),
            },
        },
        headings=("scaling",),
        uses_spark=True,
        rounds={"full": 3},
    ),
    Benchmark(
        name="peer",
        module="benchmarks.peer_bench",
        summary="Python API append, full, projected and filtered reads vs delta-rs and "
        "pyiceberg on the same Arrow table",
        sizes={"quick": {"rows": 1_000_000}, "full": {"rows": 16_000_000}},
        headings=("delta-rs", "deltalake"),
    ),
    Benchmark(
        name="duckdb_tpch",
        module="benchmarks.duckdb_tpch_bench",
        summary="TPC-H: the 22 queries through DuckDB on persistshard scans vs DuckDB on "
        "Parquet and on delta-rs",
        sizes={"quick": {"sf": 0.1}, "full": {"sf": 1.0}},
        headings=("through duckdb",),
    ),
    Benchmark(
        name="curves",
        module="benchmarks.curves_bench",
        summary="read time against commits before and after compaction; bytes stored against "
        "overwrites",
        sizes={
            "quick": {"rows": 100_000, "commits": (1, 10, 100), "overwrites": 20, "every": 2},
            "full": {"rows": 1_000_000, "commits": (1, 10, 100, 1000), "overwrites": 50},
        },
    ),
    Benchmark(
        name="format",
        module="benchmarks.format_bench",
        summary="the part file format vs pyarrow Parquet and Arrow IPC",
        sizes={"quick": {"size": 200_000}, "full": {"size": 2_000_000}},
        headings=("format",),
    ),
    Benchmark(
        name="correction",
        module="benchmarks.correction_bench",
        summary="the Correction buffer vs a naive sort-and-group",
        sizes={"quick": {"size_factor": 0.05}, "full": {"size_factor": 1.0}},
        headings=("correction",),
    ),
    Benchmark(
        name="compaction",
        module="benchmarks.compaction_bench",
        summary="storage after overwrites, snapshot read after many appends, write amplification",
        sizes={"quick": {"size_factor": 0.05}, "full": {"size_factor": 1.0}},
        headings=("compaction",),
    ),
    Benchmark(
        name="maintenance",
        module="benchmarks.maintenance_bench",
        summary="many small Python appends with after-commit maintenance, no manual compaction",
        sizes={"quick": {"appends": 200}, "full": {"appends": 1000}},
    ),
    Benchmark(
        name="holds",
        module="benchmarks.holds_bench",
        summary="commit cost with 100 live reader holds vs none",
        sizes={"quick": {"holds": 100, "history": 32}, "full": {"holds": 100, "history": 256}},
        headings=("reader holds",),
        rounds={"quick": 30, "full": 60},
    ),
    Benchmark(
        name="commit",
        module="benchmarks.commit_bench",
        summary="1-row commit latency on local disk, every put synced vs syncing switched off",
        sizes={"quick": {"commits": 50}, "full": {"commits": 200}},
        headings=("commit latency",),
        rounds={"quick": 5, "full": 7},
    ),
    Benchmark(
        name="spark_sync",
        module="benchmarks.spark_sync_bench",
        summary="Spark append with every put synced vs syncing switched off, same run",
        sizes={"quick": {"rows": 200_000}, "full": {"rows": 2_000_000}},
        headings=("spark append: every put synced",),
        uses_spark=True,
        rounds={"quick": 3, "full": 21},
    ),
    Benchmark(
        name="metrics",
        module="benchmarks.metrics_bench",
        summary="1-row commit latency with metrics on (as shipped) vs the metrics hooks off",
        sizes={"quick": {"commits": 50}, "full": {"commits": 200}},
        headings=("observability",),
        rounds={"quick": 7, "full": 9},
    ),
    Benchmark(
        name="inline",
        module="benchmarks.inline_bench",
        summary="object-store requests and latency of a 1-row append on S3 (moto): inline "
        "writes, blob and SQLite consensus, vs a part file and head reads as before",
        sizes={"quick": {"commits": 32}, "full": {"commits": 64}},
        rounds={"quick": 3, "full": 5},
    ),
    Benchmark(
        name="upsert",
        module="benchmarks.upsert_bench",
        summary="micro-batches upserting 0.1%/1%/10% of a table's keys vs appending the changed "
        "rows and vs a full overwrite",
        sizes={"quick": {"rows": 200_000}, "full": {"rows": 1_000_000}},
        headings=("upserts by key",),
        uses_spark=True,
    ),
    Benchmark(
        name="overwrite",
        module="benchmarks.overwrite_bench",
        summary="self-correcting overwrite, 1% changed, memory_budget 64 MiB, vs a plain append; "
        "peak RSS of every Python process",
        sizes={"quick": {"rows": 400_000}, "full": {"rows": 4_000_000}},
        headings=("overwrite that scales",),
        uses_spark=True,
    ),
    Benchmark(
        name="ingest",
        module="benchmarks.ingest_bench",
        summary="a partitioned stream into one output with reclocking vs today's streaming sink",
        sizes={"quick": {"rows": 200_000}, "full": {"rows": 2_000_000}},
        headings=("ingest",),
        uses_spark=True,
    ),
    Benchmark(
        name="fork",
        module="benchmarks.fork_bench",
        summary="a zero-copy fork of a shard vs copying its files: time and bytes written",
        sizes={"quick": {"rows": 2_000_000}, "full": {"rows": 16_000_000}},
        headings=("forks",),
        rounds={"quick": 3, "full": 3},
    ),
    Benchmark(
        name="txns",
        module="benchmarks.txns_bench",
        summary="a transaction over 2 shards vs 2 plain appends; reading a registered shard "
        "vs a plain one",
        sizes={"quick": {"rows": 200_000}, "full": {"rows": 1_000_000}},
        headings=("transactions over many shards",),
        rounds={"quick": 3, "full": 5},
    ),
    Benchmark(
        name="writers",
        module="benchmarks.writers_bench",
        summary="state bytes and commit time after 10,000 appends from 10,000 writer ids",
        sizes={"quick": {"appends": 10_000}, "full": {"appends": 10_000}},
        headings=("bounded metadata",),
        rounds={"quick": 1, "full": 1},
    ),
)

BY_NAME = {b.name: b for b in REGISTRY}

__all__ = ["BY_NAME", "REGISTRY", "Benchmark"]
