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
