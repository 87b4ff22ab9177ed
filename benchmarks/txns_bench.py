"""Transactions over many shards: what a transaction costs against plain appends, and what
reading a registered shard costs against reading a plain one.

Writes: two plain shards and two shards registered with one txns shard, each holding
``rows`` rows (``id`` and a random ``value``, int64) to start with. Each round appends
``rows`` fresh rows to each of the two plain shards (two `Shard.append` calls) and,
alternating, writes the same rows to each of the two registered shards in one transaction
(`TxnsShard.begin`: parts, pins, the one commit on the txns shard, the apply of both).
Reads: a snapshot (`Shard.snapshot`) of a registered shard of ``rows`` rows against one of a
plain shard holding the same rows, alternating; the registered read also reads the txns
shard's snapshot (its pending writes). Every handle runs no after-commit maintenance, so
both sides do exactly their writes. Targets (issue 39): a transaction <= 1.5x the two
appends; the registered read <= 1.1x the plain one.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.harness import alternate, measurement

TXN = "one transaction over 2 shards"
APPENDS = "2 plain appends"
REGISTERED = "snapshot of a registered shard"
PLAIN = "snapshot of a plain shard"


def run(rows: int = 1_000_000, rounds: int = 5) -> dict[str, Any]:
    import persistshard as ps

    rng = np.random.default_rng(39)
    counter = iter(range(1 << 40))

    def table() -> pa.Table:
        start = next(counter) * rows
        return pa.table(
            {
                "id": pa.array(np.arange(start, start + rows, dtype=np.int64)),
                "value": pa.array(rng.integers(0, 1 << 62, rows, dtype=np.int64)),
            }
        )

    with tempfile.TemporaryDirectory(prefix="psbench-txns-") as tmp:
        names = ("p1", "p2", "t1", "t2")
        paths = {n: os.path.join(tmp, n) for n in names}
        shards = {n: ps.open_shard(paths[n], maintenance=False) for n in names}
        first = table()
        for n in names:
            shards[n].append(first)
        txns = ps.open_txns(os.path.join(tmp, "_txns"), maintenance=False)
        txns.register(paths["t1"], paths["t2"])

        def plain_appends() -> float:
            a, b = table(), table()
            started = time.perf_counter()
            shards["p1"].append(a)
            shards["p2"].append(b)
            return time.perf_counter() - started

        def transaction() -> float:
            a, b = table(), table()
            started = time.perf_counter()
            with txns.begin() as tx:
                tx.append(paths["t1"], a)
                tx.append(paths["t2"], b)
            elapsed = time.perf_counter() - started
            assert tx.committed_at is not None
            return elapsed

        writes = alternate({TXN: transaction, APPENDS: plain_appends}, rounds)

        # Reads: one registered and one plain shard of ``rows`` rows each, same contents.
        reads_at = {n: os.path.join(tmp, f"read-{n}") for n in ("r", "p")}
        contents = table()
        ps.open_shard(reads_at["p"]).append(contents)
        ps.open_shard(reads_at["r"])
        txns.register(reads_at["r"])
        with txns.begin() as tx:
            tx.append(reads_at["r"], contents)
        registered = ps.open_shard(reads_at["r"], maintenance=False)
        plain = ps.open_shard(reads_at["p"], maintenance=False)
        assert registered.snapshot().num_rows == plain.snapshot().num_rows == rows

        def read(shard: Any) -> float:
            started = time.perf_counter()
            out = shard.snapshot()
            elapsed = time.perf_counter() - started
            assert out.num_rows == rows
            return elapsed

        reads = alternate(
            {REGISTERED: lambda: read(registered), PLAIN: lambda: read(plain)}, rounds
        )
    label = f"{rows / 1e6:g}M rows"
    return {
        "title": "Transactions over many shards: a transaction vs plain appends, and reads",
        "description": (
            f"Writes: each round appends {label} to each of two plain shards (two appends) "
            f"and, alternating, writes {label} to each of two registered shards in one "
            "transaction (parts, pins, one commit on the txns shard, the apply of both). "
            f"Reads: a snapshot of a registered shard of {label} vs a plain shard with the "
            "same rows; the registered read also reads the txns shard's snapshot. No "
            "after-commit maintenance on either side; local files."
        ),
        "params": {"rows": rows},
        "measurements": [
            measurement(
                f"write {label} to each of 2 shards",
                TXN,
                APPENDS,
                writes[TXN],
                writes[APPENDS],
                target=1.5,
            ),
            measurement(
                f"snapshot read of {label}",
                REGISTERED,
                PLAIN,
                reads[REGISTERED],
                reads[PLAIN],
                target=1.1,
            ),
        ],
    }
