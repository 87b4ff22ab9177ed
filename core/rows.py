"""Row identity: the one rule for when two rows are equal, how rows sort, and consolidation.

Every component that compares rows (the shard's snapshots, the Correction buffer, compaction,
the Spark reader) uses the functions here, so there is exactly one rule:

- Two rows are equal when every column is equal. Nulls equal nulls (at any depth).
- Floating point: all NaNs are equal to each other (whatever their payload); ``-0.0`` and
  ``0.0`` are *different* rows. Rationale: consolidation must never change a value the user
  wrote, and ``-0.0`` round-trips exactly; NaN payloads carry no meaning in Spark.
- Nested values (lists, structs, maps) are equal when their canonical encodings are equal:
  element by element, in stored order (map entries are compared in their stored order).
- The order is a total order consistent with that equality: for each column in schema order,
  nulls last; numbers ascending with ``-0.0 < 0.0`` and NaN after every number; strings and
  binary by bytes; nested values by their canonical encoding (deterministic but not
  "natural"). Time ``_time`` breaks ties, then nothing (equal rows at equal times are one
  update after consolidation).

Consolidation (`consolidate`) sums the diffs of updates that share (row, time), drops those
that sum to zero, and returns them sorted. It assumes diffs fit in int64 when summed.
Everything is vectorized: one Arrow sort and numpy reductions, no per-row Python except for
nested columns, which are encoded per value.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TIME = "_time"
DIFF = "_diff"
SYSTEM_COLUMNS = (TIME, DIFF)

Order = Literal["row_time", "time_row"]

_SIGN_FLIP = np.int64(0x7FFFFFFFFFFFFFFF)
_CANONICAL_NAN_BITS = np.float64("nan").view(np.int64)


def row_columns(schema: pa.Schema) -> list[str]:
    """The user's columns of an update schema: everything but ``_time`` and ``_diff``."""
    return [name for name in schema.names if name not in SYSTEM_COLUMNS]


def _is_primitive_sortable(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_duration(t)
    )


def _float_key(arr: pa.Array) -> pa.Array:
    """An int64 array whose signed order is the float total order; NaNs collapse to one key."""
    values = pc.cast(arr, pa.float64()) if not pa.types.is_float64(arr.type) else arr
    data = values.to_numpy(zero_copy_only=False)
    data = np.where(np.isnan(data), np.float64("nan"), data)
    bits = data.view(np.int64)
    key = bits ^ ((bits >> 63) & _SIGN_FLIP)
    mask = np.asarray(values.is_null()) if values.null_count else None
    return pa.array(key, type=pa.int64(), mask=mask)


