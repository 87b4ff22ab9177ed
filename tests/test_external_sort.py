"""ExternalSort (core/write/external.py): a write task's updates sorted by (row, time) and
consolidated in bounded memory, and the Spark write task's large-input path built on it."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.rows import consolidate
from persistshard.core.storage.parts import read_part
from persistshard.core.write.external import ExternalSort
from persistshard.core.write.validate import update_schema

SCHEMA = update_schema(pa.schema([("id", pa.int64()), ("name", pa.string())]))


def _updates(ids: np.ndarray, times: np.ndarray, diffs: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i % 7}" for i in ids.tolist()]),
            "_time": pa.array(times, pa.int64()),
            "_diff": pa.array(diffs, pa.int64()),
        },
        schema=SCHEMA,
    )


def _pieces(ids: np.ndarray, times: np.ndarray, diffs: np.ndarray, size: int) -> list[pa.Table]:
    n = len(ids)
    return [
        _updates(ids[i : i + size], times[i : i + size], diffs[i : i + size])
        for i in range(0, n, size)
    ]


def _sorted_all(pieces: list[pa.Table], tmp_path, **kwargs) -> tuple[pa.Table, dict[str, int]]:
    with ExternalSort(SCHEMA, spill_dir=str(tmp_path), **kwargs) as sorter:
        for p in pieces:
            sorter.insert(p)
        out = list(sorter.sorted())
        stats = dict(sorter.stats)
    table = pa.concat_tables(out) if out else SCHEMA.empty_table()
    return table, stats


@pytest.mark.parametrize("fan_in", [2, 16])
def test_merged_runs_equal_one_consolidation(tmp_path, fan_in):
    """Shuffled updates with repeated rows, cancelling pairs and several times: the output is
    exactly the consolidation of everything inserted, in order, whatever the number of runs
    (fan_in 2 forces merge passes over merged runs)."""
    rng = np.random.default_rng(11)
    n = 30_000
    ids = rng.integers(0, 3_000, n)
    times = rng.integers(0, 4, n)
    diffs = rng.choice([-2, -1, 1, 3], n)
    # Cancelling pairs far apart, so they land in different runs.
    ids = np.concatenate([ids, ids[:500]])
    times = np.concatenate([times, times[:500]])
    diffs = np.concatenate([diffs, -diffs[:500]])
    pieces = _pieces(ids, times, diffs, 700)
    got, stats = _sorted_all(pieces, tmp_path, run_bytes=40_000, fan_in=fan_in)
    assert stats["runs_spilled"] >= 8 and stats["concatenated"] == 0
    if fan_in == 2:
        assert stats["merge_passes"] > 1
    want = consolidate(pa.concat_tables(pieces))
    assert got.equals(want)
    assert os.listdir(tmp_path) == []  # the spill directory is deleted on close


def test_runs_already_in_row_order_are_concatenated(tmp_path):
    """Ascending distinct ids (a range read in order): runs are neither sorted nor merged,
    only cut and read back in sequence."""
    n = 20_000
    ids = np.arange(n) * 2
    pieces = _pieces(ids, np.zeros(n, np.int64), np.ones(n, np.int64), 1000)
    got, stats = _sorted_all(pieces, tmp_path, run_bytes=50_000)
    assert stats["runs_spilled"] >= 5
    assert stats["concatenated"] == 1 and stats["merge_rounds"] == 0
    assert got.equals(pa.concat_tables(pieces))


def test_runs_touching_at_one_row_are_merged(tmp_path):
    """Two runs whose boundary rows are the same update must consolidate, not concatenate."""
    first = _updates(np.arange(0, 100), np.zeros(100, np.int64), np.ones(100, np.int64))
    second = _updates(np.arange(99, 200), np.zeros(101, np.int64), np.ones(101, np.int64))
    got, stats = _sorted_all([first, second], tmp_path, run_bytes=first.nbytes - 1)
    assert stats["concatenated"] == 0
    assert got.equals(consolidate(pa.concat_tables([first, second])))
    assert got.column("_diff").to_pylist()[99] == 2


def test_constant_first_column_is_split_and_merged_in_bounded_memory(tmp_path):
    """Every update shares its first column: runs are still cut by size and the merge waits
    on whole-row bounds, so what it holds at once stays a fraction of the run size."""
    rng = np.random.default_rng(3)
    n = 40_000
    table = pa.table(
        {
            "k": pa.array(np.zeros(n, np.int64)),
            "v": pa.array(rng.integers(0, 20_000, n)),
            "_time": pa.array(rng.integers(0, 3, n)),
            "_diff": pa.array(np.ones(n, np.int64)),
        }
    )
    run_bytes = 64_000
    with ExternalSort(table.schema, run_bytes=run_bytes, spill_dir=str(tmp_path)) as sorter:
        for batch in table.to_batches(max_chunksize=1000):
            sorter.insert(pa.Table.from_batches([batch]))
            assert sorter.size_bytes <= run_bytes + batch.nbytes
        got = pa.concat_tables(list(sorter.sorted()))
        stats = sorter.stats
    assert stats["runs_spilled"] >= 10 and stats["merge_rounds"] > 1
    assert stats["peak_waiting_bytes"] <= run_bytes // 2
    assert got.equals(consolidate(table))


def test_everything_cancelling_gives_nothing(tmp_path):
    ids = np.arange(5000)
    ones = np.ones(5000, np.int64)
    pieces = _pieces(ids, ones, ones, 500) + _pieces(ids, ones, -ones, 500)
    got, _ = _sorted_all(pieces, tmp_path, run_bytes=20_000)
    assert got.num_rows == 0


def test_large_write_task_parts_are_one_chain_per_side(tmp_path):
    """A write task past its budget goes through ExternalSort; its sealed and unsealed parts
    are each one sorted, consolidated chain, and hold exactly the consolidated input."""
    pytest.importorskip("pyspark")
    from persistshard.core.write.validate import user_schema
    from persistshard.datasource import writer as w

    rng = np.random.default_rng(8)
    n = 60_000
    ids = rng.integers(0, 20_000, n)
    data = pa.table({"id": ids, "name": pa.array([f"n{i % 5}" for i in ids.tolist()])})
    times = rng.integers(0, 30, n)
    data = data.append_column("t", pa.array(times, pa.int64()))
    shard = ps.open_shard(str(tmp_path / "s"))
    incoming = user_schema(data.drop_columns(["t"]).schema)
    d = w.BatchDescription(
        location=shard.location,
        write_id="w1",
        lower=0,
        upper=20,
        shard_schema=None,
        incoming=incoming,
        time_column="t",
        diff_column=None,
        overwrite=False,
        memory_budget=3 << 20,  # runs of 1 MiB: several
        address=shard.address,
        target=incoming,
        sources=tuple(incoming.names),
    )
    written = w.write_task(d, iter(data.to_batches(max_chunksize=2000)), 0)
    full = update_schema(incoming)
    expected = consolidate(
        pa.table(
            {"id": ids, "name": data.column("name"), "_time": times, "_diff": np.ones(n, np.int64)}
        ).cast(full)
    )
    for refs, keep in ((written.sealed, lambda t: t < 20), (written.unsealed, lambda t: t >= 20)):
        assert refs
        chain = pa.concat_tables([read_part(shard._blob, r) for r in refs])
        want = expected.filter(pa.array(keep(expected.column("_time").to_numpy())))
        assert chain.equals(want)
