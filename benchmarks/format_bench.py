"""Part format speed and size against pyarrow's Parquet (zstd) and Arrow IPC (zstd).

One table of `size` rows: id BIGINT (ascending), name STRING (12 to 20 random letters and
digits), value DOUBLE (standard normal), `_time` (1000 distinct values), `_diff` (+1 or -1).
Every round measures, for each format, a write to memory, a full read and a read of one
column (`value`); within a round the formats alternate (each operation `inner` times, the
fastest kept) and the order rotates from round to round, so that the load of a shared
machine does not favour one of them. Ratios are computed per round and reported as
medians; every format uses its library's default zstd level (ours 1, Arrow's 1).

    .venv/bin/python benchmarks/format_bench.py --size 2000000 --rounds 5

Ratios (targets from issue 3): read_speed_vs_parquet = parquet time / our time (>= 1),
write_speed_vs_parquet (>= 0.8), size_vs_parquet = our bytes / Parquet bytes (<= 1.2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from persistshard.format import PartReader, encode_part

PROJECTED = "value"
_ALPHABET = np.frombuffer(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8
)


def make_table(size: int, seed: int = 42) -> pa.Table:
    """The benchmark table (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(12, 21, size)
    offsets = np.zeros(size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    chars = _ALPHABET[rng.integers(0, len(_ALPHABET), int(offsets[-1]))]
    names = pa.Array.from_buffers(
        pa.string(), size, [None, pa.py_buffer(offsets), pa.py_buffer(chars)]
    )
    return pa.table(
        {
            "id": np.arange(size, dtype=np.int64),
            "name": names,
            "value": rng.standard_normal(size),
            "_time": rng.integers(0, 1000, size),
            "_diff": np.where(rng.random(size) < 0.9, 1, -1).astype(np.int64),
        }
    )


class Format:
    name = ""

    def write(self, table: pa.Table) -> Any:
        raise NotImplementedError

    def read(self, data: Any) -> pa.Table:
        raise NotImplementedError

    def read_column(self, data: Any, column: str) -> pa.Table:
        raise NotImplementedError

    def size(self, data: Any) -> int:
        return len(data)


class Ours(Format):
    name = "persistshard"

    def write(self, table: pa.Table) -> bytes:
        return encode_part(table)[0]

    def read(self, data: bytes) -> pa.Table:
        return PartReader.from_bytes("bench", data).read()

    def read_column(self, data: bytes, column: str) -> pa.Table:
        return PartReader.from_bytes("bench", data).read([column])


class Parquet(Format):
    name = "parquet"

    def write(self, table: pa.Table) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue()

    def read(self, data: pa.Buffer) -> pa.Table:
        return pq.read_table(pa.BufferReader(data))

    def read_column(self, data: pa.Buffer, column: str) -> pa.Table:
        return pq.read_table(pa.BufferReader(data), columns=[column])

    def size(self, data: pa.Buffer) -> int:
        return int(data.size)


class ArrowIpc(Format):
    name = "arrow_ipc"

    def write(self, table: pa.Table) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        with ipc.new_file(
            sink, table.schema, options=ipc.IpcWriteOptions(compression="zstd")
        ) as writer:
            writer.write_table(table)
        return sink.getvalue()

    def read(self, data: pa.Buffer) -> pa.Table:
        return ipc.open_file(data).read_all()

    def read_column(self, data: pa.Buffer, column: str) -> pa.Table:
        reader = ipc.open_file(data)
        index = reader.schema.get_field_index(column)
        return ipc.open_file(data, options=ipc.IpcReadOptions(included_fields=[index])).read_all()

    def size(self, data: pa.Buffer) -> int:
        return int(data.size)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


OPERATIONS = ("write", "read", "read_column")
ANCHORS = ("parquet", "arrow_ipc")
# Targets of issue 3 as time ratios ours / Parquet (lower is better): write at least 0.8x
# Parquet's speed, read at least as fast, size within 1.2x.
TIME_TARGETS = {"write": 1 / 0.8, "read": 1.0, "read_column": 1.0}
SIZE_TARGET = 1.2


def run(size: int = 2_000_000, rounds: int = 5, inner: int = 2) -> dict[str, Any]:
    """Measure every format `rounds` times; medians/min/max per measurement, ratios per round.

    Within a round each operation runs `inner` times per format, the formats alternating in
    the round's order, and the round keeps each format's fastest run. Speed ratios are
    anchor time / our time (higher is better). The result also carries `measurements` in
    the shape of benchmarks/harness.py (time ratios ours / anchor, lower is better).
    """
    table = make_table(size)
    formats: list[Format] = [Ours(), Parquet(), ArrowIpc()]
    times: dict[str, list[float]] = {f"{f.name}.{op}": [] for f in formats for op in OPERATIONS}
    sizes: dict[str, int] = {}
    for fmt in formats:  # warm up thread pools and allocators; check that ours round-trips
        out = fmt.read(fmt.write(table))
        if fmt.name == "persistshard" and not out.equals(table):
            raise AssertionError("persistshard did not read back what it wrote")
        del out
    for r in range(rounds):
        order = formats[r % len(formats) :] + formats[: r % len(formats)]
        best: dict[str, float] = {}
        stored: dict[str, Any] = {}
        for _ in range(inner):
            for fmt in order:
                t, stored[fmt.name] = _timed(lambda fmt=fmt: fmt.write(table))  # type: ignore[misc]
                best[f"{fmt.name}.write"] = min(t, best.get(f"{fmt.name}.write", t))
        for op in ("read", "read_column"):
            for _ in range(inner):
                for fmt in order:
                    data = stored[fmt.name]
                    if op == "read":
                        t, _ = _timed(lambda fmt=fmt, data=data: fmt.read(data))  # type: ignore[misc]
                    else:
                        t, _ = _timed(lambda fmt=fmt, data=data: fmt.read_column(data, PROJECTED))  # type: ignore[misc]
                    key = f"{fmt.name}.{op}"
                    best[key] = min(t, best.get(key, t))
        for key, t in best.items():
            times[key].append(t)
        for fmt in formats:
            sizes[fmt.name] = fmt.size(stored[fmt.name])
        del stored
    ratios: dict[str, list[float]] = {}
    for other in ANCHORS:
        for op in OPERATIONS:
            ours_t, other_t = times[f"persistshard.{op}"], times[f"{other}.{op}"]
            ratios[f"{op}_speed_vs_{other}"] = [o / s for s, o in zip(ours_t, other_t, strict=True)]
    return {
        "title": "File format",
        "description": (
            f"Part files (`format/`) against pyarrow's Parquet (zstd) and Arrow IPC (zstd), in "
            f"memory, one process: a {size:,}-row table (id BIGINT, name STRING of 12-20 "
            "characters, value DOUBLE, `_time`, `_diff`); write, full read, read of `value` "
            "alone, and file size."
        ),
        "params": {"rows": size, "inner": inner},
        "rows": size,
        "rounds": rounds,
        "table_bytes": table.nbytes,
        "timings": {k: _summary(v) for k, v in times.items()},
        "bytes": sizes,
        "size_vs_parquet": sizes["persistshard"] / sizes["parquet"],
        "size_vs_arrow_ipc": sizes["persistshard"] / sizes["arrow_ipc"],
        "ratios_per_round": ratios,
        "ratios": {k: statistics.median(v) for k, v in ratios.items()},
        "measurements": _measurements(times, sizes),
    }


_WHAT = {"write": "write", "read": "read all columns", "read_column": "read one column of five"}
_LABEL = {"parquet": "Parquet (zstd)", "arrow_ipc": "Arrow IPC (zstd)"}


def _measurements(times: dict[str, list[float]], sizes: dict[str, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for other in ANCHORS:
        for op in OPERATIONS:
            out.append(
                {
                    "what": _WHAT[op],
                    "ours": "persistshard part",
                    "anchor": _LABEL[other],
                    "unit": "s",
                    "ours_rounds": times[f"persistshard.{op}"],
                    "anchor_rounds": times[f"{other}.{op}"],
                    "target": TIME_TARGETS[op] if other == "parquet" else None,
                }
            )
        out.append(
            {
                "what": "file size",
                "ours": "persistshard part",
                "anchor": _LABEL[other],
                "unit": "bytes",
                "ours_rounds": [sizes["persistshard"]],
                "anchor_rounds": [sizes[other]],
                "target": SIZE_TARGET if other == "parquet" else None,
            }
        )
    return out


def _print(result: dict[str, Any]) -> None:
    mb = result["table_bytes"] / 1e6
    print(f"{result['rows']:,} rows ({mb:.1f} MB in Arrow), {result['rounds']} rounds")
    print(f"{'measurement':32} {'median s':>9} {'min s':>9} {'max s':>9}")
    for name, s in result["timings"].items():
        print(f"{name:32} {s['median']:9.4f} {s['min']:9.4f} {s['max']:9.4f}")
    for name, b in result["bytes"].items():
        print(f"size {name:27} {b / 1e6:9.2f} MB")
    print(f"size_vs_parquet {result['size_vs_parquet']:.3f}", end="   ")
    print(f"size_vs_arrow_ipc {result['size_vs_arrow_ipc']:.3f}")
    for name, v in result["ratios"].items():
        per_round = " ".join(f"{x:.2f}" for x in result["ratios_per_round"][name])
        print(f"{name:32} median {v:.2f}   rounds: {per_round}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--inner", type=int, default=2, help="runs per format and round (fastest kept)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    out = run(args.size, args.rounds, args.inner)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
