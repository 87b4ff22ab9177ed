"""Peak memory of reading a shard outside Spark: whole-table reads against streamed scans.

Builds a shard of ``rows`` rows of five columns (id, name of 16 characters, value, a second
string, a flag), written at time 0 in one append; and, for the snapshot that needs
consolidation across chunks, a second shard with the same rows plus an append at time 1 that
retracts half of them and inserts them with a new value. Each read then runs in a fresh Python
process, which samples its resident set every 2 ms during the read and reports the largest
sample minus the resident set just before the read, so a figure is what the read itself took
(a peak shorter than 2 ms may be missed). Reads: ``Shard.snapshot()`` (the whole table),
``scan().to_arrow()``, ``scan().to_batches()`` consumed batch by batch and dropped, and
``scan(columns=["value"]).to_batches()``.

Run: ``python -m benchmarks.scan_memory [rows]`` (default 2,000,000: the machine is shared).
Not part of the recorded benchmarks: no targets, figures for docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa

READS = {
    "snapshot()": "shard.snapshot()",
    "scan().to_arrow()": "shard.scan().to_arrow()",
    "scan().to_batches()": "sum(b.num_rows for b in shard.scan().to_batches())",
    "scan(columns=[value]).to_batches()": (
        "sum(b.num_rows for b in shard.scan(columns=['value']).to_batches())"
    ),
}

_CHILD = """
import json, os, sys, threading, time
import persistshard as ps
import pyarrow

page = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page


peak = [0]
done = threading.Event()


def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)


shard = ps.open_shard(sys.argv[1], maintenance=False)
before = rss()
sampler = threading.Thread(target=sample)
sampler.start()
result = {expr}
done.set()
sampler.join()
rows = result if isinstance(result, int) else result.num_rows
print(json.dumps({{"peak_mib": (max(peak[0], rss()) - before) / 2**20, "rows": rows}}))
"""


def make_updates(rows: int, time: int, seed: int = 7, start: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=rows * 8, dtype=np.uint8).tobytes()
    names = pa.array(np.frombuffer(raw.hex().encode(), dtype="S16")).cast(pa.string())
    return pa.table(
        {
            "id": pa.array(np.arange(start, start + rows, dtype=np.int64)),
            "name": names,
            "value": pa.array(rng.random(rows)),
            "tag": pa.array(np.char.add("t", (np.arange(rows) % 97).astype(str))),
            "flag": pa.array(np.arange(rows) % 3 == 0),
            "_time": pa.array(np.full(rows, time, dtype=np.int64)),
            "_diff": pa.array(np.ones(rows, dtype=np.int64)),
        }
    )


def build(root: str, rows: int) -> dict[str, str]:
    import persistshard as ps

    plain = os.path.join(root, "plain")
    ps.open_shard(plain, maintenance=False).append(make_updates(rows, 0), new_upper=1)
    changed = os.path.join(root, "changed")
    shard = ps.open_shard(changed, maintenance=False)
    base = make_updates(rows, 0)
    shard.append(base, new_upper=1)
    half = base.slice(0, rows // 2)
    retract = half.set_column(6, "_diff", pa.array(np.full(half.num_rows, -1, dtype=np.int64)))
    retract = retract.set_column(5, "_time", pa.array(np.ones(half.num_rows, dtype=np.int64)))
    insert = make_updates(rows // 2, 1, seed=8)
    insert = insert.set_column(1, "name", half.column("name"))
    shard.append(pa.concat_tables([retract, insert]), new_upper=2)
    return {"one append": plain, "two appends (consolidation)": changed}


def peak_mib(location: str, expr: str) -> dict[str, float]:
    code = _CHILD.format(expr=expr)
    out = subprocess.run(
        [sys.executable, "-c", code, location], check=True, capture_output=True, text=True
    )
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return {"peak_mib": round(float(answer["peak_mib"]), 1), "rows": answer["rows"]}


def run(rows: int = 2_000_000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as root:
        shards = build(root, rows)
        figures: dict[str, dict[str, dict[str, float]]] = {}
        for name, location in shards.items():
            figures[name] = {label: peak_mib(location, expr) for label, expr in READS.items()}
    return {"rows": rows, "peak_mib": figures}


if __name__ == "__main__":
    result = run(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)
    print(json.dumps(result, indent=2))
