"""No SQL statement writes to a table it does not name (the provenance rule of
`persistshard.datasource.options`).

Two persistshard tables with the same columns, ``t`` (the target) and ``u`` (the source), are
driven through every statement form that moves rows from one to the other. Each must either
land in ``t`` or be refused; ``u`` never changes. Run in both table orders (``t`` created first,
and ``u`` created first), so no form passes because of which table Spark saw last.

With the companion's session catalog (``ps.configure_spark``; the suite's session by default,
see ``PERSISTSHARD_TEST_COMPANION`` in conftest) every table statement carries the table's
own location, so the refused forms work instead: each runs, and ``u`` still never changes
(tests/test_companion_sql.py checks where their rows land).

These are also the canaries of the Spark behaviour the rule relies on: if an upgrade stops
stripping ``__CHAR_VARCHAR_TYPE_STRING`` when Spark's resolver copies the target's columns,
the forms that land in ``t`` are refused; if a scan stops carrying it, a refused form writes to
``u`` and its check fails.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.datasource.companion import SESSION_CATALOG, SESSION_CATALOG_KEY
from persistshard.datasource.options import CATALOG_KEY, LOCATION_KEY, RAW_TYPE_KEY

pytestmark = pytest.mark.spark

#: Every refusal names the statement form that works.
REFUSED = (
    r"InvalidOption: (refused to write|no shard location reached this write).*"
    r"WITH \('path' = "
)


def rows_of(loc: str) -> Counter:
    snap = ps.open_shard(loc).snapshot()
    return Counter({(r["id"], r["item"]): r["_diff"] for r in snap.to_pylist()})


def companion_catalog(spark) -> bool:
    """Whether the session has the companion's session catalog (module docstring)."""
    return bool(spark.conf.get(SESSION_CATALOG_KEY, "") == SESSION_CATALOG)


def refused_or_run(spark, x: Tables, run: Callable[[], object]) -> None:
    """``run`` is refused and changes nothing (the Python source), or, with the companion's
    catalog, runs and leaves the source table ``u`` as it was."""
    if companion_catalog(spark):
        run()
        assert rows_of(x.u_loc) == x.U0, "the source table changed"
        return
    with pytest.raises(Exception, match=REFUSED):
        run()
    x.unchanged()


@dataclass
class Tables:
    t: str
    t_loc: str
    u: str
    u_loc: str

    T0: ClassVar[Counter] = Counter({(1, "apple"): 1})
    U0: ClassVar[Counter] = Counter({(5, "fig"): 1, (6, "kiwi"): 1})

    def unchanged(self) -> None:
        assert rows_of(self.u_loc) == self.U0, "the source table changed"
        assert rows_of(self.t_loc) == self.T0, "the target changed on a refused statement"


@pytest.fixture(params=["target_first", "source_first"])
def tables(request, spark, tmp_path) -> Iterator[Tables]:
    tag = uuid.uuid4().hex[:8]
    made = Tables(f"t_{tag}", str(tmp_path / "t"), f"u_{tag}", str(tmp_path / "u"))
    order = [(made.t, made.t_loc), (made.u, made.u_loc)]
    if request.param == "source_first":
        order.reverse()
    for name, loc in order:
        spark.sql(
            f"CREATE TABLE {name} USING persistshard LOCATION '{loc}' "
            "OPTIONS (columns 'id BIGINT, item STRING')"
        )
    spark.sql(f"INSERT INTO {made.t} VALUES (1, 'apple')")
    spark.sql(f"INSERT INTO {made.u} VALUES (5, 'fig'), (6, 'kiwi')")
    try:
        yield made
    finally:
        for name in (made.t, made.u):
            spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.sql(f"DROP VIEW IF EXISTS {made.u}_pv")
        for view in ("uv", "uc"):
            spark.catalog.dropTempView(f"{made.u}_{view}")


