"""Pushed filters: exact row predicates, evaluated with Arrow compute and against statistics.

A `Pred` is a predicate tree over top-level columns, with the semantics of a SQL ``WHERE``
clause: three-valued logic (a comparison with a null is null; ``NOT null`` is null; ``AND``
and ``OR`` are Kleene's), and a row is kept only when the predicate is *true*. `bind` builds
a leaf only when Arrow evaluates it exactly as Spark would, so a pushed filter never keeps a
row Spark would drop nor drops a row Spark would keep:

- comparisons (``= <=> < <= > >=``) and ``IN`` on integer, boolean, string, binary, date and
  decimal columns, with a literal that converts to the column's type without loss;
- null tests on any column;
- string prefix, suffix and substring tests on string columns.

Floating-point columns are refused for value tests (Spark orders NaN above every number and
equal to itself; Arrow's comparisons are IEEE), and so are timestamps (Spark hands their
literals over as local-time ``datetime`` values) and an empty ``IN`` list (its null
semantics are a Spark setting). Refused filters stay with the engine.

`chunk_may_match` decides from a chunk's per-column statistics (min, max, null count) whether
any row of the chunk can make the predicate true; ``False`` is a proof, ``True`` a maybe.
It relies on the statistics being bounds of the chunk's non-null values in the order Arrow
compares them (`persistshard.format.stats`), which for the types above is the natural order
of their Python values (strings by code point, the same as by UTF-8 bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persistshard.format import PartReader

#: Leaf operators that compare a column with a value.
COMPARISONS = ("eq", "eq_null_safe", "lt", "le", "gt", "ge")
#: String operators.
STRING_OPS = ("starts_with", "ends_with", "contains")
#: Every operator.
OPS = (*COMPARISONS, "in", "is_null", "is_not_null", *STRING_OPS, "not", "and", "or")


@dataclass(frozen=True)
class Pred:
    """A predicate: a leaf (``op`` on ``column`` with ``value``) or ``not``/``and``/``or`` of
    ``children``. Values are Python values of the column's Arrow type (``.as_py()`` form);
    ``in`` holds a tuple. Build leaves with `bind`, which checks exactness."""

    op: str
    column: str = ""
    value: Any = None
    children: tuple[Pred, ...] = ()

    def columns(self) -> set[str]:
        """Every column the predicate reads."""
        if self.children:
            return set().union(*(c.columns() for c in self.children))
        return {self.column}

    def __str__(self) -> str:
        if self.op == "not":
            return f"NOT ({self.children[0]})"
        if self.op in ("and", "or"):
            return f" {self.op.upper()} ".join(f"({c})" for c in self.children)
        if self.op in ("is_null", "is_not_null"):
            return f"{self.column} {self.op.replace('_', ' ').upper()}"
        return f"{self.column} {self.op} {self.value!r}"


def _value_type_ok(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_date(t)
        or (pa.types.is_decimal(t) and t.bit_width in (128, 256))
    )


def _exact_value(value: Any, t: pa.DataType) -> tuple[bool, Any]:
    """(True, the value as the column type's Python value) if it converts without loss."""
    if value is None:
        return True, None
    if isinstance(value, bool) != pa.types.is_boolean(t):
        return False, None
    if isinstance(value, bytearray):
        value = bytes(value)
    try:
        converted = pa.scalar(value, type=t).as_py()
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False, None
    if type(converted) is not type(value) and not (
        isinstance(value, int) and isinstance(converted, int)
    ):
        # e.g. an int literal for a decimal column: compare only what converts back exactly
        if not (pa.types.is_decimal(t) and isinstance(value, int)):
            return False, None
    if converted != value:
        return False, None
    return True, converted


def bind(op: str, column: str, value: Any, schema: pa.Schema) -> Pred | None:
    """A leaf predicate ``op`` on ``column`` of ``schema``, or None if it cannot be exact."""
    if op not in OPS or op in ("not", "and", "or"):
        return None
    index = schema.get_field_index(column)
    if index < 0:
        return None
    t = schema.field(index).type
    if op in ("is_null", "is_not_null"):
        return Pred(op, column)
    if op in STRING_OPS:
        string = pa.types.is_string(t) or pa.types.is_large_string(t)
        if not string or not isinstance(value, str):
            return None
        ok, v = _exact_value(value, t)
        return Pred(op, column, v) if ok and v is not None else None
    if not _value_type_ok(t):
        return None
    if op == "in":
        if not isinstance(value, (tuple, list)) or not value:
            return None
        values = []
        for item in value:
            ok, v = _exact_value(item, t)
            if not ok:
                return None
            values.append(v)
        return Pred(op, column, tuple(values))
    ok, v = _exact_value(value, t)
    if not ok or (v is None and op != "eq_null_safe"):
        return None
    return Pred(op, column, v)


def conjunction(preds: Sequence[Pred]) -> Pred | None:
    """The AND of ``preds`` (None when empty)."""
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    return Pred("and", children=tuple(preds))


def disjunction(preds: Sequence[Pred | None]) -> Pred | None:
    """The OR of ``preds``; None (no filter: every row) when empty or when one is None."""
    if not preds or any(p is None for p in preds):
        return None
    kept = list(dict.fromkeys(p for p in preds if p is not None))
    if len(kept) == 1:
        return kept[0]
    return Pred("or", children=tuple(kept))


# --- evaluation ----------------------------------------------------------------------------

# A null boolean scalar; taken from an array because ``pa.scalar(None, ...)`` imports pandas
# (about a second in each fresh Spark worker that imports this package).
_NULL = pa.nulls(1, pa.bool_())[0]


def evaluate(table: pa.Table | pa.RecordBatch, pred: Pred) -> Any:
    """The predicate's three-valued result per row (a boolean array with nulls)."""
    op = pred.op
    if op == "not":
        return pc.invert(evaluate(table, pred.children[0]))
    if op == "and" or op == "or":
        combine = pc.and_kleene if op == "and" else pc.or_kleene
        result = evaluate(table, pred.children[0])
        for child in pred.children[1:]:
            result = combine(result, evaluate(table, child))
        return result
    col = table.column(pred.column)
    if op == "is_null":
        return pc.is_null(col)
    if op == "is_not_null":
        return pc.is_valid(col)
    if op == "starts_with":
        return pc.starts_with(col, pattern=pred.value)
    if op == "ends_with":
        return pc.ends_with(col, pattern=pred.value)
    if op == "contains":
        return pc.match_substring(col, pattern=pred.value)
    if op == "in":
        present = [v for v in pred.value if v is not None]
        found = pc.is_in(col, value_set=pa.array(present, type=col.type))
        result = pc.if_else(pc.is_null(col), _NULL, found)
        if len(present) < len(pred.value):  # x IN (..., NULL) is null unless true
            result = pc.if_else(result, True, _NULL)
        return result
    if op == "eq_null_safe":
        if pred.value is None:
            return pc.is_null(col)
        return pc.fill_null(pc.equal(col, pa.scalar(pred.value, col.type)), False)
    compare = {
        "eq": pc.equal,
        "lt": pc.less,
        "le": pc.less_equal,
        "gt": pc.greater,
        "ge": pc.greater_equal,
    }[op]
    return compare(col, pa.scalar(pred.value, col.type))


def filter_table(table: pa.Table, pred: Pred) -> pa.Table:
    """The rows of ``table`` for which ``pred`` is true."""
    if table.num_rows == 0:
        return table
    mask = pc.fill_null(evaluate(table, pred), False)
    return table.filter(mask)


# --- statistics ----------------------------------------------------------------------------

#: (min, max, null count) of a column in a chunk; min/max None when unknown.
Stats = tuple[Any, Any, int]


def may_match(pred: Pred, stats_of: Callable[[str], Stats | None], num_rows: int) -> bool:
    """Whether some row of a chunk of ``num_rows`` rows, whose columns have the statistics
    ``stats_of(column)`` (None: unknown), can make ``pred`` true."""
    op = pred.op
    if op == "and":
        return all(may_match(c, stats_of, num_rows) for c in pred.children)
    if op == "or":
        return any(may_match(c, stats_of, num_rows) for c in pred.children)
    if op == "not":
        child = pred.children[0]
        if child.op in ("is_null", "is_not_null"):
            flipped = "is_not_null" if child.op == "is_null" else "is_null"
            return may_match(Pred(flipped, child.column), stats_of, num_rows)
        return True
    st = stats_of(pred.column)
    if st is None:
        return True
    lo, hi, nulls = st
    if op == "is_null" or (op == "eq_null_safe" and pred.value is None):
        return nulls > 0
    if op == "is_not_null":
        return nulls < num_rows
    if nulls >= num_rows:
        return False  # every value is null: no value test is true
    if lo is None or hi is None:
        return True
    v = pred.value
    try:
        if op in ("eq", "eq_null_safe"):
            return bool(lo <= v <= hi)
        if op == "lt":
            return bool(lo < v)
        if op == "le":
            return bool(lo <= v)
        if op == "gt":
            return bool(hi > v)
        if op == "ge":
            return bool(hi >= v)
        if op == "in":
            return any(lo <= x <= hi for x in v if x is not None)
        if op == "starts_with":
            n = len(v)
            return bool(lo[:n] <= v <= hi[:n])
    except TypeError:  # statistics of an unexpected type: no proof
        return True
    return True


def chunk_stats(reader: PartReader, chunk: int, column: str) -> Stats | None:
    """The statistics of ``column`` in chunk ``chunk`` of a part (None when none are kept)."""
    info = reader.chunks[chunk]
    index = reader.schema.get_field_index(column)
    if index < 0:
        return None
    if info.column_stats is not None:
        cs = info.column_stats[index]
        return (cs.min, cs.max, cs.null_count) if cs is not None else None
    if column == reader.sort_column:  # format version 1: only the sort column
        return info.key_min, info.key_max, info.key_null_count
    return None


def chunk_may_match(pred: Pred, reader: PartReader, chunk: int) -> bool:
    """Whether some row of the chunk can make ``pred`` true (see `may_match`)."""
    return may_match(
        pred, lambda column: chunk_stats(reader, chunk, column), reader.chunks[chunk].num_rows
    )
