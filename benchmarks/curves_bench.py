"""Compaction curves: read time against number of commits, bytes stored against overwrites.

Two pictures of what compaction is for, with the Python API on local files (no Spark):

1. **Read time against commits.** The same ``rows`` updates are appended in N commits
   (N on a ladder, e.g. 1, 10, 100, 1000), with no compaction; the snapshot read is timed,
   then `Shard.compact` runs and the read is timed again. Anchor: the same updates in one
   commit. Reads of the three shards alternate within each of ``3 * rounds`` rounds.
   Compaction itself is timed in ``rounds`` rounds, each on a fresh copy of the commits and
   next to one append of the same rows into a fresh shard (its anchor).
2. **Bytes stored against overwrites.** A table of ``rows`` rows (id, name, amount) is
   overwritten ``overwrites`` times with 1% of its amounts changed; each overwrite appends
   only the difference (a retraction of each changed row's old version and an insertion of
   the new one, what a self-correcting overwrite writes). Three shards get the same updates:
   one never compacted, one running the writer's `Shard._maybe_compact` after every commit
   (history kept: since stays at 0, so merges cannot cancel updates), and one advancing
   since to the latest time before each `maybe_compact` (no time travel kept).
   Anchor: the bytes of the current table written once into a fresh shard. After the last
   overwrite, since advances to the last time and `Shard.compact` runs on the second shard.

Bytes are those of the parts the shard's state references (log and rollups left out).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.harness import alternate, measurement
from benchmarks.spark_bench import human

CHANGED = 0.01


def _table(
    ids: np.ndarray, amounts: np.ndarray, times: np.ndarray | int, diffs: Any = 1
) -> pa.Table:
    n = len(ids)
    names = pa.array(np.char.add("name-", ids.astype(str)), pa.string())
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": names,
            "amount": pa.array(amounts, pa.int64()),
            "_time": pa.array(np.broadcast_to(np.asarray(times, np.int64), n), pa.int64()),
            "_diff": pa.array(np.broadcast_to(np.asarray(diffs, np.int64), n), pa.int64()),
        }
    )


def stored_bytes(shard: Any) -> int:
    """Bytes of every part the shard's current state references."""
    state = shard.inspect.state()
    return sum(p.size for b in (*state.trace, *state.unsealed) for p in b.parts)


def _reader(shard: Any) -> Any:
    def read() -> None:
        shard.snapshot()

    return read


