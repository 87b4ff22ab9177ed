"""The row order and consolidation of `persistshard.core.rows` against a plain Python model,
for first columns where numpy sorts directly (distinct, tied, with nulls) and where it cannot."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from persistshard.core import rows

N = 3000


def _first_column(kind: str, rng: np.random.Generator) -> pa.Array:
    if kind == "distinct int64":
        return pa.array(rng.permutation(N) * 7 - 5000, pa.int64())
    if kind == "distinct uint32":
        return pa.array(rng.permutation(N).astype(np.uint32), pa.uint32())
    if kind == "distinct date32":
        return pa.array(rng.permutation(N).astype(np.int32), pa.int32()).view(pa.date32())
    if kind == "distinct timestamp":
        return pa.array(rng.permutation(N) * 1000, pa.int64()).view(pa.timestamp("us"))
    if kind == "tied int64":
        return pa.array(rng.integers(0, N // 10, N), pa.int64())
    if kind == "distinct with a null":
        values: list[Any] = rng.permutation(N).tolist()
        values[17] = None
        return pa.array(values, pa.int64())
    if kind == "distinct strings":
        return pa.array([f"k{v:06d}" for v in rng.permutation(N)])
    raise AssertionError(kind)


def _table(kind: str, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "k": _first_column(kind, rng),
            "v": pa.array(rng.integers(0, 3, N), pa.int64()),
            "_time": pa.array(rng.integers(0, 4, N), pa.int64()),
            "_diff": pa.array(rng.choice([-1, 1, 2], N), pa.int64()),
        }
    )


def _model(table: pa.Table) -> list[tuple[Any, ...]]:
    """(k, v, time, summed diff) for every (row, time) whose diffs do not cancel, in
    (row, time) order, nulls last."""
    sums: dict[tuple[Any, Any, int], int] = {}
    for r in table.to_pylist():
        key = (r["k"], r["v"], r["_time"])
        sums[key] = sums.get(key, 0) + r["_diff"]
    ordered = sorted(
        (k for k, d in sums.items() if d != 0),
        key=lambda k: (k[0] is None, k[0] if k[0] is not None else 0, k[1], k[2]),
    )
    return [(*k, sums[k]) for k in ordered]


KINDS = [
    "distinct int64",
    "distinct uint32",
    "distinct date32",
    "distinct timestamp",
    "tied int64",
    "distinct with a null",
    "distinct strings",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_consolidation_and_order_match_the_model(kind: str, seed: int) -> None:
    table = _table(kind, seed)
    columns = ["k", "v"]
    indices, diffs = rows.consolidation_indices(table, columns)
    got = table.take(pa.array(indices)).select(["k", "v", "_time"]).to_pylist()
    result = [(r["k"], r["v"], r["_time"], int(d)) for r, d in zip(got, diffs, strict=True)]
    assert result == _model(table)

    order = rows.sort_indices(table, columns).to_numpy()
    shown = table.take(pa.array(order)).to_pylist()
    keys = [
        (r["k"] is None, r["k"] if r["k"] is not None else 0, r["v"], r["_time"]) for r in shown
    ]
    assert keys == sorted(keys)
    # Ties keep their input order (callers rely on it: a bound sorts before equal keys).
    for a, b, ka, kb in zip(order, order[1:], keys, keys[1:], strict=False):
        if ka == kb:
            assert a < b


def test_numpy_sorts_only_distinct_numeric_first_columns() -> None:
    rng = np.random.default_rng(3)
    for kind in KINDS:
        perm = rows.distinct_order(rows.key_array(_first_column(kind, rng)))
        numpy_sortable = kind.startswith("distinct") and kind not in (
            "distinct with a null",
            "distinct strings",
        )
        assert (perm is not None) == numpy_sortable, kind
    floats = rows.key_array(pa.array([0.5, -1.0, 2.0, -0.0, 0.0]))
    perm = rows.distinct_order(floats)
    assert perm is not None  # -0.0 and 0.0 are distinct rows (rows' float rule)
    assert pa.array([0.5, -1.0, 2.0, -0.0, 0.0]).take(pa.array(perm)).to_pylist() == [
        -1.0,
        -0.0,
        0.0,
        0.5,
        2.0,
    ]
    when = pa.array([dt.date(2020, 1, 2), dt.date(2020, 1, 1)])
    assert rows.distinct_order(rows.key_array(when)).tolist() == [1, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_consolidation_through_a_permutation_matches_the_model(kind: str) -> None:
    """``perm``: a subset of the rows, already in (row, time) order; only those are
    consolidated (distinct first columns take numpy's shortcut, the others compare keys)."""
    table = _table(kind, 4)
    columns = ["k", "v"]
    order = rows.sort_indices(table, columns).to_numpy()
    rng = np.random.default_rng(9)
    subset = order[np.sort(rng.choice(len(order), len(order) // 2, replace=False))]
    indices, diffs = rows.consolidation_indices(table, columns, perm=subset)
    got = table.take(pa.array(indices)).select(["k", "v", "_time"]).to_pylist()
    result = [(r["k"], r["v"], r["_time"], int(d)) for r, d in zip(got, diffs, strict=True)]
    assert result == _model(table.take(pa.array(subset)))
    through = rows.consolidate_through(table, subset, columns)
    assert through.select(["k", "v", "_time", "_diff"]).to_pylist() == [
        {"k": k, "v": v, "_time": t, "_diff": d} for k, v, t, d in result
    ]


def _bound_cases() -> list[tuple[str, dict[str, Any]]]:
    """Bounds against a table of distinct keys 0, 2, 4, ... with v = 1 and time 5: between
    keys, equal to a row, and sharing a row's key but sorting before or after it."""
    return [
        ("between keys", {"k": 101, "v": 1, "_time": 5}),
        ("equal to a row", {"k": 100, "v": 1, "_time": 5}),
        ("same key, earlier time", {"k": 100, "v": 1, "_time": 4}),
        ("same key, later time", {"k": 100, "v": 1, "_time": 6}),
        ("same key, smaller row", {"k": 100, "v": 0, "_time": 9}),
        ("same key, larger row", {"k": 100, "v": 2, "_time": 0}),
        ("below every key", {"k": -1, "v": 1, "_time": 5}),
        ("above every key", {"k": 10**6, "v": 1, "_time": 5}),
    ]


@pytest.mark.parametrize("case", [c for c, _ in _bound_cases()])
@pytest.mark.parametrize("distinct", [True, False])
def test_settle_below_bound_splits_at_the_bound_like_the_model(case: str, distinct: bool) -> None:
    """Rows strictly before the bound are final (consolidated, in order); the rest waits,
    the bound left out. Distinct first keys take the binary-search shortcut; a repeated key
    (``distinct`` False) the general sort: both must split exactly where the model does."""
    bound = dict(_bound_cases())[case]
    rng = np.random.default_rng(5)
    keys = rng.permutation(np.arange(0, 400, 2))
    if not distinct:
        keys[7] = keys[8]  # one key twice (different rows by v below)
    n = len(keys)
    body = pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "v": pa.array(np.where(np.arange(n) == 7, 3, 1), pa.int64()),
            "_time": pa.array(np.full(n, 5), pa.int64()),
            "_diff": pa.array(rng.choice([-1, 1, 2], n), pa.int64()),
        }
    )
    head = pa.table(
        {
            name: pa.array([bound[name] if name != "_diff" else 0], pa.int64())
            for name in body.column_names
        }
    )
    done, rest = rows.settle_below_bound(pa.concat_tables([head, body]), ["k", "v"])

    def key(r: dict[str, Any]) -> tuple[int, int, int]:
        return (r["k"], r["v"], r["_time"])

    b = key(bound)
    below = body.filter(pa.array([key(r) < b for r in body.to_pylist()]))
    assert [(r["k"], r["v"], r["_time"], r["_diff"]) for r in done.to_pylist()] == _model(below)
    waiting = sorted(key(r) for r in body.to_pylist() if key(r) >= b)
    assert sorted(key(r) for r in (rest.to_pylist() if rest is not None else [])) == waiting


def test_a_few_sorted_runs_sort_by_merging_and_give_the_same_order() -> None:
    """Parts read one after another are a few sorted runs: `sort_kind` picks the merging
    sort for them (and quicksort for shuffled values), and `distinct_order` gives the same
    sorted permutation either way."""
    rng = np.random.default_rng(11)
    values = rng.permutation(10_000).astype(np.int64)
    runs = np.concatenate([np.sort(values[i : i + 2500]) for i in range(0, 10_000, 2500)])
    assert rows.sort_kind(runs) == "stable"
    assert rows.sort_kind(values) == "quicksort"
    assert rows.sort_kind(runs[:10]) == "quicksort"  # too short to bother
    for data in (runs, values):
        perm = rows.distinct_order(pa.array(data))
        assert perm is not None
        assert data[perm].tolist() == sorted(data.tolist())


def test_a_table_in_key_order_is_consolidated_without_a_copy() -> None:
    """A strictly ascending first column with no zero diff is already consolidated in
    (row, time) order: `consolidate` returns the table itself. A zero diff or a tie takes the
    general path, and a `split_at` of an append at its upper keeps the table whole."""
    from persistshard.core.shard import split_at

    n = 1000
    table = pa.table(
        {
            "k": pa.array(np.arange(n) * 2, pa.int64()),
            "v": pa.array([f"v{i}" for i in range(n)]),
            "_time": pa.array(np.full(n, 5), pa.int64()),
            "_diff": pa.array(np.ones(n), pa.int64()),
        }
    )
    assert rows.consolidate(table) is table
    zero = table.set_column(3, "_diff", pa.array(np.r_[np.ones(n - 1), 0], pa.int64()))
    assert rows.consolidate(zero).num_rows == n - 1
    tie = table.set_column(0, "k", pa.array(np.r_[np.arange(n - 1) * 2, 2 * n - 4], pa.int64()))
    assert rows.consolidate(tie).num_rows == n  # (2n-4, v998) and (2n-4, v999) differ
    assert rows.consolidate(tie).column("k").to_pylist() == sorted(tie.column("k").to_pylist())
    below, above = split_at(table, 6)
    assert below is table and above.num_rows == 0
    below, above = split_at(table, 5)
    assert below.num_rows == 0 and above is table


@pytest.mark.parametrize("case", [c for c, _ in _bound_cases()])
@pytest.mark.parametrize("tied", [False, True])
def test_split_sorted_below_cuts_sorted_pieces_at_the_bounds_first_key(
    case: str, tied: bool
) -> None:
    """Pieces in (row, time) order are cut by binary search: rows whose first key is below
    the bound's are final (consolidated across pieces, in order), every other row waits in
    its piece, still sorted; rows that share the bound's first key wait even when they sort
    before it (conservative). With ``tied``, keys repeat within and across pieces."""
    bound = dict(_bound_cases())[case]
    rng = np.random.default_rng(9)
    keys = rng.integers(0, 100, 300) * 2 if tied else rng.permutation(np.arange(0, 600, 2))
    body = pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "v": pa.array(rng.integers(0, 3, len(keys)), pa.int64()),
            "_time": pa.array(rng.integers(3, 8, len(keys)), pa.int64()),
            "_diff": pa.array(rng.choice([-1, 1, 2], len(keys)), pa.int64()),
        }
    )
    pieces = [rows.sort_table(body.slice(i, 100), ["k", "v"]) for i in range(0, 300, 100)]
    head = pa.table({n: pa.array([bound[n]], pa.int64()) for n in ("k", "v", "_time")})
    split = rows.split_sorted_below([(p, p.nbytes) for p in pieces], head, ["k", "v"])
    assert split is not None
    done, waiting = split

    def key(r: dict[str, Any]) -> tuple[int, int, int]:
        return (r["k"], r["v"], r["_time"])

    below = body.filter(pa.array([r["k"] < bound["k"] for r in body.to_pylist()]))
    got = [] if done is None else done.to_pylist()
    assert [(r["k"], r["v"], r["_time"], r["_diff"]) for r in got] == _model(below)
    left = [r for t, _ in waiting for r in t.to_pylist()]
    assert sorted(map(key, left)) == sorted(
        key(r) for r in body.to_pylist() if r["k"] >= bound["k"]
    )
    for t, kept in waiting:
        listed = [key(r) for r in t.to_pylist()]
        assert listed == sorted(listed) and t.num_rows and kept >= t.nbytes


def test_split_sorted_below_declines_keys_numpy_cannot_compare() -> None:
    piece = pa.table({"k": pa.array(["a", "b"]), "_time": [1, 1], "_diff": [1, 1]})
    bound = pa.table({"k": pa.array(["b"]), "_time": [1]})
    assert rows.split_sorted_below([(piece, piece.nbytes)], bound, ["k"]) is None
    nulls = pa.table({"k": pa.array([None, 3], pa.int64()), "_time": [1, 1], "_diff": [1, 1]})
    bound = pa.table({"k": pa.array([3], pa.int64()), "_time": [1]})
    assert rows.split_sorted_below([(nulls, nulls.nbytes)], bound, ["k"]) is None