def _encode_value(value: Any, t: pa.DataType, out: bytearray) -> None:
    """Append a canonical, self-delimiting encoding of ``value`` (of Arrow type ``t``)."""
    if value is None:
        out += b"\x00"
        return
    out += b"\x01"
    if pa.types.is_floating(t):
        f = float(value)
        if f != f:
            out += struct.pack(">q", int(_CANONICAL_NAN_BITS))
        else:
            out += struct.pack(">d", f)
    elif pa.types.is_struct(t):
        for i in range(t.num_fields):
            field = t.field(i)
            _encode_value(value.get(field.name), field.type, out)
    elif pa.types.is_map(t):
        out += struct.pack(">Q", len(value))
        for k, v in value:
            _encode_value(k, t.key_type, out)
            _encode_value(v, t.item_type, out)
    elif (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        out += struct.pack(">Q", len(value))
        for item in value:
            _encode_value(item, t.value_type, out)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        out += struct.pack(">Q", len(data)) + data
    elif isinstance(value, str):
        data = value.encode("utf-8")
        out += struct.pack(">Q", len(data)) + data
    else:
        data = repr(value).encode("utf-8")
        out += struct.pack(">Q", len(data)) + data


def _encoded_key(arr: pa.Array) -> pa.Array:
    """Binary canonical encodings of each value of a nested (or otherwise unsortable) array."""
    encoded: list[bytes | None] = []
    t = arr.type
    for value in arr.to_pylist():
        if value is None:
            encoded.append(None)
            continue
        buf = bytearray()
        _encode_value(value, t, buf)
        encoded.append(bytes(buf))
    return pa.array(encoded, type=pa.binary())


def key_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array | None:
    """The array that stands for ``arr`` in sorting and equality, or None if it never differs.

    The result sorts (with Arrow's sort, nulls at end) in our total order, and two of its
    values are equal exactly when the original values are equal under our rule.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_null(t):
        return None
    if pa.types.is_string_view(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_binary_view(t):
        return pc.cast(arr, pa.binary())
    if pa.types.is_floating(t):
        return _float_key(arr)
    if _is_primitive_sortable(t):
        return arr
    return _encoded_key(arr)


def key_columns(table: pa.Table, columns: Sequence[str]) -> list[pa.Array]:
    """`key_array` of each named column, skipping columns that never differ (null type)."""
    keys = []
    for name in columns:
        key = key_array(table.column(name))
        if key is not None:
            keys.append(key)
    return keys


def _numpy_key(key: pa.Array) -> np.ndarray | None:
    """``key`` as a numpy array with the same order and equality, when that is free: an
    integer or temporal (or float-key) array without nulls. None otherwise."""
    if key.null_count:
        return None
    t = key.type
    if pa.types.is_integer(t):
        return np.asarray(key.to_numpy())
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.asarray(key.view(pa.int32()).to_numpy())
    if (
        pa.types.is_date64(t)
        or pa.types.is_time64(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_duration(t)
    ):
        return np.asarray(key.view(pa.int64()).to_numpy())
    return None


def distinct_order(first: pa.Array) -> np.ndarray | None:
    """A permutation that sorts ``first`` (a key array, `key_array`), when its values are
    pairwise distinct and numpy can sort them directly; None otherwise.

    Invariant: when the first sort key is distinct, it alone decides the whole (row, time)
    order and no two rows are equal, so this permutation is the (unique) sorted order of the
    table and every row is its own consolidation run. numpy's sort is several times faster
    than Arrow's ``sort_indices`` on one integer column; the check costs one gather.
    """
    values = _numpy_key(first)
    sorted_ = _distinct_sort(values) if values is not None else None
    return sorted_[0] if sorted_ is not None else None


def _distinct_sort(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(the permutation sorting ``values``, the sorted values) when they are pairwise
    distinct; None otherwise. Input made of a few sorted runs (parts read one after another,
    the outputs of a merge) is sorted by merging its runs (`sort_kind`)."""
    if _strictly_ascending(values):  # a table written in key order: nothing to sort
        return np.arange(values.size, dtype=np.int64), values
    perm = np.argsort(values, kind=sort_kind(values)).astype(np.int64, copy=False)
    ordered = values[perm]
    return (perm, ordered) if _strictly_apart(ordered) else None


#: At most one descent per this many values: `sort_kind` calls the input a few sorted runs.
_RUN_DESCENTS = 64


def sort_kind(values: np.ndarray) -> Literal["quicksort", "stable"]:
    """numpy's sort kind for ``values``: ``stable`` (a run-detecting merge sort) when they are
    a concatenation of a few ascending runs, as parts read one after another or the sorted
    runs a merge gathers are (measured on 200,000 int64 in 4 runs: 1.6 ms against 10 ms),
    ``quicksort`` otherwise (the merge sort is about 20% slower on shuffled input). Counting
    the descents costs one pass."""
    if values.size < 2 * _RUN_DESCENTS:
        return "quicksort"
    descents = int(np.count_nonzero(values[1:] < values[:-1]))
    return "stable" if descents * _RUN_DESCENTS <= values.size else "quicksort"


def _distinct_through(first: pa.Array, perm: np.ndarray) -> np.ndarray | None:
    """``perm`` itself when the rows it names (already in order) have pairwise distinct
    values of ``first`` that numpy can compare directly; None otherwise."""
    values = _numpy_key(first)
    return perm if values is not None and _strictly_apart(values[perm]) else None


def _strictly_ascending(values: np.ndarray) -> bool:
    """Whether each of (at least two) ``values`` is greater than the one before it."""
    return values.size > 1 and bool(np.all(values[1:] > values[:-1]))


def ascending_key(column: pa.Array | pa.ChunkedArray) -> bool:
    """Whether ``column`` (a first row column) is a numpy-comparable key (`_numpy_key`:
    integer or temporal, no nulls) whose values strictly ascend: then rows in this order are
    sorted by (row, time) and no two are equal. Floats never are (their row order has its
    own rules for NaN and -0.0)."""
    if column.null_count:
        return False
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = _numpy_key(column)
    return values is not None and _strictly_ascending(values)


def _strictly_apart(ordered: np.ndarray) -> bool:
    """Whether no two neighbours of a sorted array are equal."""
    return ordered.size < 2 or bool(np.all(ordered[1:] != ordered[:-1]))


def _keys_after(first: pa.Array | None, table: pa.Table, columns: Sequence[str]) -> list[pa.Array]:
    """`key_columns` of ``columns``, reusing ``first`` (the first column's key, computed)."""
    return ([first] if first is not None else []) + key_columns(table, columns[1:])


def sort_indices(
    table: pa.Table,
    columns: Sequence[str],
    order: Order = "row_time",
    *,
    expect_ties: bool = False,
) -> pa.Array:
    """Indices that sort ``table`` by (row, time) or (time, row) in our total order (ties
    keep their input order). ``expect_ties`` skips trying `distinct_order` first (a merge
    of runs that share rows would pay for it and then sort again)."""
    first = key_array(table.column(columns[0])) if columns else None
    if order == "row_time" and first is not None and not expect_ties:
        perm = distinct_order(first)
        if perm is not None:
            return pa.array(perm)  # no other column's key is computed
    keys = _keys_after(first, table, columns)
    names = [f"k{i}" for i in range(len(keys))]
    arrays: list[pa.Array] = list(keys)
    has_time = TIME in table.column_names
    if has_time:
        time = table.column(TIME).combine_chunks()
        if order == "time_row":
            arrays.insert(0, time)
            names.insert(0, "t")
        else:
            arrays.append(time)
            names.append("t")
    if not arrays:
        return pa.array(np.arange(table.num_rows, dtype=np.int64))
    sort_table = pa.Table.from_arrays(arrays, names=names)
    return pc.sort_indices(sort_table, sort_keys=[(n, "ascending", "at_end") for n in names])


def sort_table(table: pa.Table, columns: Sequence[str], order: Order = "row_time") -> pa.Table:
    """``table`` sorted by (row, time) or (time, row) in our total order."""
    if table.num_rows <= 1:
        return table
    return table.take(sort_indices(table, columns, order))


def _equal_to_previous(key: pa.Array) -> np.ndarray:
    """Boolean mask, length n-1: value i+1 equals value i (nulls equal nulls)."""
    prev = key.slice(0, len(key) - 1)
    cur = key.slice(1)
    eq = pc.fill_null(pc.equal(cur, prev), False)
    result = np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)
    if key.null_count:
        both_null = np.asarray(pc.and_(pc.is_null(cur), pc.is_null(prev)), dtype=bool)
        result |= both_null
    return result


