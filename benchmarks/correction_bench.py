"""The Correction buffer against a naive sort-and-group, and against itself at other sizes.

Updates have rows ``(k BIGINT, name STRING)`` drawn from a pool of distinct rows, ``_diff``
+1 or -1, and are inserted in Arrow batches of 1,000 rows. ``size_factor`` 1.0 is the size of
issue 4 (10M updates over 100k distinct rows); 0.1 is a quick run. Four measurements, each
``rounds`` times (the contenders alternate within a round, the order rotating between rounds;
ratios are per round and reported as medians):

1. ``single read``: insert every update (times 0 to 9), then read everything before 10 once.
   Ours: `Correction.insert` per batch, then `updates_before`. Naive anchor: keep the batches
   in a list, concatenate them and sort-and-group (`rows.consolidate`) at the read. Target:
   ratio at most 1.0.
2. ``100 rounds``: the same updates in 100 steps; step ``s`` inserts its share at time ``s``,
   advances since to ``s`` and reads everything before ``s + 1``. The naive anchor
   concatenates, advances and sorts everything held at every read. Target: ratio at most 0.2
   (5x faster).
3. ``far future``: reading the updates before ``upper`` (1% of the updates, newly inserted at
   the time below it) from a buffer that also holds all the updates as retractions far beyond
   ``upper``, against the same read from a buffer without them. Target: at most 1.2.
4. ``insert cost``: insert time per update while the buffer grows from 70% to 100% of all
   the updates, against the same from 7% to 10% of them (times spread over 2**20 values so
   that almost nothing consolidates: the buffer really holds them). Target: at most 1.5.

The Correction's ``chunk_bytes`` is its default, 4 MiB, at size factor 1 and scales with the
factor below it (at least 64 KiB), so that a quick run has as many chunks as a full one.

    .venv/bin/python -m benchmarks.correction_bench --size-factor 0.1 --rounds 3

``run`` returns the harness's result shape (``benchmarks.harness``) plus ``figures``: per
measurement the median, min and max of each side and the per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core import rows
from persistshard.core.write.correction import Correction

SCHEMA = pa.schema(
    [("k", pa.int64()), ("name", pa.string()), ("_time", pa.int64()), ("_diff", pa.int64())]
)
BATCH = 1_000
FULL_UPDATES = 10_000_000
FULL_DISTINCT = 100_000
STEPS = 100
CHUNK_BYTES = 4 << 20
chunk_bytes = CHUNK_BYTES
"""The Correction's chunk size; `run` scales it with the size factor (64 KiB to 4 MiB)."""