def refused_statements(x: Tables) -> list[str]:
    t, u = x.t, x.u
    return [
        f"INSERT INTO {t} SELECT * FROM {u}",
        f"INSERT INTO {t} SELECT id, item FROM {u} WHERE id = 5",
        f"INSERT INTO {t} (id, item) SELECT id, item FROM {u}",
        f"INSERT INTO {t} SELECT id, CAST(item AS STRING) AS item FROM {u}",
        f"INSERT INTO {t} SELECT id + 0 AS id, item FROM {u}",
        f"INSERT INTO {t} SELECT id + 1 AS id, item FROM {u}",
        f"INSERT INTO {t} TABLE {u}",
        f"INSERT INTO {t} SELECT * FROM {u}_uv",
        f"INSERT INTO {t} SELECT * FROM {u}_pv",
        f"INSERT INTO {t} SELECT * FROM {u}_uc",
        f"INSERT INTO {t} SELECT a.id, b.item FROM {u} a JOIN {t} b ON a.id > b.id",
        f"INSERT INTO {t} SELECT b.id, a.item FROM {u} a JOIN {t} b ON a.id > b.id",
        f"INSERT INTO {t} SELECT id, max(item) AS item FROM {u} GROUP BY id",
        f"INSERT INTO {t} SELECT DISTINCT * FROM {u}",
        f"INSERT INTO {t} SELECT * FROM {u} UNION ALL SELECT * FROM {t}",
        f"INSERT INTO {t} SELECT * FROM (SELECT * FROM {u} LIMIT 1)",
        f"INSERT OVERWRITE {t} SELECT * FROM {u} WHERE id = 5",
        f"INSERT OVERWRITE {t} TABLE {u}",
        # A self-insert cannot be told from another table's columns: refused too.
        f"INSERT INTO {t} SELECT * FROM {t}",
        f"INSERT OVERWRITE {t} SELECT * FROM {t} WHERE id > 1",
    ]


def test_every_form_from_another_table_is_refused_and_changes_nothing(spark, tables):
    x = tables
    spark.table(x.u).createOrReplaceTempView(f"{x.u}_uv")
    spark.sql(f"CREATE VIEW {x.u}_pv AS SELECT * FROM {x.u}")
    cached = spark.table(x.u).cache()
    cached.count()
    cached.createOrReplaceTempView(f"{x.u}_uc")
    try:
        for statement in refused_statements(x):
            refused_or_run(spark, x, lambda statement=statement: spark.sql(statement))
    finally:
        cached.unpersist()


def test_every_dataframe_form_from_another_table_is_refused(spark, tables):
    from pyspark.sql import functions as F

    x = tables
    source = spark.table(x.u)
    forms: list[Callable[[], object]] = [
        lambda: source.write.insertInto(x.t),
        lambda: source.write.insertInto(x.t, overwrite=True),
        lambda: source.writeTo(x.t).append(),
        lambda: source.filter("id = 5").writeTo(x.t).append(),
        lambda: source.select("id", "item").toDF("id", "item").writeTo(x.t).append(),
        lambda: spark.createDataFrame(source.collect(), source.schema).writeTo(x.t).append(),
        lambda: source.unionByName(spark.table(x.t)).write.insertInto(x.t),
    ]
    for form in forms:
        refused_or_run(spark, x, form)
    if companion_catalog(spark):
        return
    # Spark refuses an overwrite by condition itself; either way nothing moves.
    with pytest.raises(Exception):  # noqa: B017 - Spark's refusal or ours
        source.writeTo(x.t).overwrite(F.lit(True))
    x.unchanged()


def test_forms_whose_columns_spark_converts_land_in_the_target(spark, tables):
    """Spark's resolver puts the target's own columns in front of these (VALUES, BY NAME in
    another order, a real cast), so the target's metadata reaches the writer: they land in
    ``t``, and ``u`` is untouched."""
    x = tables
    expected = Counter(x.T0)
    spark.sql(f"INSERT INTO {x.t} VALUES (2, 'pear')")
    expected[(2, "pear")] += 1
    spark.sql(f"INSERT INTO {x.t} BY NAME SELECT item, id FROM {x.u} WHERE id = 5")
    expected[(5, "fig")] += 1
    spark.sql(f"INSERT INTO {x.t} SELECT CAST(id AS INT) AS id, item FROM {x.u} WHERE id = 6")
    expected[(6, "kiwi")] += 1
    spark.sql(f"INSERT INTO {x.t} (item, id) SELECT item, id FROM {x.u} WHERE id = 5")
    expected[(5, "fig")] += 1
    assert rows_of(x.t_loc) == expected
    assert rows_of(x.u_loc) == x.U0