class _Permuted:
    """A key column seen through a sort permutation, gathered only where it is compared."""

    def __init__(self, key: pa.Array, perm: pa.Array) -> None:
        self.key = key
        self.perm = perm

    def at(self, positions: np.ndarray) -> pa.Array:
        return self.key.take(pa.array(self.perm.to_numpy()[positions]))


def _equal_pairs(cur: pa.Array, prev: pa.Array) -> np.ndarray:
    """Element-wise equality of two equally long arrays, nulls equal to nulls."""
    eq = np.asarray(pc.fill_null(pc.equal(cur, prev), False).to_numpy(zero_copy_only=False))
    if cur.null_count or prev.null_count:
        eq = eq | np.asarray(pc.and_(pc.is_null(cur), pc.is_null(prev)), dtype=bool)
    return eq.astype(bool)


def _sorted_run_starts(keys: Sequence[pa.Array | _Permuted], n: int) -> np.ndarray:
    """`run_starts` for rows sorted by ``keys``, comparing later keys only where all earlier
    keys tie: with a unique first column, no other column is gathered or compared at all."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # ``tied`` holds positions i (1 <= i < n) whose row equals row i - 1 in every key so far.
    tied = np.arange(1, n, dtype=np.int64)
    for key in keys:
        if tied.size == 0:
            break
        if tied.size == n - 1:  # every position still tied: compare whole shifted arrays
            whole = key.at(np.arange(n)) if isinstance(key, _Permuted) else key
            cur, prev = whole.slice(1), whole.slice(0, n - 1)
        elif isinstance(key, _Permuted):
            cur, prev = key.at(tied), key.at(tied - 1)
        else:
            cur, prev = key.take(pa.array(tied)), key.take(pa.array(tied - 1))
        tied = tied[_equal_pairs(cur, prev)]
    same = np.zeros(n, dtype=bool)
    same[tied] = True
    return np.flatnonzero(~same).astype(np.int64)


def run_starts(keys: Sequence[pa.Array], n: int) -> np.ndarray:
    """Indices where a new run of equal keys begins, for rows already sorted by ``keys``."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    same = np.ones(n - 1, dtype=bool)
    for key in keys:
        same &= _equal_to_previous(key)
    return np.concatenate(([0], np.flatnonzero(~same) + 1)).astype(np.int64)