def make_updates(n: int, distinct: int, times: np.ndarray, seed: int) -> pa.Table:
    """``n`` updates over ``distinct`` rows at the given ``times``, diffs +1 or -1."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, distinct, n)
    names = pa.array([f"row-{i:07d}" for i in range(distinct)]).take(pa.array(keys))
    diffs = rng.choice(np.array([-1, 1], dtype=np.int64), n)
    return pa.table(
        {"k": keys, "name": names, "_time": times.astype(np.int64), "_diff": diffs},
        schema=SCHEMA,
    )


def batches(table: pa.Table) -> Iterator[pa.Table]:
    for start in range(0, table.num_rows, BATCH):
        yield table.slice(start, BATCH)


def naive_read(held: list[pa.Table], upper: int, since: int) -> pa.Table:
    """Concatenate everything, keep times below ``upper``, advance to since, sort and group."""
    table = pa.concat_tables(held)
    table = table.filter(pc.less(table.column("_time"), upper))
    return rows.consolidate(rows.advance_times(table, since), order="time_row")


def count(batches: Iterator[pa.RecordBatch]) -> int:
    return sum(b.num_rows for b in batches)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def alternate(
    contenders: dict[str, Callable[[], tuple[float, Any]]], rounds: int
) -> dict[str, list[float]]:
    """Each contender once per round, order rotating; returns per-round seconds."""
    names = list(contenders)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            seconds, _ = contenders[name]()
            out[name].append(seconds)
    return out


def measurement(
    what: str, ours: str, anchor: str, o: list[float], a: list[float], target: float, note: str
) -> dict[str, Any]:
    return {
        "what": what,
        "ours": ours,
        "anchor": anchor,
        "unit": "s",
        "ours_rounds": o,
        "anchor_rounds": a,
        "target": target,
        "note": note,
    }


def single_read(updates: pa.Table) -> dict[str, Callable[[], tuple[float, Any]]]:
    def ours() -> tuple[float, Any]:
        def go() -> int:
            with Correction(SCHEMA, chunk_bytes=chunk_bytes) as c:
                for b in batches(updates):
                    c.insert(b)
                return count(c.updates_before(10))

        return timed(go)

    def naive() -> tuple[float, Any]:
        def go() -> int:
            held = []
            for b in batches(updates):
                held.append(b)
            return naive_read(held, 10, 0).num_rows

        return timed(go)

    return {"ours": ours, "naive": naive}


def interleaved(updates: pa.Table) -> dict[str, Callable[[], tuple[float, Any]]]:
    per_step = updates.num_rows // STEPS
    steps = [updates.slice(s * per_step, per_step) for s in range(STEPS)]
    steps = [
        s.set_column(2, "_time", pa.array(np.full(s.num_rows, i, dtype=np.int64)))
        for i, s in enumerate(steps)
    ]

    def ours() -> tuple[float, Any]:
        def go() -> int:
            n = 0
            with Correction(SCHEMA, chunk_bytes=chunk_bytes) as c:
                for i, step in enumerate(steps):
                    for b in batches(step):
                        c.insert(b)
                    c.advance_since(i)
                    n = count(c.updates_before(i + 1))
            return n

        return timed(go)

    def naive() -> tuple[float, Any]:
        def go() -> int:
            n = 0
            held: list[pa.Table] = []
            for i, step in enumerate(steps):
                held.extend(batches(step))
                n = naive_read(held, i + 1, i).num_rows
            return n

        return timed(go)

    return {"ours": ours, "naive": naive}


def far_future(n: int, distinct: int, rounds: int) -> tuple[list[float], list[float]]:
    """Per round: read time with n far-future retractions buffered, and without."""
    rng = np.random.default_rng(3)
    future = make_updates(n, distinct, 1_000_000_000 + rng.integers(0, 1_000_000, n), seed=4)
    future = future.set_column(3, "_diff", pa.array(np.full(n, -1, dtype=np.int64)))
    loaded = Correction(SCHEMA, chunk_bytes=chunk_bytes)
    for b in batches(future):
        loaded.insert(b)
    del future
    empty = Correction(SCHEMA, chunk_bytes=chunk_bytes)
    near = max(BATCH, n // 100)
    with_far: list[float] = []
    without: list[float] = []
    for r in range(rounds + 1):  # round 0 warms up
        fresh = make_updates(near, distinct, np.full(near, r), seed=100 + r)
        results = {}
        order = [("with", loaded), ("without", empty)]
        if r % 2:
            order.reverse()
        for label, c in order:
            for b in batches(fresh):
                c.insert(b)
            c.advance_since(r)
            seconds, got = timed(lambda c=c, r=r: count(c.updates_before(r + 1)))
            results[label] = (seconds, got)
        assert results["with"][1] == results["without"][1]
        if r:
            with_far.append(results["with"][0])
            without.append(results["without"][0])
    assert len(loaded) >= n
    loaded.close()
    empty.close()
    return with_far, without


def insert_cost(n: int, distinct: int, rounds: int) -> tuple[list[float], list[float]]:
    """Per round: seconds per update of the inserts that grow the buffer from 0.7 n to n,
    and from 0.07 n to 0.1 n (one fill; equal relative windows hold proportionally as many
    merges of the largest chains, so both costs are amortized alike)."""
    at_full: list[float] = []
    at_tenth: list[float] = []
    for r in range(rounds):
        rng = np.random.default_rng(10 + r)
        updates = make_updates(n, distinct, rng.integers(0, 1 << 20, n), 20 + r)
        marks = [0, n * 7 // 100, n // 10, n * 7 // 10, n]
        seconds = []
        c = Correction(SCHEMA, chunk_bytes=chunk_bytes)
        for lo, hi in itertools.pairwise(marks):
            part = updates.slice(lo, hi - lo)
            elapsed, _ = timed(lambda c=c, w=part: [c.insert(b) for b in batches(w)])
            seconds.append(elapsed / (hi - lo))
        at_tenth.append(seconds[1])
        at_full.append(seconds[3])
        assert len(c) >= 0.9 * n, (len(c), n)
        c.close()
        del updates, c
    return at_full, at_tenth


def _figures(o: list[float], a: list[float]) -> dict[str, Any]:
    ratios = [x / y for x, y in zip(o, a, strict=True)]

    def s(v: list[float]) -> dict[str, float]:
        return {"median": statistics.median(v), "min": min(v), "max": max(v)}

    return {"ours": s(o), "anchor": s(a), "ratio": s(ratios), "ratios": ratios}


def run(size_factor: float = 1.0, rounds: int = 3, *, rows: int | None = None) -> dict[str, Any]:
    """Run the four measurements; ``rows`` (the harness's size knob) overrides the factor."""
    global chunk_bytes
    if rows is not None:
        size_factor = rows / FULL_UPDATES
    chunk_bytes = int(min(CHUNK_BYTES, max(64 << 10, CHUNK_BYTES * size_factor)))
    n = max(STEPS * BATCH, int(FULL_UPDATES * size_factor))
    distinct = max(1_000, int(FULL_DISTINCT * size_factor))
    rng = np.random.default_rng(1)
    updates = make_updates(n, distinct, rng.integers(0, 10, n), seed=2)
    measurements = []

    single = alternate(single_read(updates), rounds + 1)
    o, a = single["ours"][1:], single["naive"][1:]
    measurements.append(
        measurement(
            f"insert {n:,} updates over {distinct:,} rows, then one read",
            "Correction",
            "concatenate + sort + group",
            o,
            a,
            1.0,
            "times 0-9, batches of 1,000; the read returns everything",
        )
    )
    steps = alternate(interleaved(updates), rounds)
    measurements.append(
        measurement(
            f"{STEPS} rounds of insert {n // STEPS:,} + advance since + read",
            "Correction",
            "concatenate + sort + group per read",
            steps["ours"],
            steps["naive"],
            0.2,
            "both advance times to since before grouping",
        )
    )
    del updates
    with_far, without = far_future(n, distinct, rounds)
    measurements.append(
        measurement(
            f"read before upper, {n:,} far-future retractions buffered",
            "with them",
            "without them",
            with_far,
            without,
            1.2,
            f"each read returns {max(BATCH, n // 100):,} new updates",
        )
    )
    at_full, at_tenth = insert_cost(n, distinct, rounds)
    measurements.append(
        measurement(
            f"insert time per update, {n:,} buffered vs {n // 10:,}",
            f"at {n:,}",
            f"at {n // 10:,}",
            at_full,
            at_tenth,
            1.5,
            "inserts growing the buffer from 70% to 100% of each size; times over 2**20 values",
        )
    )
    return {
        "name": "correction",
        "title": "Correction buffer",
        "description": (__doc__ or "").split("\n\n")[0],
        "params": {
            "size_factor": size_factor,
            "updates": n,
            "distinct_rows": distinct,
            "chunk_bytes": chunk_bytes,
        },
        "measurements": measurements,
        "figures": {
            m["what"]: _figures(m["ours_rounds"], m["anchor_rounds"]) for m in measurements
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-factor", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = run(args.size_factor, args.rounds)
    print(json.dumps(result["figures"], indent=2))


if __name__ == "__main__":
    main()
