"""Peer: persistshard's Python API against delta-rs (the ``deltalake`` package), in-process.

delta-rs is the nearest peer outside Spark: a transaction log over Parquet files, written and
read from Python without a JVM. Both get the same Arrow table (id, name of 16 characters,
value); ours also gets ``_time = 0`` and ``_diff = 1`` columns, added before timing, since a
shard stores updates. Append: each round into a new table (`Shard.append` vs
``write_deltalake(mode="append")``). Read: the table written once, read whole into Arrow
(`Shard.snapshot`, which consolidates, vs ``DeltaTable.to_pyarrow_table``). Bytes stored
are compared too. No targets: these are figures to know, not promises.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks import anchors as a
from benchmarks.harness import alternate, measurement, skipped
from benchmarks.spark_bench import human

OURS = "persistshard (Python)"
DELTA = "delta-rs"


def make_table(rows: int, seed: int = 7) -> pa.Table:
    """id, name (16 hex characters), value: the Spark benchmark's table, built in Arrow."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=rows * 8, dtype=np.uint8).tobytes()
    names = pa.array(np.frombuffer(raw.hex().encode(), dtype="S16")).cast(pa.string())
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "name": names,
            "value": pa.array(rng.random(rows)),
        }
    )


def run(rows: int = 2_000_000, rounds: int = 5) -> dict[str, Any]:
    import persistshard as ps

    missing = a.deltalake_available()
    n = human(rows)
    what_w, what_r = f"append {n} rows", f"read {n} rows into Arrow"
    if missing:
        return {
            "title": "Peer outside Spark: Python API vs delta-rs",
            "description": __doc__.split("\n\n")[1] if __doc__ else "",
            "params": {"rows": rows},
            "measurements": [
                skipped(what_w, OURS, DELTA, missing),
                skipped(what_r, OURS, DELTA, missing),
            ],
        }
    table = make_table(rows)
    updates = table.append_column("_time", pa.array(np.zeros(rows, np.int64))).append_column(
        "_diff", pa.array(np.ones(rows, np.int64))
    )
    counter = itertools.count()
    with tempfile.TemporaryDirectory(prefix="psbench-peer-") as tmp:

        def fresh(write: Any) -> Any:
            def go() -> float:
                path = f"{tmp}/w{next(counter)}"
                start = time.perf_counter()
                write(path)
                elapsed = time.perf_counter() - start
                shutil.rmtree(path, ignore_errors=True)
                return elapsed

            return go

        writes = alternate(
            {
                OURS: fresh(lambda p: ps.open_shard(p).append(updates)),
                DELTA: fresh(lambda p: a.delta_write(table, p)),
            },
            rounds,
        )
        ours_path, delta_path = f"{tmp}/ours", f"{tmp}/delta"
        ps.open_shard(ours_path).append(updates)
        a.delta_write(table, delta_path)
        stored = {OURS: a.directory_bytes(ours_path), DELTA: a.directory_bytes(delta_path)}
        got: dict[str, int] = {}

        def read_ours() -> None:
            got[OURS] = ps.open_shard(ours_path).snapshot().num_rows

        def read_delta() -> None:
            got[DELTA] = a.delta_read(delta_path).num_rows

        reads = alternate({OURS: read_ours, DELTA: read_delta}, rounds)
    if got != {OURS: rows, DELTA: rows}:
        raise AssertionError(f"rows read {got}, expected {rows} each")
    return {
        "title": "Peer outside Spark: Python API vs delta-rs",
        "description": (
            f"{n} rows (id, name of 16 characters, value) as one Arrow table, in one Python "
            "process, no Spark. Append: `open_shard(path).append(table)` (with `_time` 0 and "
            '`_diff` 1) vs `write_deltalake(path, table, mode="append")`, each round into a '
            "new table. Read: `open_shard(path).snapshot()` (consolidated: one row per "
            "distinct row) vs `DeltaTable(path).to_pyarrow_table()`. No targets."
        ),
        "params": {"rows": rows},
        "measurements": [
            measurement(what_w, OURS, DELTA, writes[OURS], writes[DELTA]),
            measurement(what_r, OURS, DELTA, reads[OURS], reads[DELTA]),
            measurement(
                f"bytes stored, {n} rows",
                OURS,
                DELTA,
                [stored[OURS]],
                [stored[DELTA]],
                unit="bytes",
                extra={"bytes": stored},
            ),
        ],
    }
