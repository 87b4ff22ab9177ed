"""Filter pushdown through Spark 4.3: with ``spark.sql.python.filterPushdown.enabled`` on,
every query returns exactly what it returns with the switch off, because no row is dropped for
pushed state (Spark evaluates every filter): over random tables with nulls, one relation
scanned twice with different filters, and every order of explain/collect/count/cache/union
over one DataFrame and one view. The pruning pushdown reader stays gated off; a canary pins
the Spark behaviour that keeps it off. No module of the package reads a pickled file.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from conformance_helpers import examples
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
    max_examples=examples(6),
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
def test_a_spark_filter_never_hides_a_negative_count(
    spark: Any, tmp_path: Any, pushdown: bool
) -> None:
    """Spark filters every row itself (nothing is pruned by what was pushed), so a negative
    net count outside a Spark filter still fails the read, switch on or off; the where option
    is the way to leave that row unread."""
    location = str(tmp_path / "s")
    ps.open_shard(location).append(
        pa.table({"k": [1, 2], "_time": [0, 0], "_diff": [1, -1]}), new_upper=1
    )
    spark.conf.set(SWITCH, "true" if pushdown else "false")
    try:
        df = spark.read.format("persistshard").load(location)
        with pytest.raises(Exception, match="NegativeDiff"):
            df.where("k = 1").collect()
        where = spark.read.format("persistshard").option("where", "k = 1").load(location)
        assert [r.k for r in where.collect()] == [1]
    finally:
        spark.conf.unset(SWITCH)


def _shard_of(tmp_path: Any, n: int) -> str:
    location = str(tmp_path / uuid.uuid4().hex)
    ps.open_shard(location).append(
        pa.table({"id": list(range(n)), "_time": [0] * n, "_diff": [1] * n}), new_upper=1
    )
    return location


def test_later_queries_over_one_view_see_every_row(spark: Any, tmp_path: Any) -> None:
    """Spark 4.3 runs a scan that pushes nothing with the read planned by the relation's last
    push, even one from an earlier query; such a scan must still see every row. Re-running a
    filtered DataFrame is exact too."""
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


def test_a_query_after_an_explained_push_sees_every_row(spark: Any, tmp_path: Any) -> None:
    """The case the push ledger could not close (a push planned by explain(), never run,
    then a scan that pushes nothing): with no pruning from pushed state it is exact."""
    n = 100
    df = spark.read.format("persistshard").load(_shard_of(tmp_path, n))
    spark.conf.set(SWITCH, "true")
    try:
        df.filter("id < 10")._jdf.queryExecution().executedPlan()  # planned, never run
        assert df.count() == n
        df.filter("id = 3").explain()
        assert sorted(r.id for r in df.collect()) == list(range(n))
    finally:
        spark.conf.unset(SWITCH)


#: Steps over one relation (a DataFrame or a view), each with the rows it must return
#: (None: returns nothing to check). ``q(condition)`` builds the query over the relation.
N = 40


def _steps(q: Any) -> dict[str, Any]:
    def explain() -> None:
        q("id < 10")._jdf.queryExecution().executedPlan()  # pushes, never runs

    def cache() -> list[int]:
        cached = q("id >= 30").cache()
        try:
            return sorted(r.id for r in cached.collect())
        finally:
            cached.unpersist()

    return {
        "explain": (explain, None),
        "filtered": (lambda: sorted(r.id for r in q("id < 5").collect()), list(range(5))),
        "count": (lambda: q(None).count(), N),
        "collect": (lambda: sorted(r.id for r in q(None).collect()), list(range(N))),
        "cache": (cache, list(range(30, N))),
        "union": (
            lambda: sorted(r.id for r in q("id = 1").union(q("id = 2")).collect()),
            [1, 2],
        ),
    }


def _every_ordered_pair(names: list[str]) -> list[str]:
    """A walk through ``names`` in which every ordered pair of distinct names appears once
    as two consecutive steps (an Eulerian circuit of the complete directed graph)."""
    out_edges = {a: [b for b in names if b != a] for a in names}
    stack, walk = [names[0]], []
    while stack:
        here = stack[-1]
        if out_edges[here]:
            stack.append(out_edges[here].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def test_the_walk_covers_every_ordered_pair() -> None:
    names = ["a", "b", "c", "d"]
    walk = _every_ordered_pair(names)
    pairs = list(itertools.pairwise(walk))
    assert sorted(pairs) == sorted((a, b) for a in names for b in names if a != b)


@pytest.mark.parametrize("surface", ["dataframe", "view"])
def test_every_order_of_explain_collect_count_cache_union_is_exact(
    spark: Any, tmp_path: Any, surface: str
) -> None:
    """Issue 28: with the switch on, every ordered pair of steps over one relation (one
    DataFrame, or one temporary view) returns exactly its unfiltered truth: no step sees
    rows dropped for another step's filters. One walk over the relation takes every ordered
    pair of steps as two consecutive steps (the state that went wrong is the relation's last
    pushed read, which the step before sets)."""
    names = list(_steps(lambda c: None))
    spark.conf.set(SWITCH, "true")
    try:
        df = spark.read.format("persistshard").load(_shard_of(tmp_path, N))
        if surface == "dataframe":

            def q(cond: str | None) -> Any:
                return df if cond is None else df.filter(cond)

        else:
            df.createOrReplaceTempView("pushdown_perm")

            def q(cond: str | None) -> Any:
                where = f" WHERE {cond}" if cond else ""
                return spark.sql(f"SELECT * FROM pushdown_perm{where}")

        steps = _steps(q)
        walk = _every_ordered_pair(names)
        for before, name in zip([None, *walk], walk, strict=False):
            run, truth = steps[name]
            assert run() == truth, (surface, before, name)
    finally:
        spark.conf.unset(SWITCH)
        spark.catalog.dropTempView("pushdown_perm")


# --- the gated stateless pushdown, and the canary that keeps it gated ----------------------


def test_the_scoped_pushdown_reader_is_off_on_this_spark() -> None:
    from persistshard.datasource import reader

    assert reader.SCAN_SCOPED_READ_INFO_SINCE is None
    assert not reader.spark_scopes_read_info()


def test_the_gate_opens_from_its_release_on() -> None:
    from persistshard.datasource import reader

    release = (4, 5, 0)
    assert reader.spark_scopes_read_info((4, 5, 0), since=release)
    assert reader.spark_scopes_read_info((5, 0, 1), since=release)
    assert not reader.spark_scopes_read_info((4, 4, 9), since=release)
    assert not reader.spark_scopes_read_info((9, 9, 9), since=None)


def test_scoped_reader_carries_accepted_filters_in_its_partitions(tmp_path: Any) -> None:
    """Without Spark: what pushFilters accepts is kept on the reader, planned into every
    partition, and read() applies only what its partition carries (a partition of another
    reader's plan applies that reader's filters, not this one's)."""
    from pyspark.sql.datasource import EqualTo, GreaterThan, StringContains
    from pyspark.sql.types import LongType, StructField, StructType

    from persistshard.datasource.reader import PersistShardReader, ScopedPushdownReader

    location = _shard_of(tmp_path, 20)
    schema = StructType([StructField("id", LongType(), True)])
    pushed = ScopedPushdownReader({"path": location}, schema)
    refused = StringContains(("id",), "1")  # not a string column: Spark keeps it
    left = list(pushed.pushFilters([GreaterThan(("id",), 15), refused]))
    assert left == [refused]
    parts = pushed.partitions()

    def ids(reader: Any, partitions: Any) -> list[int]:
        return sorted(
            i for p in partitions for b in reader.read(p) for i in b.column("id").to_pylist()
        )

    assert ids(pushed, parts) == [16, 17, 18, 19]
    plain = PersistShardReader({"path": location}, schema)
    assert ids(plain, plain.partitions()) == list(range(20))
    assert ids(plain, parts) == [16, 17, 18, 19]  # the partition decides, not the reader
    other = ScopedPushdownReader({"path": location}, schema)
    list(other.pushFilters([EqualTo(("id",), 3)]))
    assert ids(other, other.partitions()) == [3]
    assert ids(pushed, pushed.partitions()) == [16, 17, 18, 19]


def test_canary_spark_reuses_the_last_pushed_read_across_scans(spark: Any, tmp_path: Any) -> None:
    """Pins the Spark behaviour that keeps `ScopedPushdownReader` gated off: a data source
    that prunes by pushed filters returns too few rows for a later scan of the same relation
    that pushes nothing (SPARK-HAZARDS.md 2). When this fails, the installed Spark keeps read
    info per scan: set ``reader.SCAN_SCOPED_READ_INFO_SINCE`` to its version (which turns the
    pruning pushdown on) and turn these assertions around."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(CanaryScopedSource)
    n = 50
    location = _shard_of(tmp_path, n)
    spark.conf.set(SWITCH, "true")
    try:
        fresh = spark.read.format(CanaryScopedSource.name()).load(location)
        assert fresh.filter("id < 10").count() == 10  # one scan: pruned and exact
        df = spark.read.format(CanaryScopedSource.name()).load(location)
        df.filter("id = 3")._jdf.queryExecution().executedPlan()
        stale = df.count()
        union = df.filter("id = 1").union(df.filter("id = 2")).collect()
    finally:
        spark.conf.unset(SWITCH)
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert stale != n and sorted(r.id for r in union) != [1, 2], (
        "Spark now keeps pushed read info per scan (a later scan saw every row): set "
        "persistshard.datasource.reader.SCAN_SCOPED_READ_INFO_SINCE to this Spark's version"
    )


def _canary_source() -> Any:
    from persistshard.datasource import reader
    from persistshard.datasource.source import PersistShardDataSource

    class CanaryScopedSource(PersistShardDataSource):
        """The source with the gate forced open (test only)."""

        @classmethod
        def name(cls) -> str:
            return "persistshard_scoped_canary"

        def reader(self, schema: Any) -> Any:
            if reader.planning_with_pushdown():
                return reader.ScopedPushdownReader(dict(self.options), schema)
            return reader.PersistShardReader(dict(self.options), schema)

    return CanaryScopedSource


CanaryScopedSource = _canary_source()


def test_no_module_of_the_package_unpickles_a_file(repo_root: str) -> None:
    """Issue 28: pushed filters once travelled through pickled files in a shared temporary
    directory; no module may read a pickle from a file again (``pickle.load``,
    ``pickle.Unpickler``, or either imported by name)."""
    import ast
    import os

    offenders = []
    for folder, dirs, files in os.walk(repo_root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("tests", "__pycache__")]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                bad = (
                    isinstance(node, ast.Attribute)
                    and node.attr in ("load", "Unpickler")
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("pickle", "cPickle", "cloudpickle")
                ) or (
                    isinstance(node, ast.ImportFrom)
                    and node.module in ("pickle", "cPickle", "cloudpickle")
                    and any(a.name in ("load", "Unpickler") for a in node.names)
                )
                if bad:
                    offenders.append(f"{os.path.relpath(path, repo_root)}:{node.lineno}")
    assert offenders == []