def test_an_explicit_path_always_wins(spark, tables):
    x = tables
    spark.sql(f"INSERT INTO {x.t} WITH ('path' = '{x.t_loc}') SELECT * FROM {x.u}")
    assert rows_of(x.t_loc) == x.T0 + x.U0
    spark.sql(f"INSERT OVERWRITE {x.t} WITH ('path' = '{x.t_loc}') SELECT * FROM {x.u}")
    assert rows_of(x.t_loc) == x.U0
    spark.table(x.u).writeTo(x.t).option("path", x.t_loc).append()
    assert rows_of(x.t_loc) == x.U0 + x.U0
    spark.sql(
        f"INSERT OVERWRITE {x.t} WITH ('path' = '{x.t_loc}') SELECT * FROM {x.t} WHERE id = 6"
    )
    assert rows_of(x.t_loc) == Counter({(6, "kiwi"): 2})
    assert rows_of(x.u_loc) == x.U0


def test_the_catalog_keeps_the_provenance_marker(spark, tables):
    """Canary: Spark stores the metadata ``schema()`` returns at CREATE, the raw-type key
    included, and reports the declared types unchanged."""
    x = tables
    location = ps.open_shard(x.t_loc).location
    for field in spark.table(x.t).schema.fields:
        assert field.metadata[LOCATION_KEY] == location
        assert field.metadata[CATALOG_KEY] == "2"
        assert field.metadata[RAW_TYPE_KEY] == field.dataType.simpleString()
    described = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE TABLE {x.t}").collect()}
    assert described["id"] == "bigint" and described["item"].startswith("string")


def test_a_table_made_before_the_marker_is_refused_not_misdirected(spark, tmp_path):
    """A table whose catalog columns carry a location but no provenance marker (made by an
    earlier persistshard) is never trusted for a write: it is refused, naming the fix."""
    from pyspark.sql.types import LongType, StructField, StructType

    loc = str(tmp_path / "old")
    ps.open_shard(loc).append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    location = ps.open_shard(loc).location
    name = f"old_{uuid.uuid4().hex[:8]}"
    schema = StructType([StructField("id", LongType(), True, {LOCATION_KEY: location})])
    spark.catalog.createTable(name, source="persistshard", schema=schema, path=loc)
    try:
        if companion_catalog(spark):
            # The companion's catalog drops a scan's location from declared columns and
            # writes to the table's own location.
            assert LOCATION_KEY not in spark.table(name).schema["id"].metadata
            spark.sql(f"INSERT INTO {name} VALUES (2)")
            assert sorted(r.id for r in spark.table(name).collect()) == [1, 2]
            return
        assert spark.table(name).schema["id"].metadata.get(LOCATION_KEY) == location
        with pytest.raises(Exception, match=r"InvalidOption: refused to write .*re-create it"):
            spark.sql(f"INSERT INTO {name} VALUES (2)")
        assert [r.id for r in spark.table(name).collect()] == [1]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_a_created_table_nothing_was_written_to_reads_as_empty(spark, tmp_path):
    name = f"e_{uuid.uuid4().hex[:8]}"
    loc = str(tmp_path / name)
    spark.sql(
        f"CREATE TABLE {name} USING persistshard LOCATION '{loc}' "
        "OPTIONS (columns 'id BIGINT, v STRING')"
    )
    try:
        df = spark.sql(f"SELECT * FROM {name}")
        assert df.columns == ["id", "v"]
        assert df.collect() == []
        assert spark.sql(f"SELECT count(*) AS n FROM {name}").collect()[0].n == 0
        with pytest.raises(Exception, match="as_of"):
            spark.sql(f"SELECT * FROM {name} WITH ('as_of' = '3')").collect()
        spark.sql(f"INSERT INTO {name} VALUES (1, 'a')")
        assert [tuple(r) for r in spark.sql(f"SELECT * FROM {name}").collect()] == [(1, "a")]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
