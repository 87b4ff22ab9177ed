"""Chunk statistics: min/max of `_time`, of the sort column and (format version 2) of every
column, with null counts, as stored in the footer.

Invariants:
- A chunk's `key_min`/`key_max` bound every non-null value of the sort column in that chunk
  (`key_min <= v <= key_max` in pyarrow's `min_max` order, which for the supported types is
  the natural order: numbers, bytewise strings and binary, false < true, earlier < later).
  They are None when the type has no meaningful min/max (floats, nested, null) or when every
  value is null, and also when Python cannot hold a bound exactly (temporal values outside
  `datetime`'s range, nanoseconds without pandas). `key_null_count` counts the nulls.
- The stored ("raw") form is JSON: integers for integer, temporal (physical value in the
  type's unit) and boolean types; a string for strings; lowercase hex for binary; the
  decimal's text (`str(Decimal)`) for decimals. `stat_to_py` turns it into the `.as_py()`
  value of the column type, exactly.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def _temporal_int(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if (
        pa.types.is_date64(t)
        or pa.types.is_time64(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_duration(t)
    ):
        return pa.int64()
    return None


def _is_binary(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
    )


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def key_stats_supported(t: pa.DataType) -> bool:
    """Whether chunks keep min/max for a sort column of type `t`.

    Not for decimal32/64 (Arrow has no min_max kernel for them) nor time64[ns] (its
    `.as_py()` truncates to microseconds, which would not bound the values).
    """
    if pa.types.is_decimal(t):
        return t.bit_width in (128, 256)
    if pa.types.is_time64(t) and t.unit == "ns":
        return False
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or _is_string(t)
        or _is_binary(t)
        or _temporal_int(t) is not None
    )


def key_stats(arr: pa.Array) -> tuple[Any, Any]:
    """Raw (JSON) min and max of the non-null values of `arr`; (None, None) if unsupported."""
    t = arr.type
    if not key_stats_supported(t) or arr.null_count == len(arr):
        return None, None
    physical = _temporal_int(t)
    if physical is not None:
        arr = arr.view(physical)
    mm = pc.min_max(arr)
    lo, hi = mm["min"], mm["max"]
    if pa.types.is_decimal(t):
        return str(lo.as_py()), str(hi.as_py())
    if _is_binary(t):
        return lo.as_py().hex(), hi.as_py().hex()
    if _is_string(t):
        try:
            return lo.as_py(), hi.as_py()
        except UnicodeDecodeError:  # invalid UTF-8 smuggled into a string column
            return None, None
    return lo.as_py(), hi.as_py()


def raw_sort_key(raw: Any, t: pa.DataType) -> Any:
    """A Python value ordering raw stats of type `t` the way `min_max` orders them."""
    if pa.types.is_decimal(t):
        return decimal.Decimal(raw)
    if _is_binary(t):
        return bytes.fromhex(raw)
    if _is_string(t):
        return raw.encode("utf-8")
    return raw


@functools.lru_cache(maxsize=512)
def _family(t: pa.DataType) -> tuple[str, bool]:
    """How raw stats of type `t` are checked and converted, and whether the type keeps
    statistics at all (`key_stats_supported`); cached: footers repeat a few types often."""
    if pa.types.is_decimal(t):
        family = "decimal"
    elif _is_binary(t):
        family = "binary"
    elif _temporal_int(t) is not None:
        family = "temporal"
    elif pa.types.is_boolean(t):
        family = "bool"
    elif pa.types.is_integer(t):
        family = "int"
    else:
        family = "plain"  # strings (and, unsupported, anything else)
    return family, key_stats_supported(t)


def check_raw(raw: Any, t: pa.DataType) -> None:
    """Raise ValueError unless `raw` is a well-formed raw stat of type `t` (or None)."""
    if raw is None:
        return
    family, supported = _family(t)
    if not supported:
        raise ValueError(f"no key statistics for type {t}")
    if family == "bool":
        ok = isinstance(raw, bool)
    elif family in ("int", "temporal"):
        ok = isinstance(raw, int) and not isinstance(raw, bool)
    else:
        ok = isinstance(raw, str)
    if not ok:
        raise ValueError(f"key statistic {raw!r} does not fit type {t}")
    if family == "decimal":
        decimal.Decimal(raw)  # raises decimal.InvalidOperation (an ArithmeticError)
    elif family == "binary":
        bytes.fromhex(raw)


def stats_to_py(raw_min: Any, raw_max: Any, t: pa.DataType) -> tuple[Any, Any]:
    """Both bounds as Python values, or (None, None) when Python cannot hold one of them.

    Temporal values outside `datetime`'s range (years before 1 or after 9999, or
    nanoseconds without pandas installed) have no `.as_py()` value; such a chunk reports
    no bounds rather than failing the read.
    """
    try:
        return stat_to_py(raw_min, t), stat_to_py(raw_max, t)
    except (OverflowError, ValueError):
        return None, None


def stat_to_py(raw: Any, t: pa.DataType) -> Any:
    """The `.as_py()` value of a raw stat of type `t`."""
    if raw is None:
        return None
    family = _family(t)[0]
    if family == "decimal":
        return decimal.Decimal(raw)
    if family == "binary":
        return bytes.fromhex(raw)
    if family == "temporal":
        physical = _temporal_int(t)
        return pa.array([raw], physical).view(t)[0].as_py()
    return raw


#: String and binary bounds longer than this many bytes are not kept (both become None), so
#: long text columns do not bloat the footer.
MAX_STAT_BYTES = 64


@dataclass(frozen=True)
class ColumnStats:
    """Statistics of one column in one chunk (format version 2).

    ``min``/``max`` are the `.as_py()` values bounding the column's non-null values (None when
    the type keeps no bounds, every value is null, a string or binary bound is longer than
    `MAX_STAT_BYTES`, or Python cannot hold a bound); ``null_count`` counts the top-level
    nulls, for every type.
    """

    min: Any
    max: Any
    null_count: int


def column_stats(arr: pa.Array) -> tuple[Any, Any, int]:
    """Raw (JSON) min, max and null count of a column of a chunk (see `ColumnStats`)."""
    lo, hi = key_stats(arr)
    if lo is not None:
        t = arr.type
        if _is_string(t):
            size = max(len(lo.encode("utf-8")), len(hi.encode("utf-8")))
        elif _is_binary(t):
            size = max(len(lo), len(hi)) // 2
        else:
            size = 0
        if size > MAX_STAT_BYTES:
            lo = hi = None
    return lo, hi, arr.null_count


@functools.lru_cache(maxsize=512)
def column_stats_checker(t: pa.DataType) -> Callable[[Any, int], ColumnStats]:
    """`check_column_stats` for columns of type `t` (cached per type): the same checks and
    result, with a direct path for integer and string columns, whose raw stats are the
    Python values themselves (footers of small parts are mostly such entries)."""
    family, supported = _family(t)
    plain: type | None = None
    if supported and family == "int":
        plain = int
    elif supported and family == "plain":
        plain = str
    if plain is None:
        return lambda raw, num_rows: check_column_stats(raw, t, num_rows)
    kind = plain

    def check(raw: Any, num_rows: int) -> ColumnStats:
        if type(raw) is list and len(raw) == 3:
            lo, hi, nulls = raw
            if (
                type(nulls) is int
                and 0 <= nulls <= num_rows
                and ((lo is None and hi is None) or (type(lo) is kind and type(hi) is kind))
            ):
                return ColumnStats(lo, hi, nulls)
        return check_column_stats(raw, t, num_rows)  # malformed: the general check says why

    return check


def check_column_stats(raw: Any, t: pa.DataType, num_rows: int) -> ColumnStats:
    """The `ColumnStats` of a raw footer entry ``[min, max, null_count]``; ValueError if it
    is malformed for type `t` or a chunk of ``num_rows`` rows."""
    if not (isinstance(raw, list) and len(raw) == 3):
        raise ValueError("a column statistics entry is [min, max, null_count]")
    lo, hi, nulls = raw
    if not isinstance(nulls, int) or isinstance(nulls, bool) or not 0 <= nulls <= num_rows:
        raise ValueError(f"null count {nulls!r} does not fit a chunk of {num_rows} rows")
    if (lo is None) != (hi is None):
        raise ValueError("a column's min and max are both present or both null")
    if lo is not None:
        check_raw(lo, t)
        check_raw(hi, t)
    py_lo, py_hi = stats_to_py(lo, hi, t)
    return ColumnStats(py_lo, py_hi, nulls)
