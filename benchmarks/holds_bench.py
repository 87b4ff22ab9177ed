"""Holds: what 100 registered reader holds cost a commit.

Two shards with the same history of small appends; one also carries 100 live reader holds
(``register_reader``). Each round appends one small batch to each (a full commit: parts
written, state refreshed, compare-and-set, a rollup every 16th version) and times it. Holds
are a map in the state, so a commit pays for them only in the size of the rollups and in the
lease check of `apply`; target: at most 1.1x the commit without holds.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pyarrow as pa

from benchmarks.harness import alternate, measurement

OURS = "commit, 100 holds"
ANCHOR = "commit, no holds"


def _batch(t: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "_time": pa.array([t] * rows, pa.int64()),
            "_diff": pa.array([1] * rows, pa.int64()),
        }
    )


def run(holds: int = 100, history: int = 64, rows: int = 100, rounds: int = 50) -> dict[str, Any]:
    import persistshard as ps

    with tempfile.TemporaryDirectory(prefix="psbench-holds-") as tmp:
        held, plain = ps.open_shard(f"{tmp}/held"), ps.open_shard(f"{tmp}/plain")
        for shard in (held, plain):
            for t in range(history):
                shard.append(_batch(t, rows))
        for i in range(holds):
            held.register_reader(f"reader-{i}", lease_seconds=24 * 3600)
        for _ in range(holds):  # the same number of versions on both sides
            plain.seal(plain.upper + 1)

        def commit(shard: ps.Shard) -> Any:
            def go() -> None:
                shard.append(_batch(shard.upper, rows))

            return go

        times = alternate({OURS: commit(held), ANCHOR: commit(plain)}, rounds)
        assert len(held.readers()) == holds and not plain.readers()
    return {
        "title": "Reader holds: commit cost with 100 live holds",
        "description": (
            f"Two shards with {history} appends of {rows} rows; one also holds {holds} live "
            f"reader holds (and the other {holds} seals, so both logs are as long). Each round "
            f"appends {rows} rows to each, alternating; times are per commit."
        ),
        "params": {"holds": holds, "history": history, "rows": rows},
        "measurements": [
            measurement(
                f"append {rows} rows (one commit)",
                OURS,
                ANCHOR,
                times[OURS],
                times[ANCHOR],
                target=1.1,
            )
        ],
    }
