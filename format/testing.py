"""Exact comparison of Arrow data, for tests: floats compare by their bits.

`pa.Table.equals` says NaN != NaN and -0.0 == 0.0; a storage format must preserve both
exactly, so tests compare floats as the integers of the same width that share their bits.
Only valid (non-null) slots are compared, as Arrow's `equals` does.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

_FLOAT_BITS = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}


def bits_type(t: pa.DataType) -> pa.DataType:
    """`t` with every floating point type (at any depth) replaced by the same-width int."""
    if pa.types.is_floating(t):
        return _FLOAT_BITS[t.bit_width]
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(bits_type(t.key_type)),
            t.item_field.with_type(bits_type(t.item_type)),
            keys_sorted=t.keys_sorted,
        )
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(bits_type(t.value_type)), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(bits_type(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(bits_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(bits_type(t.field(i).type)) for i in range(t.num_fields)]
        )
    return t


def _view(arr: pa.Array, t: pa.DataType) -> pa.Array:
    # pyarrow's view mishandles sliced structs with null-typed children: un-slice first.
    return pa.concat_arrays([arr]).view(t)


def as_bits(data: pa.Table) -> pa.Table:
    """`data` with float columns viewed as integers (zero-copy)."""
    columns = []
    for col in data.columns:
        t = bits_type(col.type)
        columns.append(
            col if t.equals(col.type) else pa.chunked_array([_view(c, t) for c in col.chunks], t)
        )
    return pa.Table.from_arrays(columns, names=data.column_names)


def _py_bits(value: Any) -> Any:
    """A Python value with every float replaced by its bit pattern (for the slow path)."""
    if isinstance(value, float):
        return ("float-bits", struct.pack("<d", value))
    if isinstance(value, dict):
        return {k: _py_bits(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_py_bits(v) for v in value]
    return value


def _bits_columns(a: pa.Table, e: pa.Table) -> tuple[list[Any], list[Any]]:
    """Per column of each table, something whose equality is bit-exact value equality.

    Zero-copy integer views where pyarrow can make them; where it cannot (it refuses views
    of some nested layouts, such as null-typed struct fields inside maps), Python values with
    floats as bit patterns, for both tables alike.
    """
    try:
        return list(as_bits(a).columns), list(as_bits(e).columns)
    except pa.ArrowInvalid:
        return (
            [_py_bits(c.to_pylist()) for c in a.columns],
            [_py_bits(c.to_pylist()) for c in e.columns],
        )


def assert_exact(actual: pa.Table | pa.RecordBatch, expected: pa.Table | pa.RecordBatch) -> None:
    """Schemas equal (metadata included) and every valid value equal bit for bit."""
    a = actual if isinstance(actual, pa.Table) else pa.Table.from_batches([actual])
    e = expected if isinstance(expected, pa.Table) else pa.Table.from_batches([expected])
    assert a.schema.equals(e.schema, check_metadata=True), f"schema\n{a.schema}\n!=\n{e.schema}"
    assert a.num_rows == e.num_rows, f"{a.num_rows} rows != {e.num_rows} rows"
    bits_a, bits_e = _bits_columns(a, e)
    for name, ca, ce in zip(a.column_names, bits_a, bits_e, strict=True):
        if isinstance(ca, list):
            if ca != ce:
                raise AssertionError(f"column {name!r} differs")
            continue
        if not ca.equals(ce):
            for i in range(a.num_rows):
                if ca[i] != ce[i] and not (ca[i].is_valid is False and ce[i].is_valid is False):
                    raise AssertionError(f"column {name!r} row {i}: {ca[i]} != {ce[i]}")
            raise AssertionError(f"column {name!r} differs")