def sum_runs(table: pa.Table, starts: np.ndarray) -> pa.Table:
    """One row per run (the first), with ``_diff`` the run's sum; zero sums are dropped."""
    if table.num_rows == 0:
        return table
    diffs = table.column(DIFF).to_numpy()
    sums = np.add.reduceat(diffs, starts)
    keep = sums != 0
    idx = starts[keep]
    out = table.take(pa.array(idx))
    diff_index = out.schema.get_field_index(DIFF)
    diff_field = out.schema.field(diff_index)
    return out.set_column(diff_index, diff_field, pa.array(sums[keep], type=pa.int64()))


def consolidate_through(
    table: pa.Table, perm: np.ndarray, columns: Sequence[str] | None = None
) -> pa.Table:
    """`consolidate` of the rows ``perm`` of ``table``, which are already in (row, time)
    order through ``perm``: one gather, of the rows that do not cancel only."""
    kept, sums = consolidation_indices(table, columns, perm=perm)
    out = table.take(pa.array(kept, pa.int64()))
    i = out.schema.get_field_index(DIFF)
    return out.set_column(i, out.schema.field(i), pa.array(sums, pa.int64()))


def settle_below_bound(
    table: pa.Table, columns: Sequence[str], *, expect_ties: bool = False, sort_rest: bool = False
) -> tuple[pa.Table, pa.Table | None]:
    """One step of a merge of sorted runs. Row 0 of ``table`` is the *bound*: a copy of the
    smallest frontier among the runs with rows left, with diff 0. Every row that sorts
    strictly before it is final (no run can still deliver it).

    Returns the final rows, consolidated and in (row, time) order (maybe none), and the rest
    (rows at or after the bound, the bound itself left out), unsorted and unconsolidated: the
    next step sorts them with the next slice anyway; None when nothing is left. The sort is
    stable, so the bound precedes rows equal to it and those stay for the next step.
    ``expect_ties``: see `sort_indices`. ``sort_rest``: the rest comes in (row, time) order
    (not consolidated), for a caller that keeps sorted pieces (`split_sorted_below`).
    """
    if not expect_ties and columns and table.num_rows > 1:
        settled = _settle_distinct(table, columns, sort_rest)
        if settled is not None:
            return settled
    idx = np.asarray(
        sort_indices(table, columns, expect_ties=expect_ties).to_numpy(), dtype=np.int64
    )
    q = int(np.flatnonzero(idx == 0)[0])
    return _split(table, columns, idx[:q], idx[q + 1 :], sort_rest)


