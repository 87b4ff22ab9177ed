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
from typing import Any, NoReturn

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


# --- the ``where`` option ------------------------------------------------------------------
#
# Grammar (keywords case-insensitive; a SQL WHERE clause restricted to what `bind` can
# evaluate exactly):
#
#   where      := or
#   or         := and ("OR" and)*
#   and        := not ("AND" not)*
#   not        := "NOT" not | "(" or ")" | predicate
#   predicate  := column cmp literal | literal cmp column
#               | column "IS" ["NOT"] "NULL"
#               | column ["NOT"] "IN" "(" literal ("," literal)* ")"
#               | column ["NOT"] "BETWEEN" literal "AND" literal
#               | column ["NOT"] "LIKE" string
#   cmp        := "=" | "==" | "<=>" | "<>" | "!=" | "<" | "<=" | ">" | ">="
#   column     := identifier | `back-quoted`
#   literal    := ["-"] integer | ["-"] decimal ["BD"] | string | "TRUE" | "FALSE" | "NULL"
#               | "DATE" string
#   string     := '...' ('' or \' for a quote, \\ for a backslash)
#
# A LIKE pattern may use ``%`` only at its start and/or end (``'ab%'``, ``'%ab'``, ``'%ab%'``,
# ``'ab'``); ``_`` and inner ``%`` are refused.


class WhereSyntaxError(ValueError):
    """A ``where`` text the grammar above does not accept, or one `bind` cannot make exact;
    the message says what and where. The Spark layer re-raises it as its bad-option error."""


