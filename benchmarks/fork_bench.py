"""Forks: what a zero-copy fork of a large shard writes and costs, against copying it.

One shard of ``rows`` rows (``id`` and a random ``value``, both int64, appended in batches of
a million rows: a part each). Each round forks it to a fresh location (`Shard.fork`, at the
default ``as_of``) and, alternating, copies its files as durably as the fork writes its own
(each file written and fsynced, each directory fsynced: what a clone without shared parts
must at least do to survive a crash as the fork does), and copies them without any sync
(``shutil.copytree``: the page cache only, shown for reference, no target). Times are per
fork and per copy; the fork is dropped and the copies removed after each round, outside the
timing. Bytes:
what the fork wrote (every file under the fork's location, plus what the source's log grew
by: the pin) against the shard's bytes. Targets (issue 39): bytes <= 1% of the shard's, time
<= 0.1x the copy's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.anchors import directory_bytes
from benchmarks.harness import alternate, measurement

OURS = "Shard.fork"
ANCHOR = "durable copy of the shard's files"
UNSYNCED = "copytree, no sync"
BATCH = 1_000_000


def _log_bytes(path: str) -> int:
    return directory_bytes(os.path.join(path, "consensus")) + directory_bytes(
        os.path.join(path, "rollups")
    )


def _durable_copy(src: str, dst: str) -> None:
    """Copy every file under ``src`` to ``dst``, each fsynced, then every directory fsynced
    (what `persistshard.core.storage.blob` does for each object it puts on local disk)."""
    for root, _dirs, names in os.walk(src):
        target = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(target, exist_ok=True)
        for name in names:
            with (
                open(os.path.join(root, name), "rb") as f,
                open(os.path.join(target, name), "wb") as out,
            ):
                shutil.copyfileobj(f, out, 8 << 20)
                out.flush()
                os.fsync(out.fileno())
    for root, _, _ in os.walk(dst):
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def run(rows: int = 16_000_000, rounds: int = 3) -> dict[str, Any]:
    import persistshard as ps

    rng = np.random.default_rng(39)
    with tempfile.TemporaryDirectory(prefix="psbench-fork-") as tmp:
        src_path = os.path.join(tmp, "src")
        src = ps.open_shard(src_path, maintenance=False)
        for start in range(0, rows, BATCH):
            n = min(BATCH, rows - start)
            src.append(
                pa.table(
                    {
                        "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                        "value": pa.array(rng.integers(0, 1 << 62, n, dtype=np.int64)),
                    }
                )
            )
        shard_bytes = directory_bytes(src_path)
        written: list[float] = []
        counter = iter(range(1 << 30))

        def fork() -> float:
            dst = os.path.join(tmp, f"fork-{next(counter)}")
            log_before = _log_bytes(src_path)
            started = time.perf_counter()
            forked = src.fork(dst)
            elapsed = time.perf_counter() - started
            written.append(float(directory_bytes(dst) + _log_bytes(src_path) - log_before))
            assert forked.upper == src.upper
            forked.drop()
            return elapsed

        def copy() -> float:
            dst = os.path.join(tmp, f"copy-{next(counter)}")
            started = time.perf_counter()
            _durable_copy(src_path, dst)
            elapsed = time.perf_counter() - started
            shutil.rmtree(dst)
            return elapsed

        def copytree() -> float:
            dst = os.path.join(tmp, f"tree-{next(counter)}")
            started = time.perf_counter()
            shutil.copytree(src_path, dst)
            elapsed = time.perf_counter() - started
            shutil.rmtree(dst)
            return elapsed

        times = alternate({OURS: fork, ANCHOR: copy, UNSYNCED: copytree}, rounds)
        written = written[-rounds:]
    label = f"{rows / 1e6:g}M rows"
    return {
        "title": "Forks: a zero-copy fork vs copying the shard",
        "description": (
            f"A shard of {label} (two int64 columns, one part per million rows, "
            f"{shard_bytes / 1e6:.0f} MB on local disk). Each round forks it to a new location "
            "(`Shard.fork`, default as_of; durable: every put fsynced), copies its files as "
            "durably (each file and directory fsynced) and copies them without a sync "
            "(`shutil.copytree`, reference only), alternating; the fork is dropped and the "
            "copies removed outside the timing. Bytes written by the fork: every file at its "
            "location plus what the source's log grew by (its pin)."
        ),
        "params": {"rows": rows, "shard_bytes": shard_bytes},
        "measurements": [
            measurement(
                f"fork a shard of {label}",
                OURS,
                ANCHOR,
                times[OURS],
                times[ANCHOR],
                target=0.1,
            ),
            measurement(
                f"fork a shard of {label} (reference: a copy that syncs nothing)",
                OURS,
                UNSYNCED,
                times[OURS],
                times[UNSYNCED],
            ),
            measurement(
                f"bytes written by the fork of {label}",
                "bytes the fork wrote",
                "bytes of the shard",
                written,
                [float(shard_bytes)] * len(written),
                target=0.01,
                unit="bytes",
            ),
        ],
    }