def _settle_distinct(
    table: pa.Table, columns: Sequence[str], sort_rest: bool = False
) -> tuple[pa.Table, pa.Table | None] | None:
    """`settle_below_bound` when the rows after the bound have pairwise distinct first-column
    keys numpy can sort (`distinct_order`); None otherwise.

    The bound is a copy of a frontier, so its first key usually equals one row's: sorting it
    with the rest would defeat the distinct shortcut. Instead the rest is sorted alone and
    the bound's place found by binary search on the first key; at most one row shares that
    key (they are distinct), and a sort of that row with the bound (the bound first when
    equal, as the stable sort would place it) decides on which side it falls.
    """
    bound_first = key_array(table.column(columns[0]).slice(0, 1))
    bound_key = _numpy_key(bound_first) if bound_first is not None else None
    rest = table.slice(1)
    first = key_array(rest.column(columns[0]))
    values = _numpy_key(first) if first is not None else None
    if bound_key is None or values is None:
        return None
    sorted_ = _distinct_sort(values)
    if sorted_ is None:
        return None
    perm, ordered = sorted_
    q = int(np.searchsorted(ordered, bound_key[0], side="left"))
    if q < len(ordered) and ordered[q] == bound_key[0]:
        pair = pa.concat_tables([table.slice(0, 1), rest.take(pa.array([perm[q]]))])
        if int(sort_indices(pair, columns, expect_ties=True)[0].as_py()) == 1:
            q += 1  # that row sorts strictly before the bound: it is final too
    return _split(rest, columns, perm[:q], perm[q:], sort_rest)


def split_sorted_below(
    pieces: Sequence[tuple[pa.Table, int]], bound: pa.Table, columns: Sequence[str]
) -> tuple[pa.Table | None, list[tuple[pa.Table, int]]] | None:
    """One step of a merge of sorted runs whose buffer is kept as *sorted pieces* (each in
    (row, time) order): the rows whose first-column key is strictly below ``bound``'s (a
    one-row table, the smallest frontier among the runs with rows left), consolidated and in
    order (None if there are none), and what is left of each piece, still sorted.

    Only when the first row column is a numpy-comparable key (`_numpy_key`: integer or
    temporal, no nulls) in ``bound`` and every piece; None otherwise (the caller settles
    exactly, `settle_below_bound`). Correct because any row a run can still deliver sorts at
    or after its frontier, so its first key is at least the bound's: every update of a row
    with a smaller first key is in the buffer. Conservative for rows that share the bound's
    first key (they wait, even those strictly before the bound); a caller falls back to the
    exact settle when nothing is final here, so progress never depends on the first key.

    Unlike `settle_below_bound`, the rows that wait are neither sorted again nor copied: each
    piece is cut by binary search. A piece is ``(rows, kept)``: ``kept`` is the bytes of the
    table it is a view of (what it keeps alive); a left-over piece under half of that is
    copied, so the buffer never keeps alive more than twice its rows' bytes.
    """
    first = key_array(bound.column(columns[0])) if columns else None
    bound_key = _numpy_key(first) if first is not None else None
    if bound_key is None:
        return None
    cuts = []
    for piece, _ in pieces:
        key = key_array(piece.column(columns[0]))
        values = _numpy_key(key) if key is not None else None
        if values is None:
            return None
        cuts.append(int(np.searchsorted(values, bound_key[0], side="left")))
    finals = [p.slice(0, q) for (p, _), q in zip(pieces, cuts, strict=True) if q]
    if not finals:
        return None, list(pieces)
    waiting = []
    for (piece, kept), q in zip(pieces, cuts, strict=True):
        if q == piece.num_rows:
            continue
        if not q:
            waiting.append((piece, kept))
            continue
        rest = piece.slice(q)
        size = rest.nbytes
        if size * 2 < kept:
            rest = rest.take(pa.array(np.arange(rest.num_rows, dtype=np.int64)))
            kept = size
        waiting.append((rest, kept))
    return consolidate(pa.concat_tables(finals), columns), waiting


