"""TPC-H through DuckDB: the 22 queries on persistshard scans against DuckDB on the same data
in Parquet and in Delta (issue 27, item 5).

Data: ``tpchgen-cli`` at scale factor ``sf`` (`benchmarks.tpch_bench.generate`, cached), read
into Arrow once per table (`benchmarks.tpch_bench.arrow_table`: strings as ``string``) and
written three times, untimed: as a shard (one append at time 0), as one Parquet file by
``pyarrow.parquet.write_table`` with its defaults, and as a Delta table by ``write_deltalake``.
One DuckDB connection (in memory, its default threads) sees each copy under its own prefix:

- ``pq_<t>``: a view over ``read_parquet(...)`` (DuckDB's own reader: it pushes projection and
  filters into the file, parallel by row group);
- ``dl_<t>``: ``DeltaTable(path).to_pyarrow_dataset()`` registered as is (DuckDB pushes
  projection and filters into the pyarrow dataset);
- ``ps_<t>``: persistshard scans registered with ``con.register`` (DuckDB reads them through
  the Arrow C stream, ``Scan.__arrow_c_stream__``). A C stream takes no projection from
  DuckDB, so **the scans are re-created for every query**: ``shard.scan(columns=...)`` with
  the columns the query names (`benchmarks.tpch_bench.needed_columns`), registered just
  before it runs, the re-creation inside the timed time. A second contender, *whole scans*,
  registers one ``shard.scan()`` per table once and lets every query stream every column.

Each round runs every query once per contender, rotating the order; a query's time is
``con.execute(sql).fetchall()``. The answers of a warm-up round are compared before timing
(floats to 10 significant digits, decimals and dates exactly; row order where the query
orders, as multisets otherwise): a fast wrong answer fails the benchmark. No targets (issue
27: this says how far the format and the scan are from a native reader).
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks import anchors as a
from benchmarks.harness import measurement, skipped
from benchmarks.tpch_bench import arrow_table, generate, needed_columns, rename, write_shard
from benchmarks.tpch_queries import TABLES, queries

OURS = "persistshard scans"
WHOLE = "persistshard, whole scans"
PARQUET = "DuckDB on Parquet"
DELTA = "DuckDB on delta-rs"


def shown(value: Any) -> str:
    """One value as compared: floats to 10 significant digits, anything else by repr."""
    if isinstance(value, float):
        return f"{value:.10g}"
    return repr(value)


def answer(rows: list[tuple[Any, ...]], ordered: bool) -> list[str]:
    lines = ["(" + ", ".join(shown(v) for v in r) + ")" for r in rows]
    return lines if ordered else sorted(lines)


def run(sf: float = 1.0, rounds: int = 5, only: tuple[int, ...] = ()) -> dict[str, Any]:
    title = f"TPC-H through DuckDB, scale factor {sf:g}: persistshard scans vs Parquet and Delta"
    try:
        import duckdb
    except ImportError:
        duckdb = None
    missing = a.deltalake_available() or (None if duckdb else "duckdb is not installed")
    if missing:
        return {
            "title": title,
            "description": "not run",
            "params": {"sf": sf},
            "measurements": [skipped("sum of 22 queries", OURS, PARQUET, missing)],
        }
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    import persistshard as ps

    qs = queries(sf)
    if only:
        qs = {n: q for n, q in qs.items() if n in only}
    contenders = (OURS, WHOLE, PARQUET, DELTA)
    times: dict[int, dict[str, list[float]]] = {n: {w: [] for w in contenders} for n in qs}
    stored = {OURS: 0, PARQUET: 0, DELTA: 0}
    with tempfile.TemporaryDirectory(prefix="psbench-duckdb-tpch-") as tmp:
        generated = generate(sf)
        con = duckdb.connect()
        shards = {}
        for t in TABLES:
            table = arrow_table(generated / f"{t}.parquet")
            write_shard(f"{tmp}/ps/{t}", table)
            pq.write_table(table, f"{tmp}/{t}.parquet")
            write_deltalake(f"{tmp}/dl/{t}", table)
            del table
            stored[OURS] += a.directory_bytes(f"{tmp}/ps/{t}")
            stored[PARQUET] += os.path.getsize(f"{tmp}/{t}.parquet")
            stored[DELTA] += a.directory_bytes(f"{tmp}/dl/{t}")
            shards[t] = ps.open_shard(f"{tmp}/ps/{t}")
            con.execute(f"create view pq_{t} as select * from read_parquet('{tmp}/{t}.parquet')")
            con.register(f"dl_{t}", DeltaTable(f"{tmp}/dl/{t}").to_pyarrow_dataset())
            con.register(f"whole_{t}", shards[t].scan())
        columns = {t: shards[t].schema.names for t in TABLES}

        def ours(n: int, sql: str) -> Callable[[], list[Any]]:
            text = rename(sql, "ps")
            named = [t for t in TABLES if re.search(rf"\b{t}\b", sql)]

            def go() -> list[Any]:
                for t in named:  # re-created per query: the projection DuckDB cannot push
                    con.register(f"ps_{t}", shards[t].scan(columns=needed_columns(sql, columns[t])))
                return con.execute(text).fetchall()

            return go

        def plain(sql: str, prefix: str) -> Callable[[], list[Any]]:
            text = rename(sql, prefix)
            return lambda: con.execute(text).fetchall()

        runs = {
            n: {
                OURS: ours(n, sql),
                WHOLE: plain(sql, "whole"),
                PARQUET: plain(sql, "pq"),
                DELTA: plain(sql, "dl"),
            }
            for n, sql in qs.items()
        }
        for r in range(-1, rounds):  # round -1: warm-up, and the answers are compared
            for n, sql in qs.items():
                shift = (r + n) % len(contenders)
                got: dict[str, list[str]] = {}
                for who in [*contenders[shift:], *contenders[:shift]]:
                    start = time.perf_counter()
                    rows = runs[n][who]()
                    elapsed = time.perf_counter() - start
                    if r < 0:
                        got[who] = answer(rows, "order by" in sql.lower())
                    else:
                        times[n][who].append(elapsed)
                for who in (OURS, WHOLE, DELTA):
                    if r < 0 and got[who] != got[PARQUET]:
                        raise AssertionError(f"TPC-H q{n}: the answers of {who} and Parquet differ")
        con.close()

    ms = []
    for n in qs:
        ms.append(measurement(f"q{n}", OURS, PARQUET, times[n][OURS], times[n][PARQUET]))
    for n in qs:
        ms.append(measurement(f"q{n}", OURS, DELTA, times[n][OURS], times[n][DELTA]))
    total = {w: [sum(times[n][w][i] for n in qs) for i in range(rounds)] for w in contenders}
    sums = f"sum of {len(qs)} queries"
    ms.append(measurement(sums, OURS, PARQUET, total[OURS], total[PARQUET]))
    ms.append(measurement(sums, OURS, DELTA, total[OURS], total[DELTA]))
    ms.append(measurement(sums, WHOLE, PARQUET, total[WHOLE], total[PARQUET]))
    ms.append(measurement(sums, DELTA, PARQUET, total[DELTA], total[PARQUET]))
    for anchor in (PARQUET, DELTA):
        ms.append(
            measurement(
                f"bytes stored, SF {sf:g}",
                OURS,
                anchor,
                [stored[OURS]],
                [stored[anchor]],
                unit="bytes",
            )
        )

    def ratios(who: str, anchor: str) -> list[float]:
        return [
            statistics.median(o / p for o, p in zip(times[n][who], times[n][anchor], strict=True))
            for n in qs
        ]

    return {
        "title": title,
        "description": (
            f"TPC-H at SF {sf:g} generated by `tpchgen-cli`; every table written as a shard "
            "(Python API, one append at time 0), as one Parquet file (`pyarrow.parquet."
            "write_table` defaults) and as a Delta table (`write_deltalake`). One in-memory "
            "DuckDB connection runs the 22 queries (`benchmarks/tpch_queries.py`) with "
            "`con.execute(sql).fetchall()`, the contenders rotating per query: Parquet through "
            "`read_parquet` views; Delta through `DeltaTable.to_pyarrow_dataset()` registered "
            "once (DuckDB pushes projection and filters into it); persistshard through scans "
            "registered as Arrow C streams, **re-created per query** with the columns the query "
            "names (DuckDB pushes nothing into a C stream; the re-creation is timed), and, as "
            "*whole scans*, one `shard.scan()` per table registered once. Answers of all four "
            f"checked equal ({len(qs)}/{len(qs)}) before timing. No targets."
        ),
        "params": {"sf": sf, "queries": len(qs), "duckdb": duckdb.__version__},
        "measurements": ms,
        "series": [
            {
                "id": f"duckdb_tpch_ratios_sf{sf:g}".replace(".", "_"),
                "title": f"TPC-H SF {sf:g} in DuckDB: time / Parquet time per query (median)",
                "x_label": "query",
                "y_label": "time ratio (1 = parity)",
                "x": [float(n) for n in qs],
                "lines": {
                    "persistshard scans / Parquet": ratios(OURS, PARQUET),
                    "delta-rs dataset / Parquet": ratios(DELTA, PARQUET),
                    "parity": [1.0] * len(qs),
                },
                "x_tick_labels": [f"q{n}" for n in qs],
            }
        ],
        "notes": [
            f"answers identical: {len(qs)}/{len(qs)}",
            "bytes stored: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in stored.items()),
        ],
    }
