"""Commit latency: what durability costs a 1-row commit on local disk.

Each round appends one row ``commits`` times to a shard on local disk (a full commit: the
part written, the state refreshed, the compare-and-set, a rollup every 16th version) and
takes the median; once with every put synced (data fsynced before the name is published,
the directory after: what the shard always does) and once with syncing switched off
(`persistshard.core.storage.blob.SYNC_LOCAL`, what every put did before; switched off only here).
The two alternate, each round on fresh shards in the same directory. The issue's target is
absolute: the synced p50 stays under 20 ms; the ratio shows the price of the fsyncs.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa

from benchmarks.harness import alternate, measurement

OURS = "synced (fsync data + directory)"
ANCHOR = "unsynced (before)"


def one_row_commit_p50(location: str, commits: int) -> float:
    """Median seconds of ``commits`` 1-row appends to a new shard at ``location`` (its first
    append, which creates the shard's directories, is not counted)."""
    import persistshard as ps

    shard = ps.open_shard(location)
    shard.append(pa.table({"id": [0]}))
    times = []
    for i in range(commits):
        start = time.perf_counter()
        shard.append(pa.table({"id": [i]}))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(commits: int = 50, rounds: int = 5) -> dict[str, Any]:
    from persistshard.core.storage import blob as blob_module

    with tempfile.TemporaryDirectory(prefix="psbench-commit-") as tmp:
        counter = iter(range(1_000_000))

        def p50(sync: bool) -> Any:
            def go() -> float:
                blob_module.SYNC_LOCAL = sync
                try:
                    return one_row_commit_p50(f"{tmp}/s{next(counter)}", commits)
                finally:
                    blob_module.SYNC_LOCAL = True

            return go

        times = alternate({OURS: p50(True), ANCHOR: p50(False)}, rounds)
    ours_ms = statistics.median(times[OURS]) * 1000
    return {
        "title": "Commit latency: 1-row append on local disk, synced vs unsynced",
        "description": (
            f"Each round: {commits} one-row appends to a fresh local shard, the median commit "
            "time of the round; synced (every put fsyncs its data before publishing the name, "
            "then the directory) alternating with syncing switched off (what puts did before "
            "the durability work). Target: synced p50 under 20 ms."
        ),
        "params": {"commits": commits},
        "measurements": [
            measurement(
                "1-row append, p50 of a round",
                OURS,
                ANCHOR,
                times[OURS],
                times[ANCHOR],
                note=f"synced p50 {ours_ms:.1f} ms (target under 20 ms)",
                extra={"synced_p50_ms": ours_ms},
            )
        ],
    }