def _split(
    table: pa.Table,
    columns: Sequence[str],
    final: np.ndarray,
    waiting: np.ndarray,
    sort_rest: bool = False,
) -> tuple[pa.Table, pa.Table | None]:
    """The rows ``final`` (in order) consolidated, and the rows ``waiting`` in their input
    order, or with ``sort_rest`` in the order given (None if there are none): the two
    results of `settle_below_bound`."""
    done = consolidate_through(table, final, columns)
    if waiting.size == 0:
        return done, None
    if sort_rest:
        return done, table.take(pa.array(waiting, pa.int64()))
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[waiting] = True
    return done, table.filter(pa.array(mask))


def consolidate(
    table: pa.Table,
    columns: Sequence[str] | None = None,
    *,
    order: Order = "row_time",
    presorted: bool = False,
) -> pa.Table:
    """Sum diffs of equal (row, time) updates, drop zero sums, return sorted by ``order``.

    ``columns`` are the row columns (default: all but ``_time``/``_diff``). When ``table`` has
    no ``_time`` column, updates are grouped by row alone. ``presorted`` skips the sort when the
    caller guarantees the input is already in ``order``.
    """
    if table.num_rows == 0:
        return table
    if order == "row_time" and not presorted and _in_key_order(table, columns):
        return table  # sorted, one update per row, none zero: consolidated as it is
    indices, sums = consolidation_indices(table, columns, order=order, presorted=presorted)
    n = table.num_rows
    if len(indices) == n and (presorted or bool(np.all(indices == np.arange(n)))):
        diffs = table.column(DIFF).to_numpy()
        if np.array_equal(diffs, sums):
            return table  # already sorted and consolidated: nothing to do (no copy)
    if table.num_columns and table.column(0).num_chunks > 1:
        table = table.combine_chunks()  # Arrow's gather is much slower across many chunks
    out = table.take(pa.array(indices))
    diff_index = out.schema.get_field_index(DIFF)
    return out.set_column(diff_index, out.schema.field(diff_index), pa.array(sums, type=pa.int64()))


def _in_key_order(table: pa.Table, columns: Sequence[str] | None) -> bool:
    """Whether ``table`` is already consolidated in (row, time) order because its first row
    column is a numpy-comparable key that strictly ascends (so no two rows are equal and that
    column alone orders them) and no diff is zero. Costs two comparisons per row and no
    gather: a table appended in key order is then written without a single copy."""
    columns = row_columns(table.schema) if columns is None else columns
    if not columns or DIFF not in table.column_names:
        return False
    column = table.column(columns[0])
    if column.num_chunks != 1 or not ascending_key(column):
        return False
    diffs = table.column(DIFF)
    return diffs.num_chunks == 1 and not bool(np.any(diffs.chunk(0).to_numpy() == 0))


def advance_times(table: pa.Table, frontier: int) -> pa.Table:
    """Forward every ``_time`` below ``frontier`` to ``frontier`` (logical compaction)."""
    if table.num_rows == 0 or TIME not in table.column_names:
        return table
    idx = table.schema.get_field_index(TIME)
    times = pc.max_element_wise(table.column(TIME), pa.scalar(frontier, pa.int64()))
    return table.set_column(idx, table.schema.field(idx), times)


