"""Small helpers shared by the tests."""

from __future__ import annotations

import pyarrow as pa


def rows_of(table: pa.Table) -> dict[tuple, int]:
    """A snapshot as {row tuple: diff}; fails if a row appears twice (not consolidated)."""
    out: dict[tuple, int] = {}
    names = [n for n in table.column_names if n != "_diff"]
    for r in table.to_pylist():
        key = tuple(r[n] for n in names)
        assert key not in out, f"row {key} appears twice"
        out[key] = r["_diff"]
    return out


def updates(rows: list[tuple[int, str, int, int]]) -> pa.Table:
    """Updates with columns ``id BIGINT, item STRING`` from (id, item, time, diff) tuples."""
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "item": pa.array([r[1] for r in rows], pa.string()),
            "_time": pa.array([r[2] for r in rows], pa.int64()),
            "_diff": pa.array([r[3] for r in rows], pa.int64()),
        }
    )
