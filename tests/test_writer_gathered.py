"""A Spark write task whose input fits its budget sorts and consolidates it once
(`persistshard.datasource.writer.write_gathered`); its parts must hold exactly what a
Correction buffer would give: sorted by (row, time), consolidated, split at the upper."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

import persistshard as ps
from persistshard.core.rows import consolidate
from persistshard.core.shard import write_transaction
from persistshard.core.storage.parts import read_part
from persistshard.core.write.validate import update_schema
from persistshard.datasource.writer import write_gathered

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _updates(ids: np.ndarray, times: np.ndarray, diffs: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i % 7}" for i in ids.tolist()]),
            "_time": pa.array(times, pa.int64()),
            "_diff": pa.array(diffs, pa.int64()),
        }
    )


def _parts(shard: ps.Shard, refs: list) -> list[pa.Table]:
    return [read_part(shard._blob, r) for r in refs]


@pytest.mark.parametrize("kind", ["ascending ids", "shuffled with duplicates"])
def test_gathered_parts_are_sorted_consolidated_and_split_at_the_upper(tmp_path, kind):
    rng = np.random.default_rng(5)
    n = 5000
    if kind == "ascending ids":
        ids = np.arange(n) * 3
    else:
        ids = rng.integers(0, n // 4, n)
    times = rng.integers(10, 20, n)
    diffs = rng.choice([-2, -1, 1, 3], n)
    pieces = [
        _updates(ids[i : i + 700], times[i : i + 700], diffs[i : i + 700]) for i in range(0, n, 700)
    ]
    whole = pa.concat_tables(pieces)
    shard = ps.open_shard(str(tmp_path / "s"))
    full = update_schema(SCHEMA)
    # A tiny part size forces several parts per side.
    txn = write_transaction(shard, "w1")
    sealed, unsealed = write_gathered(txn, list(pieces), full, 15, 20_000)
    assert len(sealed) > 1 and len(unsealed) > 1
    expected = consolidate(whole.cast(full))
    for refs, keep in ((sealed, lambda t: t < 15), (unsealed, lambda t: t >= 15)):
        tables = _parts(shard, refs)
        for t in tables:  # each part sorted by (row, time) and consolidated on its own
            assert t.equals(consolidate(t))
        got = pa.concat_tables(tables)
        want = expected.filter(pa.array(keep(expected.column("_time").to_numpy())))
        assert consolidate(got).equals(want)
        assert got.num_rows == want.num_rows  # nothing left to consolidate across parts
        assert all(r.min_time >= 15 for r in refs) or all(r.max_time < 15 for r in refs)
