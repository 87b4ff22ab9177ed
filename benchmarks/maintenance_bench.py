"""Maintenance that runs itself: many small Python appends with no manual compaction call.

``appends`` appends of 1,000 rows each (id, name, amount; distinct ids) into a fresh shard on
local files through `Shard.append` with the default ``maintenance=True``: each commit is
followed by the writer's bounded after-commit maintenance
(`persistshard.core.maintenance.auto`). Nobody calls `compact`. Measured:

1. ``batches left``: the trace's batches after the appends, against ``log2(appends)`` (the
   target is "about log2(N) + a few": the figure's target is log2(N) + 4 over log2(N)).
2. ``table read``: ``scan().to_arrow()`` of a freshly opened handle of that shard (the rows,
   each repeated by its count, in no promised order: what a Spark read and a Python scan
   return) against the same read of a shard holding the same updates written by one append.
   ``3 * rounds`` reads each, alternating. Target: at most 1.2.
   ``snapshot read``: the same with `Shard.snapshot()`, which also promises one row per
   distinct row with its count, sorted by row, so it consolidates across batches (a merge of
   their sorted runs and a gather of every column), where the one append's single part at a
   single time is already that answer. Reported, no target.
3. ``append time with maintenance``: total time of the appends with maintenance on against
   the same appends into another fresh shard with ``maintenance=False`` (what the bounded
   maintenance costs the writer; no target, reported).

``rounds`` rounds each build both shards anew (alternating order).
"""

from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import persistshard as ps

APPEND_ROWS = 1_000


def _table(ids: np.ndarray, amounts: np.ndarray) -> pa.Table:
    names = pa.array([f"customer-{i % 50_000:05d}" for i in ids.tolist()], pa.string())
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "name": names, "amount": pa.array(amounts, pa.int64())}
    )


def _appends(path: Path, everything: pa.Table, n: int, maintenance: bool) -> tuple[ps.Shard, float]:
    shard = ps.open_shard(str(path), maintenance=maintenance)
    began = time.perf_counter()
    for i in range(n):
        shard.append(everything.slice(i * APPEND_ROWS, APPEND_ROWS))
    return shard, time.perf_counter() - began


def _read(location: str) -> float:
    began = time.perf_counter()
    ps.open_shard(location).scan().to_arrow()
    return time.perf_counter() - began


def _snapshot(location: str) -> float:
    began = time.perf_counter()
    ps.open_shard(location).snapshot()
    return time.perf_counter() - began


def _s(v: list[float]) -> dict[str, float]:
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def run(appends: int = 1000, rounds: int = 3) -> dict[str, Any]:
    """Run the measurements of the module docstring with ``appends`` appends."""
    rng = np.random.default_rng(3)
    total = appends * APPEND_ROWS
    everything = _table(rng.permutation(total).astype(np.int64), rng.integers(0, 10**6, total))
    root = Path(tempfile.mkdtemp(prefix="maintenance-bench-"))
    on_seconds: list[float] = []
    off_seconds: list[float] = []
    try:
        for r in range(max(1, rounds)):
            order = [True, False] if r % 2 == 0 else [False, True]
            for maintained in order:
                path = root / f"{'on' if maintained else 'off'}{r}"
                shard, seconds = _appends(path, everything, appends, maintained)
                (on_seconds if maintained else off_seconds).append(seconds)
                if maintained:
                    kept = shard
            if r:
                shutil.rmtree(root / f"off{r - 1}", ignore_errors=True)
                shutil.rmtree(root / f"on{r - 1}", ignore_errors=True)
        state = kept.state()
        levels = [(b.level, b.num_rows) for b in state.trace]
        one = ps.open_shard(str(root / "one"), maintenance=False)
        one.append(everything)
        assert kept.snapshot().equals(one.snapshot()), "maintenance changed the table"
        assert kept.scan().to_arrow().sort_by("id").equals(one.scan().to_arrow().sort_by("id"))
        reads: dict[Any, tuple[list[float], list[float]]] = {_read: ([], []), _snapshot: ([], [])}
        for how, (ours_t, anchor_t) in reads.items():
            how(kept.location), how(one.location)  # warm-up
            for r in range(3 * max(1, rounds)):
                pair = [(kept.location, ours_t), (one.location, anchor_t)]
                for location, out in pair if r % 2 == 0 else reversed(pair):
                    out.append(how(location))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bound = math.log2(appends)
    batches = len(levels)
    measurements = [
        {
            "what": f"batches left after {appends} appends of {APPEND_ROWS:,} rows",
            "ours": "trace batches, no manual call",
            "anchor": f"log2({appends})",
            "unit": "batches",
            "ours_rounds": [float(batches)],
            "anchor_rounds": [bound],
            "target": round((bound + 4) / bound, 2),
            "note": f"levels and rows of the batches left: {levels}",
        },
        {
            "what": f"table read (scan().to_arrow()) after {appends} maintained appends",
            "ours": "appends with maintenance",
            "anchor": "one append of the same rows",
            "ours_rounds": reads[_read][0],
            "anchor_rounds": reads[_read][1],
            "target": 1.2,
            "note": "each read opens the shard anew (head, newest rollup, later entries)",
        },
        {
            "what": f"snapshot() after {appends} maintained appends (consolidated, sorted)",
            "ours": "appends with maintenance",
            "anchor": "one append of the same rows",
            "ours_rounds": reads[_snapshot][0],
            "anchor_rounds": reads[_snapshot][1],
            "note": (
                "merges the batches' sorted runs and gathers every column; the one append's "
                "single part at a single time is already sorted and consolidated"
            ),
        },
        {
            "what": f"{appends} appends with maintenance on",
            "ours": "maintenance=True (default)",
            "anchor": "maintenance=False",
            "ours_rounds": on_seconds,
            "anchor_rounds": off_seconds,
            "note": "what the bounded after-commit maintenance costs the writer in total",
        },
    ]
    result: dict[str, Any] = {
        "name": "maintenance",
        "title": "Maintenance that runs itself",
        "description": (
            "Many small Python appends with the default after-commit maintenance and no "
            "manual compaction; see `benchmarks/maintenance_bench.py`."
        ),
        "params": {"appends": appends, "append_rows": APPEND_ROWS},
        "measurements": measurements,
        "notes": [
            f"With no manual call the trace ended at {batches} batches (levels "
            f"{[lvl for lvl, _ in levels]}), against log2({appends}) = {bound:.1f}. Bounded "
            "writer maintenance never runs the whole-trace merge, so a snapshot still "
            "consolidates several sorted runs; an explicit `compact` leaves one (the "
            "compaction section)."
        ],
    }
    result["figures"] = {
        m["what"]: {
            "ours": _s(m["ours_rounds"]),
            "anchor": _s(m["anchor_rounds"]),
        }
        for m in measurements
    }
    return result
