"""Unit tests (no JVM) of the `columns` DDL parser and of the option rules."""

from __future__ import annotations

import pytest
from conformance_helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st
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

from persistshard.datasource.ddl import parse_columns
from persistshard.datasource.options import ReadOptions, WriteOptions
from persistshard.errors import InvalidOption, StorageUnsupported

SIMPLE = [
    LongType(),
    IntegerType(),
    ShortType(),
    ByteType(),
    StringType(),
    DoubleType(),
    FloatType(),
    BooleanType(),
    DateType(),
    TimestampType(),
    TimestampNTZType(),
    BinaryType(),
    DecimalType(10, 0),
    DecimalType(38, 9),
]
names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)


def types() -> st.SearchStrategy[DataType]:
    return st.recursive(
        st.sampled_from(SIMPLE),
        lambda inner: st.one_of(
            inner.map(lambda t: ArrayType(t, True)),
            st.tuples(st.sampled_from(SIMPLE), inner).map(lambda kv: MapType(kv[0], kv[1], True)),
            st.lists(st.tuples(names, inner), min_size=1, max_size=3, unique_by=lambda f: f[0]).map(
                lambda fs: StructType([StructField(n, t, True) for n, t in fs])
            ),
        ),
        max_leaves=6,
    )


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(names, types(), st.booleans()), min_size=1, max_size=5, unique_by=lambda f: f[0]
    )
)
def test_parses_what_spark_prints(columns):
    """Every schema written in Spark's own type syntax (``simpleString``) parses back to
    itself, nullability included."""
    text = ", ".join(
        f"`{n}` {t.simpleString()}{'' if nullable else ' NOT NULL'}" for n, t, nullable in columns
    )
    expected = StructType([StructField(n, t, nullable) for n, t, nullable in columns])
    assert parse_columns(text) == expected


def test_synonyms_comments_and_quoting():
    parsed = parse_columns(
        "id LONG NOT NULL COMMENT 'the key', `odd``name` VARCHAR(10), amount NUMERIC(12, 2), "
        "s STRUCT<a: INT, b ARRAY<BOOL>>"
    )
    assert parsed == StructType(
        [
            StructField("id", LongType(), False, {"comment": "the key"}),
            StructField("odd`name", StringType()),
            StructField("amount", DecimalType(12, 2)),
            StructField(
                "s",
                StructType(
                    [StructField("a", IntegerType()), StructField("b", ArrayType(BooleanType()))]
                ),
            ),
        ]
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("id BIGINT,, x INT", "expected a column name"),
        ("id WIDGET", "unknown type WIDGET"),
        ("m MAP<STRING INT>", "expected ','"),
        ("a ARRAY<INT", "unexpected end"),
        ("id BIGINT $", "unexpected character"),
    ],
)
def test_bad_ddl_says_where(text, where):
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: cannot parse columns .*{where}"):
        parse_columns(text)


def test_read_option_rules():
    base = {"path": "/tmp/x"}
    opts = ReadOptions.parse({**base, "as_of": "3", "storage.anon": "true"})
    assert opts.as_of == 3 and opts.storage_options == {"anon": True}
    with pytest.raises(InvalidOption, match=r"unknown option as_off .*known options: "):
        ReadOptions.parse({**base, "as_off": "3"})
    with pytest.raises(InvalidOption, match="as_of cannot be combined with updates_from"):
        ReadOptions.parse({**base, "as_of": "3", "updates_from": "1"})
    with pytest.raises(InvalidOption, match="with_diff is implied by changes"):
        ReadOptions.parse({**base, "changes": "true", "with_diff": "true"})
    with pytest.raises(InvalidOption, match="option as_of must be an integer, got 'x'"):
        ReadOptions.parse({**base, "as_of": "x"})
    with pytest.raises(InvalidOption, match="option as_of must not be negative"):
        ReadOptions.parse({**base, "as_of": "-1"})


def test_write_option_rules():
    base = {"path": "/tmp/x"}
    opts = WriteOptions.parse({**base, "merge_schema": "true"})
    assert opts.merge_schema and opts.plain
    assert not WriteOptions.parse({**base, "expected_upper": "4"}).plain
    with pytest.raises(InvalidOption, match="needs option remap"):
        WriteOptions.parse({**base, "source_offset_column": "o"})
    with pytest.raises(StorageUnsupported, match="memory:// lives inside one process"):
        WriteOptions.parse({"path": "memory://x"})


def test_a_read_plans_at_least_the_planning_hosts_cores(tmp_path, monkeypatch):
    """``min_partitions`` defaults to the cores of the host that plans the read, and reaches
    the planner: a table of one part splits over them (given a mebibyte each, here scaled)."""
    import os

    import pyarrow as pa

    import persistshard as ps
    from persistshard.datasource.reader import PersistShardReader

    location = str(tmp_path / "s")
    n = 20_000
    ps.open_shard(location, chunk_bytes=4096).append(
        pa.table({"id": pa.array(range(n), pa.int64()), "_time": [0] * n, "_diff": [1] * n}),
        new_upper=1,
    )
    schema = StructType([StructField("id", LongType(), False)])
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert ReadOptions.parse({"path": location}).min_partitions == 3
    scaled = {"path": location, "min_task_bytes": "10000"}  # option: the configuration's knob
    assert len(PersistShardReader(scaled, schema).partitions()) == 3
    one = PersistShardReader({**scaled, "min_partitions": "1"}, schema)
    assert len(one.partitions()) == 1