_SYMBOLS = ("<=>", "<=", ">=", "<>", "!=", "==", "=", "<", ">", "(", ")", ",", "-")
_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "IN", "BETWEEN", "LIKE", "TRUE", "FALSE", "DATE"}
)
_FLIPPED = {
    "lt": "gt",
    "le": "ge",
    "gt": "lt",
    "ge": "le",
    "eq": "eq",
    "eq_null_safe": "eq_null_safe",
}
_CMP = {"=": "eq", "==": "eq", "<=>": "eq_null_safe", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


@dataclass(frozen=True)
class _Token:
    kind: str  # "ident", "keyword", "string", "number", "symbol", "end"
    text: str
    value: Any
    at: int


def _tokens(text: str) -> list[_Token]:
    import decimal
    import re

    out: list[_Token] = []
    number = re.compile(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?(BD|bd|L|l)?(?![A-Za-z0-9_])")
    ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch == "'":
            j, chars = i + 1, []
            while True:
                if j >= len(text):
                    raise WhereSyntaxError(f"unterminated string starting at character {i + 1}")
                c = text[j]
                if c == "\\" and j + 1 < len(text) and text[j + 1] in "'\\":
                    chars.append(text[j + 1])
                    j += 2
                elif c == "'" and text[j + 1 : j + 2] == "'":
                    chars.append("'")
                    j += 2
                elif c == "'":
                    break
                else:
                    chars.append(c)
                    j += 1
            out.append(_Token("string", text[i : j + 1], "".join(chars), i))
            i = j + 1
            continue
        if ch == "`":
            end = i + 1
            name = []
            while True:
                if end >= len(text):
                    raise WhereSyntaxError(f"unterminated `name` starting at character {i + 1}")
                if text[end] == "`" and text[end + 1 : end + 2] == "`":
                    name.append("`")
                    end += 2
                elif text[end] == "`":
                    break
                else:
                    name.append(text[end])
                    end += 1
            out.append(_Token("ident", text[i : end + 1], "".join(name), i))
            i = end + 1
            continue
        m = number.match(text, i)
        if m:
            body, exponent, suffix = m.group(1), m.group(2), (m.group(3) or "").upper()
            if exponent or (suffix == "L" and "." in body):
                raise WhereSyntaxError(
                    f"number {m.group(0)} at character {i + 1}: floating-point literals are "
                    "not supported (write a decimal such as 1.5)"
                )
            value: Any = decimal.Decimal(body) if "." in body else int(body)
            if suffix == "BD":
                value = decimal.Decimal(body)
            out.append(_Token("number", m.group(0), value, i))
            i = m.end()
            continue
        m = ident.match(text, i)
        if m:
            word = m.group(0)
            kind = "keyword" if word.upper() in _KEYWORDS else "ident"
            out.append(_Token(kind, word, word.upper() if kind == "keyword" else word, i))
            i = m.end()
            continue
        for sym in _SYMBOLS:
            if text.startswith(sym, i):
                out.append(_Token("symbol", sym, sym, i))
                i += len(sym)
                break
        else:
            raise WhereSyntaxError(f"unexpected character {ch!r} at character {i + 1}")
    out.append(_Token("end", "", None, len(text)))
    return out


class _Parser:
    """Recursive descent over `_tokens`; builds *unbound* `Pred` trees (values as written)."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self, offset: int = 0) -> _Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.i += 1
        return token

    def accept(self, kind: str, value: Any) -> bool:
        token = self.peek()
        if token.kind == kind and token.value == value:
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: Any, what: str) -> None:
        if not self.accept(kind, value):
            self.fail(what)

    def fail(self, wanted: str) -> NoReturn:
        token = self.peek()
        found = "the end" if token.kind == "end" else repr(token.text)
        raise WhereSyntaxError(f"expected {wanted} at character {token.at + 1}, found {found}")

    def parse(self) -> Pred:
        pred = self.or_()
        if self.peek().kind != "end":
            self.fail("AND, OR or the end")
        return pred

    def or_(self) -> Pred:
        parts = [self.and_()]
        while self.accept("keyword", "OR"):
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else Pred("or", children=tuple(parts))

    def and_(self) -> Pred:
        parts = [self.not_()]
        while self.accept("keyword", "AND"):
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else Pred("and", children=tuple(parts))

    def not_(self) -> Pred:
        if self.accept("keyword", "NOT"):
            return Pred("not", children=(self.not_(),))
        if self.accept("symbol", "("):
            inner = self.or_()
            self.expect("symbol", ")", "')'")
            return inner
        return self.predicate()

    def literal(self) -> Any:
        token = self.take()
        if token.kind == "symbol" and token.value == "-":
            number = self.take()
            if number.kind != "number":
                self.i -= 1
                return self.fail("a number after '-'")
            return -number.value
        if token.kind in ("number", "string"):
            return token.value
        if token.kind == "keyword" and token.value in ("TRUE", "FALSE"):
            return token.value == "TRUE"
        if token.kind == "keyword" and token.value == "NULL":
            return None
        if token.kind == "keyword" and token.value == "DATE":
            import datetime as dt

            text = self.take()
            if text.kind != "string":
                self.i -= 1
                return self.fail("a date string after DATE, as in DATE '2024-01-31'")
            try:
                return dt.date.fromisoformat(text.value)
            except ValueError:
                raise WhereSyntaxError(
                    f"DATE {text.text} at character {token.at + 1} is not a date (YYYY-MM-DD)"
                ) from None
        self.i -= 1
        return self.fail("a literal (number, 'string', TRUE, FALSE, NULL or DATE '...')")

    def is_literal_start(self) -> bool:
        token = self.peek()
        return (
            token.kind in ("number", "string")
            or (token.kind == "keyword" and token.value in ("TRUE", "FALSE", "NULL", "DATE"))
            or (token.kind == "symbol" and token.value == "-")
        )

    def predicate(self) -> Pred:
        if self.is_literal_start():  # literal cmp column
            value = self.literal()
            op = self.peek()
            if op.kind != "symbol" or op.value not in (*_CMP, "<>", "!="):
                return self.fail("a comparison (=, <>, <, <=, >, >=, <=>)")
            self.take()
            column = self.column()
            if op.value in ("<>", "!="):
                return Pred("not", children=(Pred("eq", column, value),))
            return Pred(_FLIPPED[_CMP[op.value]], column, value)
        column = self.column()
        token = self.take()
        if token.kind == "symbol" and token.value in _CMP:
            return Pred(_CMP[token.value], column, self.literal())
        if token.kind == "symbol" and token.value in ("<>", "!="):
            return Pred("not", children=(Pred("eq", column, self.literal()),))
        if token.kind == "keyword" and token.value == "IS":
            negated = self.accept("keyword", "NOT")
            self.expect("keyword", "NULL", "NULL")
            return Pred("is_not_null" if negated else "is_null", column)
        negated = token.kind == "keyword" and token.value == "NOT"
        if negated:
            token = self.take()
        pred: Pred
        if token.kind == "keyword" and token.value == "IN":
            self.expect("symbol", "(", "'(' after IN")
            values = [self.literal()]
            while self.accept("symbol", ","):
                values.append(self.literal())
            self.expect("symbol", ")", "')' closing the IN list")
            pred = Pred("in", column, tuple(values))
        elif token.kind == "keyword" and token.value == "BETWEEN":
            lo = self.literal()
            self.expect("keyword", "AND", "AND in BETWEEN ... AND ...")
            hi = self.literal()
            pred = Pred("and", children=(Pred("ge", column, lo), Pred("le", column, hi)))
        elif token.kind == "keyword" and token.value == "LIKE":
            pattern = self.take()
            if pattern.kind != "string":
                self.i -= 1
                return self.fail("a 'pattern' after LIKE")
            pred = _like(column, pattern.value)
        else:
            self.i -= 1
            return self.fail("a comparison, IS [NOT] NULL, [NOT] IN, [NOT] BETWEEN or [NOT] LIKE")
        return Pred("not", children=(pred,)) if negated else pred

    def column(self) -> str:
        token = self.take()
        if token.kind != "ident":
            self.i -= 1
            self.fail("a column name")
        return str(token.value)


def _like(column: str, pattern: str) -> Pred:
    """``column LIKE pattern`` for the patterns the grammar allows (see above)."""
    starts, ends = pattern.startswith("%"), pattern.endswith("%") and len(pattern) > 1
    body = pattern[1 if starts else 0 : len(pattern) - 1 if ends else len(pattern)]
    if "%" in body or "_" in body or "\\" in body:
        raise WhereSyntaxError(
            f"LIKE {pattern!r}: only a leading and/or trailing % is supported ('ab%', '%ab', "
            "'%ab%'); _, inner % and escapes are not"
        )
    # A string column's LIKE is null for a null value: starts_with keeps that (even for '%').
    if starts and ends:
        return Pred("contains", column, body)
    if starts:
        return Pred("ends_with", column, body)
    if ends or not body:
        return Pred("starts_with", column, body)
    return Pred("like_eq", column, body)


def parse_where(text: str) -> Pred:
    """The *unbound* predicate of a ``where`` text (grammar above): the tree, with values as
    written (int, `decimal.Decimal`, str, bool, None, `datetime.date`); `bind_where` checks
    it against a schema. Raises `WhereSyntaxError`."""
    if not text.strip():
        raise WhereSyntaxError("the text is empty; give a condition such as id < 10")
    return _Parser(text).parse()


def _type_name(t: pa.DataType) -> str:
    return str(t)


def bind_where(pred: Pred, schema: pa.Schema) -> Pred:
    """``pred`` (from `parse_where`) with every leaf bound by `bind` against ``schema``;
    raises `WhereSyntaxError` for an unknown column or a test `bind` cannot make exact."""
    if pred.op in ("not", "and", "or"):
        return Pred(pred.op, children=tuple(bind_where(c, schema) for c in pred.children))
    index = schema.get_field_index(pred.column)
    if index < 0:
        raise WhereSyntaxError(
            f"no column {pred.column!r}; the columns are {', '.join(schema.names)}"
        )
    t = schema.field(index).type
    op = pred.op
    if op == "like_eq":
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise WhereSyntaxError(f"LIKE needs a string column; {pred.column} is {t}")
        op = "eq"
    if op in COMPARISONS and op != "eq_null_safe" and pred.value is None:
        raise WhereSyntaxError(
            f"{pred.column} compared with NULL is never true; write {pred.column} IS NULL "
            f"(or {pred.column} <=> NULL)"
        )
    if op in STRING_OPS and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise WhereSyntaxError(f"LIKE needs a string column; {pred.column} is {t}")
    bound = bind(op, pred.column, pred.value, schema)
    if bound is not None:
        return bound
    if op not in ("is_null", "is_not_null", *STRING_OPS) and not _value_type_ok(t):
        why = (
            "floating-point columns are not filtered (NaN and -0.0 order differently in Spark "
            "and Arrow)"
            if pa.types.is_floating(t)
            else f"values of type {_type_name(t)} are not compared by the where option"
        )
        raise WhereSyntaxError(f"cannot filter {pred.column} ({_type_name(t)}): {why}")
    raise WhereSyntaxError(
        f"the value {pred.value!r} does not fit column {pred.column} ({_type_name(t)}) exactly "
        "(write a literal of the column's type: 10 for integers, 1.50 for decimals, 'text' "
        "for strings, DATE '2024-01-31' for dates, TRUE/FALSE for booleans)"
    )