def read_against_commits(
    root: Path, rows: int, commits: tuple[int, ...], rounds: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import persistshard as ps

    rng = np.random.default_rng(3)
    ids = rng.permutation(rows).astype(np.int64)
    everything = _table(ids, rng.integers(0, 10**6, rows), 0)
    # The same rows in one commit: the anchor of every read.
    one = ps.open_shard(str(root / "one"), maintenance=False)
    one.append(everything)
    expected = one.snapshot()
    measurements: list[dict[str, Any]] = []
    before_s: list[float] = []
    after_s: list[float] = []
    one_s: list[float] = []
    for n in commits:
        many = ps.open_shard(str(root / f"many-{n}"), maintenance=False)
        step = -(-rows // n)
        for i in range(n):
            piece = everything.slice(i * step, step)
            piece = piece.set_column(3, "_time", pa.array(np.full(len(piece), i, np.int64)))
            many.compare_and_append(piece, i, i + 1)
        # A copy of the same commits, left as they are (a shard is its directory).
        shutil.copytree(root / f"many-{n}", root / f"frozen-{n}")
        frozen = ps.open_shard(str(root / f"frozen-{n}"), maintenance=False)
        # Compaction is timed over ``rounds`` copies of the commits, each round next to one
        # append of the same rows into a fresh shard (so `--check` sees the rounds' spread);
        # the last compacted copy is the one read below.
        compact_s: list[float] = []
        anchor_s: list[float] = []
        for r in range(max(1, rounds)):
            fresh = ps.open_shard(str(root / f"anchor-{n}-{r}"), maintenance=False)
            started = time.perf_counter()
            fresh.append(everything)
            anchor_s.append(time.perf_counter() - started)
            shutil.rmtree(root / f"anchor-{n}-{r}", ignore_errors=True)
            if r:
                shutil.rmtree(root / f"many-{n}", ignore_errors=True)
                shutil.copytree(root / f"frozen-{n}", root / f"many-{n}")
                many = ps.open_shard(str(root / f"many-{n}"), maintenance=False)
            started = time.perf_counter()
            many.advance_since(many.upper - 1)
            many.compact()
            compact_s.append(time.perf_counter() - started)
        for shard in (many, frozen):
            if not shard.snapshot().equals(expected):
                raise AssertionError(f"{n} commits: the snapshot differs from one commit's")
        # Reads take milliseconds and swing with the machine's load: three times the rounds
        # (the time is in building the shards, not in reading them).
        t = alternate(
            {
                "before": _reader(frozen),
                "after": _reader(many),
                "one": _reader(one),
            },
            3 * rounds,
        )
        what = f"snapshot read, {human(rows)} rows in {n} commit{'s' if n > 1 else ''}"
        measurements.append(
            measurement(
                what,
                "before compaction",
                "one commit",
                t["before"],
                t["one"],
                extra={"batches": len(frozen.inspect.state().trace)},
            )
        )
        measurements.append(
            measurement(
                what,
                "after compaction",
                "one commit",
                t["after"],
                t["one"],
                note=f"compact() took {float(np.median(compact_s)):.1f} s (median), leaving "
                f"{len(many.inspect.state().trace)} batch(es)",
            )
        )
        if n > 1:
            measurements.append(
                measurement(
                    f"advance_since + compact() after {n} commits of {human(step)} rows",
                    "compaction",
                    "one append of the same rows",
                    compact_s,
                    anchor_s,
                    target=10.0 if n >= 1000 else None,
                    note="issue 14: total compaction time at most 10x one append of the rows",
                )
            )
        before_s.append(float(np.median(t["before"])) * 1000)
        after_s.append(float(np.median(t["after"])) * 1000)
        one_s.append(float(np.median(t["one"])) * 1000)
        shutil.rmtree(root / f"many-{n}", ignore_errors=True)
        shutil.rmtree(root / f"frozen-{n}", ignore_errors=True)
    series = {
        "id": "read_vs_commits",
        "title": f"Snapshot read of {human(rows)} rows against commits",
        "x_label": "commits",
        "y_label": "read time, ms (median)",
        "x": list(commits),
        "x_tick_labels": [str(c) for c in commits],
        "lines": {
            "before compaction": before_s,
            "after compaction": after_s,
            "one commit (anchor)": one_s,
        },
        "log_x": True,
        "log_y": True,
    }
    return measurements, series


def bytes_against_overwrites(
    root: Path, rows: int, overwrites: int, every: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import persistshard as ps

    rng = np.random.default_rng(4)
    ids = np.arange(rows, dtype=np.int64)
    amounts = rng.integers(0, 10**6, rows)
    plain = ps.open_shard(str(root / "plain"), maintenance=False)
    compacting = ps.open_shard(str(root / "compacting"), maintenance=False)
    trailing = ps.open_shard(str(root / "trailing"), maintenance=False)
    for shard in (plain, compacting, trailing):
        shard.append(_table(ids, amounts, 0))
    xs: list[int] = []
    plain_b: list[float] = []
    compacting_b: list[float] = []
    trailing_b: list[float] = []
    anchor_b: list[float] = []

    def record(k: int) -> None:
        fresh = ps.open_shard(str(root / f"snapshot-{k}"), maintenance=False)
        fresh.append(_table(ids, amounts, 0))
        xs.append(k)
        plain_b.append(stored_bytes(plain) / 2**20)
        compacting_b.append(stored_bytes(compacting) / 2**20)
        trailing_b.append(stored_bytes(trailing) / 2**20)
        anchor_b.append(stored_bytes(fresh) / 2**20)
        shutil.rmtree(root / f"snapshot-{k}", ignore_errors=True)

    record(0)
    for k in range(1, overwrites + 1):
        changed = np.sort(rng.choice(rows, max(1, int(rows * CHANGED)), replace=False))
        old = amounts[changed].copy()
        amounts[changed] = rng.integers(0, 10**6, len(changed))
        delta = pa.concat_tables(
            [_table(ids[changed], old, k, -1), _table(ids[changed], amounts[changed], k, 1)]
        )
        for shard in (plain, compacting, trailing):
            shard.compare_and_append(delta, k, k + 1)
        compacting._maybe_compact()
        trailing.advance_since(k)
        trailing._maybe_compact()
        if k % every == 0 or k == overwrites:
            record(k)
    compacting.advance_since(compacting.upper - 1)
    compacting.compact()
    final = stored_bytes(compacting) / 2**20
    n = human(rows)
    measurements = [
        measurement(
            f"bytes after {overwrites} overwrites of {n} rows (1% changed each)",
            label,
            "one compacted snapshot",
            [value * 2**20],
            [anchor_b[-1] * 2**20],
            unit="bytes",
        )
        for label, value in (
            ("no compaction", plain_b[-1]),
            ("maybe_compact after each write", compacting_b[-1]),
            ("advance_since + maybe_compact after each write", trailing_b[-1]),
            ("then advance_since + compact", final),
        )
    ]
    series = {
        "id": "bytes_vs_overwrites",
        "title": f"Bytes stored against overwrites of {n} rows, 1% changed each",
        "x_label": "overwrites",
        "y_label": "MiB referenced by the state",
        "x": xs,
        "lines": {
            "no compaction": plain_b,
            "maybe_compact after each write": compacting_b,
            "advance_since + maybe_compact after each write": trailing_b,
            "one compacted snapshot (anchor)": anchor_b,
        },
    }
    return measurements, series


def run(
    rows: int = 1_000_000,
    commits: tuple[int, ...] = (1, 10, 100, 1000),
    overwrites: int = 50,
    every: int = 5,
    rounds: int = 5,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="psbench-curves-"))
    try:
        reads, read_series = read_against_commits(root, rows, commits, rounds)
        sizes, bytes_series = bytes_against_overwrites(root, rows, overwrites, every)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "title": "Compaction curves: read time against commits, bytes against overwrites",
        "description": (
            f"Python API, local files. Read: {human(rows)} rows appended in N commits "
            f"(N = {', '.join(map(str, commits))}), snapshot read before and after "
            "`advance_since` + `compact`, against the same rows in one commit. Bytes: "
            f"{human(rows)} rows overwritten {overwrites} times with 1% changed (only the "
            "difference appended), never compacted, with `maybe_compact` after each write, "
            "or with `advance_since` + `maybe_compact`, against the same table written once. "
            "See `benchmarks/curves_bench.py`."
        ),
        "params": {
            "rows": rows,
            "commits": list(commits),
            "overwrites": overwrites,
            "changed": CHANGED,
        },
        "measurements": reads + sizes,
        "series": [read_series, bytes_series],
    }
