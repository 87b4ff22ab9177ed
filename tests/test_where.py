"""The ``where`` read option: explicit pruning that cannot go stale (issue 28 item 2).

The grammar (`persistshard.core.read.filters.parse_where`) and its refusals; exact answers, equal
to Spark's own filtering of the same condition, over random shards with nulls, for snapshots,
time travel, ``with_diff`` and change reads; chunks the condition rules out are never read;
the SQL forms (``WITH ('where' = ...)``, a temporary view's OPTIONS); a bad where fails with
a message that names the text.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import re
import uuid
from collections import Counter
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.core.read.filters import Pred, WhereSyntaxError, bind_where, parse_where
from persistshard.errors import InvalidOption

SCHEMA = pa.schema(
    [
        pa.field("i", pa.int64()),
        pa.field("s", pa.string()),
        pa.field("d", pa.date32()),
        pa.field("m", pa.decimal128(9, 2)),
        pa.field("b", pa.bool_()),
        pa.field("f", pa.float64()),
    ]
)
STRINGS = ["", "a", "ab", "abc", "b", "ba", "é", "zz", "it's"]
DAY0 = dt.date(2020, 1, 1)


# --- the grammar ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("i < 10 AND s = 'x'", "(i lt 10) AND (s eq 'x')"),
        ("i <> 3", "NOT (i eq 3)"),
        ("i != 3 or i == 4", "(NOT (i eq 3)) OR (i eq 4)"),
        ("3 <= i", "i ge 3"),
        ("-2 > i", "i lt -2"),
        ("i <=> NULL", "i eq_null_safe None"),
        ("i IS NOT NULL AND NOT s IS NULL", "(i IS NOT NULL) AND (NOT (s IS NULL))"),
        ("i NOT IN (1, -2, NULL)", "NOT (i in (1, -2, None))"),
        ("i BETWEEN 1 AND 4", "(i ge 1) AND (i le 4)"),
        ("s LIKE 'ab%'", "s starts_with 'ab'"),
        ("s NOT LIKE '%b'", "NOT (s ends_with 'b')"),
        ("s like '%b%'", "s contains 'b'"),
        ("s LIKE 'ab'", "s eq 'ab'"),
        ("s = 'it''s' OR s = 'it\\'s'", '(s eq "it\'s") OR (s eq "it\'s")'),
        ("d >= DATE '2020-01-03'", "d ge datetime.date(2020, 1, 3)"),
        ("m = 1.50BD OR m < -2", "(m eq Decimal('1.50')) OR (m lt Decimal('-2.00'))"),
        ("b = TRUE AND `i` > 0", "(b eq True) AND (i gt 0)"),
        ("((i > 0))", "i gt 0"),
    ],
)
def test_the_grammar_binds_to_exact_filters(text: str, bound: str) -> None:
    assert str(bind_where(parse_where(text), SCHEMA)) == bound


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("i <", "expected a literal"),
        ("i < 1 i", "expected AND, OR or the end"),
        ("(i = 1", "expected ')'"),
        ("s = 'abc", "unterminated string"),
        ("i = 1e3", "floating-point literals"),
        ("i = 1.5", "does not fit column i"),
        ("s = 5", "does not fit column s"),
        ("f > 0.5", "floating-point columns"),
        ("x = 1", "no column 'x'; the columns are i, s, d, m, b, f"),
        ("i = NULL", "write i IS NULL"),
        ("s LIKE 'a_c'", "only a leading and/or trailing %"),
        ("s LIKE 'a%c'", "only a leading and/or trailing %"),
        ("i LIKE 'a%'", "LIKE needs a string column"),
        ("d = DATE '2020-13-01'", "is not a date"),
        ("i = 99999999999999999999", "does not fit column i"),
        ("i IN ()", "expected a literal"),
        ("i + 1 > 2", "unexpected character '+'"),
        ("upper(s) = 'A'", "expected a comparison"),
    ],
)
def test_what_the_grammar_refuses_says_why(text: str, says: str) -> None:
    with pytest.raises(WhereSyntaxError, match=re.escape(says)):
        bind_where(parse_where(text), SCHEMA)


def test_a_parsed_where_is_a_plain_frozen_tree() -> None:
    """What the reader keeps is picklable data (it travels to the executors)."""
    import pickle

    tree = parse_where("i IN (1, 2) AND NOT s LIKE 'a%' AND d < DATE '2020-01-02'")
    assert isinstance(tree, Pred)
    assert pickle.loads(pickle.dumps(tree)) == tree


# --- without Spark: the reader applies it exactly and skips chunks -------------------------


def _reader(location: str, where: str, schema: StructType, **options: str) -> Any:
    from persistshard.datasource.reader import PersistShardReader

    return PersistShardReader({"path": location, "where": where, **options}, schema)


def _rows(reader: Any) -> list[dict[str, Any]]:
    return [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]


def test_where_skips_chunks_it_rules_out_and_filters_exactly(tmp_path: Any) -> None:
    from persistshard.core.storage.parts import open_part

    location = str(tmp_path / "s")
    n = 20_000
    ps.open_shard(location, chunk_bytes=4096).append(
        pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "name": [f"n{i % 100}" for i in range(n)],
                "_time": [0] * n,
                "_diff": [1] * n,
            }
        ),
        new_upper=1,
    )
    schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
    reader = _reader(location, "id < 150 AND name = 'n7'", schema, min_partitions="1")
    partitions = reader.partitions()
    chunks = [c for p in partitions for s in p.task.slices for c in (s.chunks or ())]
    shard = ps.open_shard(location)
    (ref,) = shard.inspect.state().trace[0].parts
    assert len(open_part(shard._blob, ref).chunks) > 20  # the whole part
    assert 0 < len(chunks) <= 2  # the ones that can hold id < 150
    assert _rows(reader) == [{"id": 7, "name": "n7"}, {"id": 107, "name": "n7"}]


def test_where_on_diff_and_time_filters_the_final_rows(tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(pa.table({"k": [1, 2, 3], "_time": [0, 0, 0], "_diff": [1, 1, 2]}), new_upper=1)
    shard.append(pa.table({"k": [1, 3], "_time": [1, 1], "_diff": [-1, 1]}), new_upper=2)
    diff = StructType([StructField("k", LongType()), StructField("_diff", LongType(), False)])
    got = _rows(_reader(location, "_diff > 1 OR k = 2", diff, with_diff="true"))
    assert sorted((r["k"], r["_diff"]) for r in got) == [(2, 1), (3, 3)]
    changes = StructType([*diff.fields, StructField("_time", LongType(), False)])
    got = _rows(_reader(location, "_time = 1 AND _diff < 0", changes, updates_from="0"))
    assert [(r["k"], r["_time"], r["_diff"]) for r in got] == [(1, 1, -1)]
    plain = StructType([StructField("k", LongType())])
    with pytest.raises(InvalidOption, match=r"option where '_diff > 0' cannot be applied"):
        _rows(_reader(location, "_diff > 0", plain))  # a snapshot without _diff has none


def test_a_bad_where_fails_before_anything_is_read(tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    ps.open_shard(location).append(pa.table({"k": [1], "_time": [0], "_diff": [1]}), new_upper=1)
    schema = StructType([StructField("k", LongType())])
    with pytest.raises(InvalidOption, match=r"InvalidOption: option where 'k <' cannot be"):
        _reader(location, "k <", schema)
    with pytest.raises(InvalidOption, match=r"option where 'kk = 1'.*no column 'kk'"):
        _reader(location, "kk = 1", schema).partitions()


# --- through Spark: equal to Spark's own filtering -----------------------------------------


def literal(column: str, rnd: Any) -> str:
    if column == "i":
        return str(rnd.randint(-4, 4))
    if column == "s":
        return "'" + rnd.choice(STRINGS).replace("'", "''") + "'"
    if column == "d":
        return f"DATE '{DAY0 + dt.timedelta(days=rnd.randint(0, 6))}'"
    if column == "m":
        return f"{decimal.Decimal(rnd.randint(-300, 300)).scaleb(-2)}"
    if column == "b":
        return rnd.choice(["true", "FALSE"])
    return "0.5"


def leaf(rnd: Any, columns: list[str]) -> str:
    column = rnd.choice(columns)
    kind = rnd.choice(["cmp", "cmp", "in", "null", "between"] + (["like"] if column == "s" else []))
    if kind == "null":
        return f"{column} IS {rnd.choice(['', 'NOT '])}NULL"
    if kind == "in":
        items = [literal(column, rnd) for _ in range(rnd.randint(1, 3))]
        if rnd.random() < 0.3:
            items.append("NULL")
        return f"{column} {rnd.choice(['', 'NOT '])}IN ({', '.join(items)})"
    if kind == "between":
        return f"{column} {rnd.choice(['', 'NOT '])}BETWEEN {literal(column, rnd)} AND " + (
            literal(column, rnd)
        )
    if kind == "like":
        pattern = rnd.choice(["a%", "%b", "%b%", "ab", "%", "it''s"])
        return f"s {rnd.choice(['', 'NOT '])}LIKE '{pattern}'"
    op = rnd.choice(["=", "<=>", "<", "<=", ">", ">=", "<>", "!="])
    if rnd.random() < 0.2:
        return f"{literal(column, rnd)} {op} {column}"
    return f"{column} {op} {literal(column, rnd)}"


def clause(rnd: Any, columns: list[str], depth: int = 0) -> str:
    if depth >= 2 or rnd.random() < 0.5:
        return leaf(rnd, columns)
    shape = rnd.choice(["and", "or", "not"])
    if shape == "not":
        return f"NOT ({clause(rnd, columns, depth + 1)})"
    return (
        f"({clause(rnd, columns, depth + 1)}) {shape.upper()} ({clause(rnd, columns, depth + 1)})"
    )


def value(column: str, rnd: Any) -> Any:
    if rnd.random() < 0.25:
        return None
    if column == "i":
        return rnd.randint(-4, 4)
    if column == "s":
        return rnd.choice(STRINGS)
    if column == "d":
        return DAY0 + dt.timedelta(days=rnd.randint(0, 6))
    if column == "m":
        return Decimal(rnd.randint(-300, 300)).scaleb(-2)
    if column == "b":
        return rnd.random() < 0.5
    return rnd.choice([0.5, -0.0, float("nan")])


def write_random_shard(location: str, rnd: Any) -> None:
    """Inserts, retractions of some, more inserts: snapshots must consolidate, and change
    reads have several times and negative diffs."""
    shard = ps.open_shard(location)
    rows = [{c: value(c, rnd) for c in SCHEMA.names} for _ in range(rnd.randint(5, 40))]
    batches = [
        [(r, 0, 1) for r in rows],
        [(r, 1, -1) for r in rows if rnd.random() < 0.3],
        [({c: value(c, rnd) for c in SCHEMA.names}, 2, rnd.choice([1, 2])) for _ in range(10)],
    ]
    for time, batch in enumerate(batches):
        table = pa.Table.from_pylist([r for r, _, _ in batch], schema=SCHEMA)
        table = table.append_column("_time", pa.array([t for _, t, _ in batch], pa.int64()))
        table = table.append_column("_diff", pa.array([d for _, _, d in batch], pa.int64()))
        shard.append(table, new_upper=time + 1)


READS: list[dict[str, Any]] = [
    {},
    {"as_of": 1},
    {"with_diff": True},
    {"updates_from": 0, "updates_to": 3},
    {"changes": True},
]


def collect(spark: Any, location: str, wheres: list[str], option: bool, **options: Any) -> Counter:
    """Every where's rows (tagged with its index) in one Spark job: by the where option, or
    by Spark filtering the full read."""
    from pyspark.sql import functions as F

    df = None
    for n, where in enumerate(wheres):
        reader = spark.read.format("persistshard")
        for k, v in options.items():
            reader = reader.option(k, v)
        if option:
            part = reader.option("where", where).load(location)
        else:
            part = reader.load(location).where(where)
        part = part.withColumn("query", F.lit(n))
        df = part if df is None else df.unionAll(part)
    assert df is not None
    return Counter(repr(tuple(r)) for r in df.collect())  # NaN != NaN: compare reprs


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_where_option_returns_what_spark_filtering_returns(
    spark: Any, tmp_path: Any, seed: int
) -> None:
    rnd = random.Random(seed)
    location = str(tmp_path / uuid.uuid4().hex)
    write_random_shard(location, rnd)
    options = rnd.choice(READS)
    changes = "updates_from" in options or options.get("changes")
    wheres = []
    for _ in range(3):
        where = clause(rnd, ["i", "s", "d", "m", "b"])
        if options.get("with_diff") or changes:
            where = f"({where}) AND _diff {rnd.choice(['>', '<', '='])} {rnd.randint(-1, 1)}"
        if changes:
            where = f"({where}) OR _time {rnd.choice(['>=', '<', '<>'])} {rnd.randint(0, 2)}"
        wheres.append(where)
    assert collect(spark, location, wheres, True, **options) == collect(
        spark, location, wheres, False, **options
    ), (wheres, options)


def test_a_float_column_in_where_is_refused_through_spark(spark: Any, tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    write_random_shard(location, random.Random(1))
    df = spark.read.format("persistshard").option("where", "f > 0.5 AND i = 1").load(location)
    with pytest.raises(Exception, match=r"option where 'f > 0.5 AND i = 1' cannot be applied"):
        df.collect()


def test_where_in_sql_statements_and_views(spark: Any, tmp_path: Any) -> None:
    location = str(tmp_path / "t")
    n = 50
    ps.open_shard(location).append(
        pa.table({"id": list(range(n)), "_time": [0] * n, "_diff": [1] * n}), new_upper=1
    )
    spark.sql("DROP TABLE IF EXISTS where_t")
    spark.sql(f"CREATE TABLE where_t USING persistshard LOCATION '{location}'")
    try:
        got = spark.sql("SELECT id FROM where_t WITH ('where' = 'id >= 45')").collect()
        assert sorted(r.id for r in got) == [45, 46, 47, 48, 49]
        assert spark.sql("SELECT count(*) FROM where_t").collect()[0][0] == n
        spark.sql(
            "CREATE OR REPLACE TEMPORARY VIEW where_v USING persistshard "
            f"OPTIONS (path '{location}', where 'id < 3 OR id = 40')"
        )
        got = spark.sql("SELECT id FROM where_v").collect()
        assert sorted(r.id for r in got) == [0, 1, 2, 40]
        with pytest.raises(Exception, match=r"option where 'id <<< 3'"):
            spark.sql("SELECT * FROM where_t WITH ('where' = 'id <<< 3')").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS where_t")
        spark.catalog.dropTempView("where_v")


def test_a_stream_refuses_where(spark: Any, tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    ps.open_shard(location).append(pa.table({"k": [1], "_time": [0], "_diff": [1]}), new_upper=1)
    stream = (
        spark.readStream.format("persistshard")
        .option("changes", True)
        .option("where", "k = 1")
        .load(location)
    )
    with pytest.raises(Exception, match=r"InvalidOption: option where 'k = 1' applies to batch"):
        query = stream.writeStream.format("memory").queryName("where_stream").start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
