"""What a pyarrow compute expression used as a scan filter reads, and the `Pred` it implies.

`Shard.scan(filter=expr)` evaluates ``expr`` with Arrow itself; this module only tells the
scan two things about it: which top-level columns it reads (so it can run before the
projection, and before consolidation when it reads only row columns), and a
`persistshard.core.read.filters.Pred` that is true on every row ``expr`` is true on (so the
scan can skip chunks by their statistics).

The route is public: ``Expression.to_substrait(schema)`` serializes the expression bound to
the stored schema as a Substrait ``ExtendedExpression`` (a protobuf message whose layout is
the Substrait specification's, not pyarrow's), and `_Reader` decodes the few messages it
needs: scalar functions (named by the plan's extension declarations), field references,
literals and ``SingularOrList``. A literal's value is not decoded by hand: the literals are
handed back to ``pyarrow.substrait.deserialize_expressions`` and evaluated by Acero, so every
Arrow type arrives as Arrow makes it.

What always holds:
- ``skip`` is true on every row the expression is true on; ``exact`` only when it is true on
  no other row. Translated: ``and``/``or``, comparisons (``<``, ``<=``, ``>``,
  ``>=``, ``==``) of a column with a literal on either side, ``is_null``/``is_valid`` and
  their negations, ``isin`` without nulls in its value set; `bind` decides whether a leaf can
  be exact on its column's type. Everything else (arithmetic, ``!=``, ``is_nan``, casts,
  an ``isin`` whose value set holds a null, ``is_null(nan_is_null=True)``) implies no `Pred`:
  the scan reads every chunk and Arrow filters, slower, never wrong.
- An expression Arrow cannot serialize to Substrait (``pc.field("id") < 10.5`` binds with a
  safe cast Substrait cannot express; ``is_null(nan_is_null=True)``) implies no `Pred`; the
  columns it reads are then the ones it cannot bind without (each column of the schema left
  out in turn).
- ``columns`` is None (unknown) when the expression does not bind to the schema (the scan
  then refuses it by evaluating it, naming the cause), or when its Substrait form references
  a field inside a column or holds an expression kind not decoded here (a cast, a
  conditional), which may hide references.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.substrait as substrait

from persistshard.core.read.filters import Pred, bind, conjunction, disjunction

log = logging.getLogger("persistshard.core.read.expression")

__all__ = ["ExpressionFilter", "expression_filter"]

# A decoded Substrait expression: ("call", name, args) | ("field", column) | ("literal", index)
# | ("in", value, options) | ("nested",) (a reference into a column) | ("other",).
_Node = tuple[Any, ...]

#: Substrait function names (functions_comparison.yaml) -> `Pred` operators.
_OPS = {"lt": "lt", "lte": "le", "gt": "gt", "gte": "ge", "equal": "eq"}
#: The operator with its sides swapped (``3 < x`` is ``x > 3``).
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}


@dataclasses.dataclass(frozen=True)
class ExpressionFilter:
    """How a scan applies a pyarrow compute expression (see `expression_filter`)."""

    expression: pc.Expression
    columns: frozenset[str] | None  # the top-level columns it reads; None: unknown
    skip: Pred | None  # true on every row the expression is true on (chunk skipping)
    exact: bool  # ``skip`` is true on exactly those rows: the expression need not run


def expression_filter(expr: pc.Expression, schema: pa.Schema) -> ExpressionFilter:
    """What ``expr`` reads and which `Pred` it implies over the stored ``schema`` (module
    docstring)."""
    try:
        serialized = bytes(expr.to_substrait(schema))
    except (pa.ArrowException, TypeError, ValueError) as e:
        log.debug("filter %s has no Substrait form (%s): no chunk skipping", expr, e)
        return ExpressionFilter(expr, _columns_by_binding(expr, schema), None, False)
    try:
        reader = _Reader(serialized, schema)
        tree = reader.tree
        literals = reader.literal_values()
    except (ValueError, IndexError, KeyError, pa.ArrowException) as e:
        log.debug("filter %s: its Substrait form was not read (%r): no chunk skipping", expr, e)
        return ExpressionFilter(expr, _columns_by_binding(expr, schema), None, False)
    cols = _columns_of(tree)
    skip, exact = _to_pred(tree, literals, schema)
    return ExpressionFilter(expr, None if cols is None else frozenset(cols), skip, exact)


def _binds(expr: pc.Expression, schema: pa.Schema) -> bool:
    try:
        schema.empty_table().filter(expr)
    except (pa.ArrowException, TypeError, ValueError):
        return False
    return True


def _columns_by_binding(expr: pc.Expression, schema: pa.Schema) -> frozenset[str] | None:
    """The top-level columns of ``schema`` that ``expr`` cannot bind without (None when it
    does not bind to ``schema`` at all)."""
    if not _binds(expr, schema):
        return None
    fields = list(schema)
    return frozenset(
        f.name
        for i, f in enumerate(fields)
        if not _binds(expr, pa.schema(fields[:i] + fields[i + 1 :]))
    )


# --- protobuf, as much as Substrait's messages here need -----------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _message(data: bytes) -> dict[int, list[Any]]:
    """{field number: its values in order} of one protobuf message: an int for a varint,
    bytes for a length-delimited field (a string or a sub-message), raw bytes for fixed
    widths. ValueError on malformed bytes."""
    fields: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
            if pos > len(data):
                raise ValueError("truncated field")
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = data[pos : pos + width], pos + width
        else:
            raise ValueError(f"wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def _one(fields: dict[int, list[Any]], number: int, default: Any = None) -> Any:
    values = fields.get(number)
    return values[-1] if values else default


# Field numbers of the Substrait messages read (substrait/extended_expression.proto,
# extensions.proto, algebra.proto).
_EE_EXTENSION_URIS, _EE_EXTENSIONS, _EE_REFERRED, _EE_SCHEMA, _EE_VERSION = 1, 2, 3, 4, 7
_REF_EXPRESSION, _REF_OUTPUT_NAMES = 1, 3
_DECL_FUNCTION, _FUNCTION_ANCHOR, _FUNCTION_NAME = 3, 2, 3
_EX_LITERAL, _EX_SELECTION, _EX_FUNCTION, _EX_SINGULAR_OR_LIST = 1, 2, 3, 8
_FN_REFERENCE, _FN_ARGS_OLD, _FN_ARGUMENTS, _ARG_VALUE = 1, 2, 4, 3
_SEL_DIRECT, _SEL_ROOT = 1, 4
_SEG_STRUCT, _STRUCT_FIELD, _STRUCT_CHILD = 2, 1, 2
_LIST_VALUE, _LIST_OPTIONS = 1, 2


class _Reader:
    """The tree of one serialized ``ExtendedExpression`` holding one expression bound to
    ``schema`` (field references are positions in it); its literals are collected in order
    for `literal_values`."""

    def __init__(self, data: bytes, schema: pa.Schema) -> None:
        self._top = _message(data)
        self._names = schema.names
        self._functions: dict[int, str] = {}
        for decl in self._top.get(_EE_EXTENSIONS, []):
            function = _one(_message(decl), _DECL_FUNCTION)
            if function is not None:
                f = _message(function)
                name = _one(f, _FUNCTION_NAME, b"").decode()
                self._functions[_one(f, _FUNCTION_ANCHOR, 0)] = name.split(":", 1)[0]
        self._literals: list[bytes] = []
        referred = self._top.get(_EE_REFERRED, [])
        if len(referred) != 1:
            raise ValueError(f"{len(referred)} expressions")
        self.tree = self._node(_one(_message(referred[0]), _REF_EXPRESSION, b""))

    def _node(self, data: bytes) -> _Node:
        ex = _message(data)
        if _EX_LITERAL in ex:
            self._literals.append(data)
            return ("literal", len(self._literals) - 1)
        if _EX_SELECTION in ex:
            return self._field(_message(_one(ex, _EX_SELECTION)))
        if _EX_FUNCTION in ex:
            fn = _message(_one(ex, _EX_FUNCTION))
            name = self._functions[_one(fn, _FN_REFERENCE, 0)]
            values = [_one(_message(a), _ARG_VALUE) for a in fn.get(_FN_ARGUMENTS, [])]
            if any(v is None for v in values):  # an enum or type argument
                return ("other",)
            values += fn.get(_FN_ARGS_OLD, [])
            return ("call", name, tuple(self._node(v) for v in values))
        if _EX_SINGULAR_OR_LIST in ex:
            sol = _message(_one(ex, _EX_SINGULAR_OR_LIST))
            value = self._node(_one(sol, _LIST_VALUE, b""))
            return ("in", value, tuple(self._node(o) for o in sol.get(_LIST_OPTIONS, [])))
        return ("other",)

    def _field(self, selection: dict[int, list[Any]]) -> _Node:
        direct = _one(selection, _SEL_DIRECT)
        if direct is None or _SEL_ROOT not in selection:
            return ("other",)  # a masked reference, or one into another expression
        segment = _one(_message(direct), _SEG_STRUCT)
        if segment is None:
            return ("other",)
        struct = _message(segment)
        if _STRUCT_CHILD in struct:
            return ("nested",)
        return ("field", self._names[_one(struct, _STRUCT_FIELD, 0)])

    def literal_values(self) -> list[pa.Scalar]:
        """The literals of the tree as Arrow scalars, in the order of their indices: handed
        back to pyarrow's Substrait reader in one message of their own and evaluated."""
        if not self._literals:
            return []
        top = self._top
        out = bytearray()
        for number in (_EE_VERSION, _EE_EXTENSION_URIS, _EE_EXTENSIONS, _EE_SCHEMA):
            for value in top.get(number, []):
                out += _field_bytes(number, value)
        for i, literal in enumerate(self._literals):
            ref = _field_bytes(_REF_EXPRESSION, literal)
            ref += _field_bytes(_REF_OUTPUT_NAMES, f"l{i}".encode())
            out += _field_bytes(_EE_REFERRED, ref)
        # Acero pulls in pyarrow.dataset and with it pandas (about 0.7 s of CPU): imported here,
        # not at module level, so a Spark Python worker that plans or writes never pays for it.
        import pyarrow.acero as acero

        bound = substrait.deserialize_expressions(pa.py_buffer(bytes(out)))
        names = [f"l{i}" for i in range(len(self._literals))]
        plan = acero.Declaration.from_sequence(
            [
                acero.Declaration(
                    "table_source", acero.TableSourceNodeOptions(pa.table({"row": [0]}))
                ),
                acero.Declaration(
                    "project",
                    acero.ProjectNodeOptions([bound.expressions[n] for n in names], names),
                ),
            ]
        )
        table = plan.to_table()
        return [table.column(n)[0] for n in names]


