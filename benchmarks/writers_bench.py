"""Bounded metadata: state size and commit time after 10,000 appends from 10,000 writer ids.

One shard takes ``appends`` small appends, each from its own streaming writer id (a
compare-and-append that records the writer's batch, as a Spark streaming sink does), each
followed by the writer's small compaction (`Shard._maybe_compact`). Writer records expire and
are capped (`persistshard.core.statemachine.state.prune_writers`), so neither the state nor the
commit should grow with the number of writers. Measured: the time of each of ``window`` commits
from the 100th on (the anchor) and of the last ``window`` commits (ours), and the encoded
state (rollup) bytes at both points. Target: the last commits within 1.2x the 100th.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import pyarrow as pa

from benchmarks.harness import measurement

OURS = "commits at the end"
ANCHOR = "commits from the 100th"


def _batch(t: int, writer: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([writer], pa.int64()),
            "_time": pa.array([t], pa.int64()),
            "_diff": pa.array([1], pa.int64()),
        }
    )


def run(appends: int = 10_000, window: int = 200, rounds: int = 1) -> dict[str, Any]:
    import persistshard as ps
    from persistshard.core.statemachine.encoding import encode_rollup

    start_at = 100
    early: list[float] = []
    late: list[float] = []
    state_bytes: dict[str, int] = {}
    writers: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="psbench-writers-") as tmp:
        shard = ps.open_shard(f"{tmp}/s")
        for i in range(1, appends + 1):
            t = shard.upper
            began = time.perf_counter()
            shard.compare_and_append(_batch(t, i), t, t + 1, writer=(f"writer-{i}", 0))
            elapsed = time.perf_counter() - began
            shard._maybe_compact()
            if start_at <= i < start_at + window:
                early.append(elapsed)
            if i > appends - window:
                late.append(elapsed)
            if i in (start_at, appends):
                state = shard.inspect.state()
                key = "at_100" if i == start_at else "at_end"
                state_bytes[key] = len(encode_rollup(state))
                writers[key] = len(state.writers)
        assert shard.snapshot().num_rows == appends
    return {
        "title": "Bounded metadata: 10,000 appends from 10,000 writer ids",
        "description": (
            f"{appends} one-row appends, each from a new streaming writer id, each followed by "
            f"the writer's small compaction; per-commit times of {window} commits from the "
            f"100th and of the last {window}. State bytes: {state_bytes['at_100']} at the "
            f"100th commit ({writers['at_100']} writer records), {state_bytes['at_end']} at "
            f"the last ({writers['at_end']} writer records)."
        ),
        "params": {"appends": appends, "window": window},
        "measurements": [
            measurement(
                "one append commit (compare-and-append with a writer record)",
                OURS,
                ANCHOR,
                late,
                early,
                target=1.2,
                extra={"state_bytes": state_bytes, "writer_records": writers},
            )
        ],
    }
