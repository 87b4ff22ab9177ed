"""Parse a column list in Spark DDL (``id BIGINT, tags ARRAY<STRING>``) into a StructType.

Used for the ``columns`` option of ``CREATE TABLE ... USING persistshard``. It runs in a Python
worker, where Spark's own parser (which needs the JVM) is not available. It accepts Spark's
type names and aliases, ``DECIMAL(p, s)``, ``ARRAY<T>``, ``MAP<K, V>``, ``STRUCT<a: T, b T>``,
backquoted names, ``NOT NULL`` and ``COMMENT '...'``; anything else is refused with
`InvalidOption` naming the position.
"""

from __future__ import annotations

import re
from typing import NoReturn

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from persistshard.errors import InvalidOption

_SIMPLE: dict[str, DataType] = {
    "BIGINT": LongType(),
    "LONG": LongType(),
    "INT": IntegerType(),
    "INTEGER": IntegerType(),
    "SMALLINT": ShortType(),
    "SHORT": ShortType(),
    "TINYINT": ByteType(),
    "BYTE": ByteType(),
    "STRING": StringType(),
    "DOUBLE": DoubleType(),
    "FLOAT": FloatType(),
    "REAL": FloatType(),
    "BOOLEAN": BooleanType(),
    "BOOL": BooleanType(),
    "DATE": DateType(),
    "TIMESTAMP": TimestampType(),
    "TIMESTAMP_LTZ": TimestampType(),
    "TIMESTAMP_NTZ": TimestampNTZType(),
    "BINARY": BinaryType(),
}

_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|'(?:[^'\\]|\\.)*'|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self.error(pos, "unexpected character")
            self.tokens.append((m.group(1), m.start(1)))
            pos = m.end()
        self.i = 0

    def error(self, pos: int, why: str) -> InvalidOption:
        return InvalidOption(f"cannot parse columns {self.text!r} at position {pos}: {why}")

    def fail(self, pos: int, why: str) -> NoReturn:
        raise self.error(pos, why)

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def take(self) -> str:
        if self.i >= len(self.tokens):
            self.fail(len(self.text), "unexpected end")
        tok = self.tokens[self.i][0]
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        pos = self.tokens[self.i][1] if self.i < len(self.tokens) else len(self.text)
        got = self.take()
        if got.upper() != tok:
            self.fail(pos, f"expected {tok!r}, got {got!r}")

    def name(self) -> str:
        tok = self.take()
        if tok.startswith("`"):
            return tok[1:-1].replace("``", "`")
        if not re.match(r"[A-Za-z_]", tok):
            self.fail(self.tokens[self.i - 1][1], f"expected a column name, got {tok!r}")
        return tok

    def data_type(self) -> DataType:
        pos = self.tokens[self.i][1] if self.i < len(self.tokens) else len(self.text)
        word = self.take().upper()
        if word in ("DECIMAL", "DEC", "NUMERIC"):
            if self.peek() == "(":
                self.take()
                precision = int(self.take())
                scale = 0
                if self.peek() == ",":
                    self.take()
                    scale = int(self.take())
                self.expect(")")
                return DecimalType(precision, scale)
            return DecimalType(10, 0)
        if word in ("VARCHAR", "CHAR"):
            self.expect("(")
            self.take()
            self.expect(")")
            return StringType()
        if word == "ARRAY":
            self.expect("<")
            element = self.data_type()
            self.expect(">")
            return ArrayType(element, True)
        if word == "MAP":
            self.expect("<")
            key = self.data_type()
            self.expect(",")
            value = self.data_type()
            self.expect(">")
            return MapType(key, value, True)
        if word == "STRUCT":
            self.expect("<")
            fields = []
            while self.peek() != ">":
                name = self.name()
                if self.peek() == ":":
                    self.take()
                fields.append(self.field_rest(name))
                if self.peek() == ",":
                    self.take()
            self.expect(">")
            return StructType(fields)
        if word in _SIMPLE:
            return _SIMPLE[word]
        self.fail(pos, f"unknown type {word}")
        raise AssertionError  # unreachable

    def field_rest(self, name: str) -> StructField:
        dtype = self.data_type()
        nullable = True
        metadata: dict[str, str] = {}
        while self.peek() is not None and self.peek().upper() in ("NOT", "COMMENT"):  # type: ignore[union-attr]
            word = self.take().upper()
            if word == "NOT":
                self.expect("NULL")
                nullable = False
            else:
                text = self.take()
                metadata["comment"] = text[1:-1]
        return StructField(name, dtype, nullable, metadata or None)


def parse_columns(text: str) -> StructType:
    """The StructType of a DDL column list, or `InvalidOption` saying where it fails."""
    parser = _Parser(text)
    fields = []
    while parser.peek() is not None:
        name = parser.name()
        fields.append(parser.field_rest(name))
        if parser.peek() == ",":
            parser.take()
        elif parser.peek() is not None:
            parser.fail(parser.tokens[parser.i][1], f"expected ',', got {parser.peek()!r}")
    if not fields:
        raise InvalidOption(f"the columns option {text!r} names no columns")
    return StructType(fields)
