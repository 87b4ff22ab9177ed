"""Filter pushdown through Spark: with ``spark.sql.python.filterPushdown.enabled`` on, every
query returns exactly what the same query returns with it off (Spark filtering every row),
over random tables with nulls, also when one relation is scanned twice with different filters
(Spark 4.3 may then run one scan with the other's reader); a pushed filter reaches the reader;
and with the switch off, reads still work (Spark refuses readers with ``pushFilters`` then).
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persistshard as ps

SWITCH = "spark.sql.python.filterPushdown.enabled"

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
STRINGS = ["", "a", "ab", "abc", "b", "ba", "é", "zz"]
DAY0 = dt.date(2020, 1, 1)


def literal(column: str, rnd: Any) -> str:
    if column == "i":
        return str(rnd.randint(-4, 4))
    if column == "s":
        return "'" + rnd.choice(STRINGS) + "'"
    if column == "d":
        return f"DATE'{DAY0 + dt.timedelta(days=rnd.randint(0, 6))}'"
    if column == "m":
        return f"{decimal.Decimal(rnd.randint(-300, 300)).scaleb(-2)}BD"
    if column == "b":
        return rnd.choice(["true", "false"])
    return rnd.choice(["0.5", "-0.0", "'NaN'"])


def leaf(rnd: Any) -> str:
    column = rnd.choice(SCHEMA.names)
    kind = rnd.choice(
        ["cmp", "cmp", "in", "null", "like"] if column == "s" else ["cmp", "cmp", "in", "null"]
    )
    if kind == "null":
        return f"{column} IS {rnd.choice(['', 'NOT '])}NULL"
    if kind == "in":
        items = [literal(column, rnd) for _ in range(rnd.randint(1, 3))]
        if rnd.random() < 0.3:
            items.append("NULL")
        return f"{column} IN ({', '.join(items)})"
    if kind == "like":
        pattern = rnd.choice(["a%", "%b", "%b%", "ab%", "%"])
        return f"s LIKE '{pattern}'"
    op = rnd.choice(["=", "<=>", "<", "<=", ">", ">=", "<>"])
    if column == "f" and op in ("<", ">"):
        return f"f {op} CAST({literal(column, rnd)} AS DOUBLE)"
    return f"{column} {op} {literal(column, rnd)}"


def clause(rnd: Any, depth: int = 0) -> str:
    if depth >= 2 or rnd.random() < 0.5:
        return leaf(rnd)
    shape = rnd.choice(["and", "or", "not"])
    if shape == "not":
        return f"NOT ({clause(rnd, depth + 1)})"
    return f"({clause(rnd, depth + 1)}) {shape.upper()} ({clause(rnd, depth + 1)})"


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
        return decimal.Decimal(rnd.randint(-300, 300)).scaleb(-2)
    if column == "b":
        return rnd.random() < 0.5
    return rnd.choice([0.5, -0.0, 0.0, float("nan"), 2.0])


def write_random_shard(location: str, rnd: Any) -> None:
    """Three appends: inserts, retractions of some of them, more inserts (so snapshots must
    consolidate, and change reads have times and negative diffs)."""
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


def run(spark: Any, location: str, wheres: list[str], pushdown: bool, **options: Any) -> Counter:
    """The rows of every ``where`` (tagged with its index), as one Spark job of unions."""
    from pyspark.sql import functions as F

    spark.conf.set(SWITCH, "true" if pushdown else "false")
    try:
        reader = spark.read.format("persistshard")
        for k, v in options.items():
            reader = reader.option(k, v)
        df = None
        for n, where in enumerate(wheres):
            part = reader.load(location).where(where).withColumn("query", F.lit(n))
            df = part if df is None else df.unionAll(part)
        assert df is not None
        rows = df.collect()
    finally:
        spark.conf.unset(SWITCH)
    # NaN != NaN in Python: compare through repr
    return Counter(repr(tuple(r)) for r in rows)


READS: list[dict[str, Any]] = [
    {},
    {"as_of": 1},
    {"with_diff": True},
    {"updates_from": 0, "updates_to": 3},
    {"changes": True},
]


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_pushdown_returns_what_spark_filtering_returns(
    spark: Any, tmp_path: Any, seed: int
) -> None:
    import random

    rnd = random.Random(seed)
    location = str(tmp_path / uuid.uuid4().hex)
    write_random_shard(location, rnd)
    options = rnd.choice(READS)
    wheres = []
    for _ in range(3):
        where = clause(rnd)
        if options.get("with_diff") or options.get("changes") or "updates_from" in options:
            where = f"({where}) AND _diff {rnd.choice(['>', '<', '='])} {rnd.randint(-1, 1)}"
        if "updates_from" in options or options.get("changes"):
            where = f"({where}) AND _time {rnd.choice(['>=', '<', '<>'])} {rnd.randint(0, 2)}"
        wheres.append(where)
    off = run(spark, location, wheres, False, **options)
    on = run(spark, location, wheres, True, **options)
    assert on == off, (wheres, options)


def test_one_relation_scanned_with_different_filters(spark: Any, tmp_path: Any) -> None:
    """Spark 4.3 keeps a pushdown's reader on the relation: a table and an uncorrelated scalar
    subquery over it (TPC-H q22's shape) may both run the last pushdown's reader. Answers
    must still equal those without pushdown."""
    location = str(tmp_path / "s")
    ps.open_shard(location).append(
        pa.table({"k": list(range(10)), "_time": [0] * 10, "_diff": [1] * 10}), new_upper=1
    )
    spark.read.format("persistshard").load(location).createOrReplaceTempView("pushdown_v")
    query = (
        "SELECT count(*) FROM pushdown_v WHERE k IS NOT NULL "
        "AND k > (SELECT avg(k) FROM pushdown_v WHERE k > 2)"
    )
    spark.conf.set(SWITCH, "true")
    try:
        assert spark.sql(query).collect()[0][0] == 3  # avg(3..9) = 6: k in 7, 8, 9
    finally:
        spark.conf.unset(SWITCH)
        spark.catalog.dropTempView("pushdown_v")


def test_reads_work_with_the_switch_off(spark: Any, tmp_path: Any) -> None:
    """Spark refuses a reader that overrides pushFilters when the switch is off; the source
    hands out one without it then, so filtered reads still answer (Spark filters)."""
    location = str(tmp_path / "s")
    ps.open_shard(location).append(
        pa.table({"k": [1, 2, 3], "_time": [0, 0, 0], "_diff": [1, 1, 1]}), new_upper=1
    )
    spark.conf.set(SWITCH, "false")
    try:
        got = spark.read.format("persistshard").load(location).where("k >= 2").collect()
    finally:
        spark.conf.unset(SWITCH)
    assert sorted(r.k for r in got) == [2, 3]


@pytest.mark.parametrize("pushdown", [False, True])
def test_negative_counts_outside_the_filter(spark: Any, tmp_path: Any, pushdown: bool) -> None:
    """A negative net count is an error when its row is read; a pushed filter that excludes
    the row means the read never meets it (Spark without pushdown reads it and fails)."""
    location = str(tmp_path / "s")
    ps.open_shard(location).append(
        pa.table({"k": [1, 2], "_time": [0, 0], "_diff": [1, -1]}), new_upper=1
    )
    spark.conf.set(SWITCH, "true" if pushdown else "false")
    try:
        df = spark.read.format("persistshard").load(location).where("k = 1")
        if pushdown:
            assert [r.k for r in df.collect()] == [1]
        else:
            with pytest.raises(Exception, match="NegativeDiff"):
                df.collect()
    finally:
        spark.conf.unset(SWITCH)


def test_later_queries_over_one_view_see_every_row(spark: Any, tmp_path: Any) -> None:
    """Spark 4.3 runs a scan that pushes nothing with the read planned by the relation's last
    push, even one from an earlier query; such a scan must still see every row (it used to
    see only the earlier query's rows). Re-running a filtered DataFrame is exact too."""
    location = str(tmp_path / "s")
    n = 1000
    ps.open_shard(location).append(
        pa.table(
            {
                "id": list(range(n)),
                "v": [i % 7 for i in range(n)],
                "_time": [0] * n,
                "_diff": [1] * n,
            }
        ),
        new_upper=1,
    )
    spark.read.format("persistshard").load(location).createOrReplaceTempView("pushdown_r")
    spark.conf.set(SWITCH, "true")
    try:
        filtered = spark.sql("SELECT count(*) FROM pushdown_r WHERE id < 10")
        assert filtered.collect()[0][0] == 10
        assert spark.sql("SELECT count(*) FROM pushdown_r").collect()[0][0] == n
        assert spark.sql("SELECT count(*) FROM pushdown_r WHERE v = 3").collect()[0][0] == 143
        assert spark.sql("SELECT sum(id) FROM pushdown_r").collect()[0][0] == n * (n - 1) // 2
        assert filtered.collect()[0][0] == 10  # the same plan, a new execution
    finally:
        spark.conf.unset(SWITCH)
        spark.catalog.dropTempView("pushdown_r")


@pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/design.md, filter pushdown): Spark 4.3 keeps the last pushed read "
    "on the relation, and a push whose query never ran (explain) is claimed by the next query "
    "that pushes nothing",
)
def test_a_query_after_an_explained_push_sees_every_row(spark: Any, tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    n = 100
    ps.open_shard(location).append(
        pa.table({"id": list(range(n)), "_time": [0] * n, "_diff": [1] * n}), new_upper=1
    )
    df = spark.read.format("persistshard").load(location)
    spark.conf.set(SWITCH, "true")
    try:
        df.filter("id < 10")._jdf.queryExecution().executedPlan()  # planned, never run
        assert df.count() == n
    finally:
        spark.conf.unset(SWITCH)