def snapshot_of(table: pa.Table, columns: Sequence[str] | None = None) -> pa.Table:
    """Rows + ``_diff``: one row per distinct row, diffs summed over all times, zeros dropped."""
    if TIME in table.column_names:
        table = table.drop_columns([TIME])
    return consolidate(table, columns)


def expand_by_diff(table: pa.Table) -> pa.Table:
    """Repeat each row ``_diff`` times and drop ``_diff``; diffs must be positive."""
    diffs = table.column(DIFF).to_numpy()
    rows = table.drop_columns([DIFF])
    if diffs.size == 0 or bool(np.all(diffs == 1)):
        return rows
    return rows.take(pa.array(np.repeat(np.arange(len(diffs), dtype=np.int64), diffs)))


def consolidation_indices(
    table: pa.Table,
    columns: Sequence[str] | None = None,
    *,
    order: Order = "row_time",
    presorted: bool = False,
    perm: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Where `consolidate`'s output comes from, without building it.

    ``perm`` (instead of ``presorted``): the rows to consolidate, as indices into ``table``
    already in ``order``; rows not named are left out, and only key columns are gathered
    (where earlier keys tie), never the whole rows.

    Returns ``(indices, diffs)``: for each (row, time) whose diffs do not sum to zero, the
    index in ``table`` of its first update in ``order``, and the summed diff, both in
    ``order``. ``table.take(indices)`` with ``_diff`` replaced by ``diffs`` equals
    ``consolidate(table, columns, order=order, presorted=presorted)``. Callers that cut the
    result into pieces take each piece separately, so the pieces own their buffers. Row keys
    are computed once (they are expensive for float and nested columns).
    """
    if columns is None:
        columns = row_columns(table.schema)
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    has_time = TIME in table.column_names
    diffs = np.asarray(table.column(DIFF).to_numpy(), dtype=np.int64)
    if perm is not None:
        perm = np.asarray(perm, dtype=np.int64)
        n = perm.size
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = key_array(table.column(columns[0])) if columns else None
    if order == "row_time" and first is not None and not presorted:
        fast = distinct_order(first) if perm is None else _distinct_through(first, perm)
        if fast is not None:
            # Sorted by a distinct first column: every row is its own run; no other
            # column's key is ever computed.
            sums = diffs[fast]
            keep = sums != 0
            return fast[keep], sums[keep]
    keys = _keys_after(first, table, columns)
    time = table.column(TIME).combine_chunks() if has_time else None
    if perm is not None:
        chosen = pa.array(perm)
        keys = [_Permuted(key, chosen) for key in keys]
        if time is not None:
            time = _Permuted(time, chosen)
        diffs = diffs[perm]
    elif presorted:
        perm = np.arange(n, dtype=np.int64)
    else:
        arrays: list[pa.Array] = list(keys)
        if time is not None:
            if order == "time_row":
                arrays.insert(0, time)
            else:
                arrays.append(time)
        if arrays:
            names = [f"k{i}" for i in range(len(arrays))]
            perm_arr = pc.sort_indices(
                pa.Table.from_arrays(arrays, names=names),
                sort_keys=[(name, "ascending", "at_end") for name in names],
            )
            perm = np.asarray(perm_arr.to_numpy(), dtype=np.int64)
            keys = [_Permuted(key, perm_arr) for key in keys]
            if time is not None:
                time = _Permuted(time, perm_arr)
            diffs = diffs[perm]
        else:
            perm = np.arange(n, dtype=np.int64)
    if time is not None:
        keys.append(time)
    starts = _sorted_run_starts(keys, n)
    sums = np.add.reduceat(diffs, starts)
    keep = sums != 0
    return perm[starts[keep]], sums[keep]