def _field_bytes(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field."""
    return _encode_varint(number << 3 | 2) + _encode_varint(len(value)) + value


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# --- the tree -> columns and Pred ----------------------------------------------------------


def _columns_of(node: _Node) -> set[str] | None:
    """Top-level columns ``node`` reads (None: a nested reference or an expression kind not
    decoded, which may hide references)."""
    kind = node[0]
    if kind == "field":
        return {node[1]}
    if kind == "literal":
        return set()
    if kind == "call":
        children: tuple[_Node, ...] = node[2]
    elif kind == "in":
        children = (node[1], *node[2])
    else:
        return None
    out: set[str] = set()
    for child in children:
        cols = _columns_of(child)
        if cols is None:
            return None
        out |= cols
    return out


def _to_pred(node: _Node, literals: list[pa.Scalar], schema: pa.Schema) -> tuple[Pred | None, bool]:
    """(a `Pred` true on every row ``node`` is true on, whether it is true on no other row);
    None: no predicate narrower than "every row" (module docstring)."""
    kind = node[0]
    if kind == "in":
        value, options = node[1], node[2]
        if value[0] != "field" or not options or any(o[0] != "literal" for o in options):
            return None, False
        values = [literals[o[1]].as_py() for o in options]
        if any(v is None for v in values):
            return None, False  # null matches null in Arrow's is_in: not a SQL IN
        pred = bind("in", value[1], tuple(values), schema)
        return pred, pred is not None
    if kind != "call":
        return None, False
    _, name, args = node
    if name in ("and", "or"):
        parts = [_to_pred(a, literals, schema) for a in args]
        if name == "and":
            kept = [p for p, _ in parts if p is not None]
            return conjunction(kept), all(p is not None and e for p, e in parts)
        if any(p is None for p, _ in parts):
            return None, False
        return disjunction([p for p, _ in parts]), all(e for _, e in parts)
    if name in _OPS and len(args) == 2:
        a, b = args
        if a[0] == "field" and b[0] == "literal":
            pred = bind(_OPS[name], a[1], literals[b[1]].as_py(), schema)
        elif a[0] == "literal" and b[0] == "field":
            pred = bind(_FLIP[_OPS[name]], b[1], literals[a[1]].as_py(), schema)
        else:
            return None, False
        return pred, pred is not None
    null_tests = {"is_null": "is_null", "is_not_null": "is_not_null"}
    if name in null_tests and len(args) == 1 and args[0][0] == "field":
        pred = bind(null_tests[name], args[0][1], None, schema)
        return pred, pred is not None
    if name == "not" and len(args) == 1 and args[0][0] == "call":
        _, inner, inner_args = args[0]
        negated = {"is_null": "is_not_null", "is_not_null": "is_null"}
        if inner in negated and len(inner_args) == 1 and inner_args[0][0] == "field":
            pred = bind(negated[inner], inner_args[0][1], None, schema)
            return pred, pred is not None
    return None, False
