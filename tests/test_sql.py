"""SQL and everyday use from Spark: every statement form of the README's table, change tables,
columns by name, schema evolution, and errors a user can act on.

Each test of a README table row is named after the row; together they keep the table true.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest

import persistshard as ps

pytestmark = pytest.mark.spark


def counts(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


@pytest.fixture
def table(spark, tmp_path) -> Iterator[tuple[str, str]]:
    """A SQL table ``t_<random>`` (id BIGINT, item STRING) over a fresh shard holding
    (1, 'apple') at time 0, and a temporary view ``<name>_src`` with (2, 'pear')."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    loc = str(tmp_path / name)
    spark.sql(
        f"CREATE TABLE {name} USING persistshard LOCATION '{loc}' "
        "OPTIONS (columns 'id BIGINT, item STRING')"
    )
    spark.sql(f"INSERT INTO {name} VALUES (1, 'apple')")
    spark.createDataFrame([(2, "pear")], "id BIGINT, item STRING").createOrReplaceTempView(
        f"{name}_src"
    )
    try:
        yield name, loc
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.catalog.dropTempView(f"{name}_src")


def rows_of(loc: str) -> Counter:
    snap = ps.open_shard(loc).snapshot()
    return Counter({(r["id"], r["item"]): r["_diff"] for r in snap.to_pylist()})


NO_LOCATION = r"InvalidOption: no shard location reached this write.*WITH \('path'"


# --- one test per row of the README's table of statement forms -------------------------


def test_row_insert_values(spark, table):
    name, loc = table
    spark.sql(f"INSERT INTO {name} VALUES (2, 'pear')")
    assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 1})


def test_row_insert_select_without_path_names_the_form_that_works(
    spark, table, has_companion_catalog
):
    """The Python source alone: no location reaches these writes, refused with the form that
    works. With the companion's catalog the table's location does: they land in the table."""
    name, loc = table
    statements = (
        f"INSERT INTO {name} SELECT * FROM {name}_src",
        f"INSERT INTO {name} TABLE {name}_src",
        f"INSERT OVERWRITE {name} SELECT * FROM {name}_src",
    )
    if has_companion_catalog:
        spark.sql(statements[0])
        spark.sql(statements[1])
        assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 2})
        spark.sql(statements[2])
        assert rows_of(loc) == Counter({(2, "pear"): 1})
        return
    for statement in statements:
        with pytest.raises(Exception, match=NO_LOCATION):
            spark.sql(statement)
    assert rows_of(loc) == Counter({(1, "apple"): 1})


def test_row_insert_select_with_conversion_finds_the_location(spark, table):
    name, loc = table
    spark.sql(f"INSERT INTO {name} SELECT CAST(id AS INT), item FROM {name}_src")
    spark.sql(f"INSERT INTO {name} (item, id) SELECT item, id FROM {name}_src")
    assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 2})


def test_row_insert_select_with_path(spark, table):
    name, loc = table
    spark.sql(f"INSERT INTO {name} WITH ('path' = '{loc}') SELECT * FROM {name}_src")
    spark.sql(f"INSERT INTO {name} WITH ('path' = '{loc}') TABLE {name}_src")
    assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 2})
    spark.sql(f"INSERT OVERWRITE {name} WITH ('path' = '{loc}') SELECT * FROM {name}_src")
    assert rows_of(loc) == Counter({(2, "pear"): 1})


def test_row_insert_overwrite_self_select(spark, table, has_companion_catalog):
    """A self-select passes the table's own scanned columns, which cannot be told from another
    table's (tests/test_sql_provenance.py): refused; with the path it works. With the
    companion's catalog the table's location reaches the write: it overwrites the table."""
    name, loc = table
    spark.sql(f"INSERT INTO {name} VALUES (2, 'pear'), (3, 'plum')")
    self_select = f"INSERT OVERWRITE {name} SELECT * FROM {name} WHERE id > 1"
    if has_companion_catalog:
        spark.sql(self_select)
        assert rows_of(loc) == Counter({(2, "pear"): 1, (3, "plum"): 1})
    else:
        with pytest.raises(Exception, match=r"InvalidOption: refused to write.*WITH \('path'"):
            spark.sql(self_select)
        assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 1, (3, "plum"): 1})
    spark.sql(f"INSERT OVERWRITE {name} WITH ('path' = '{loc}') SELECT * FROM {name} WHERE id = 2")
    assert rows_of(loc) == Counter({(2, "pear"): 1})


def test_row_insert_select_from_another_shard_table_is_refused(
    spark, table, tmp_path, has_companion_catalog
):
    """Spark hands the writer the source table's columns unchanged, with the source's location
    in their metadata: the provenance rule refuses the write, and the source is untouched.
    With the companion's catalog the target's location reaches the write: the rows land in
    the target's shard, and the source is untouched."""
    name, loc = table
    other = f"{name}_other"
    other_loc = str(tmp_path / other)
    spark.sql(
        f"CREATE TABLE {other} USING persistshard LOCATION '{other_loc}' "
        "OPTIONS (columns 'id BIGINT, item STRING')"
    )
    try:
        spark.sql(f"INSERT INTO {other} VALUES (5, 'fig')")
        if has_companion_catalog:
            spark.sql(f"INSERT INTO {name} SELECT * FROM {other}")
            assert rows_of(loc) == Counter({(1, "apple"): 1, (5, "fig"): 1})
        else:
            with pytest.raises(Exception, match=r"InvalidOption: refused to write"):
                spark.sql(f"INSERT INTO {name} SELECT * FROM {other}")
            assert rows_of(loc) == Counter({(1, "apple"): 1})
        assert rows_of(other_loc) == Counter({(5, "fig"): 1})
        # Naming the target is always right.
        spark.sql(f"INSERT OVERWRITE {name} WITH ('path' = '{loc}') SELECT * FROM {other}")
        assert rows_of(loc) == Counter({(5, "fig"): 1})
        assert rows_of(other_loc) == Counter({(5, "fig"): 1})
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {other}")


def test_row_dataframe_insert_into_and_write_to(spark, table, has_companion_catalog):
    """Without the companion no location reaches these writes: refused, naming the forms that
    work. With its catalog each appends to the table's shard."""
    name, loc = table
    df = spark.table(f"{name}_src")
    writes = (
        lambda: df.write.insertInto(name),
        lambda: df.writeTo(name).append(),
        lambda: df.write.format("persistshard").mode("append").saveAsTable(name),
    )
    for n, write in enumerate(writes, 1):
        if has_companion_catalog:
            write()
            assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): n})
        else:
            with pytest.raises(Exception, match=NO_LOCATION):
                write()
            assert rows_of(loc) == Counter({(1, "apple"): 1})
    before = rows_of(loc)
    with pytest.raises(Exception, match="does not support dynamic overwrite"):
        df.writeTo(name).overwritePartitions()
    assert rows_of(loc) == before
    df.writeTo(name).option("path", loc).append()
    df.write.format("persistshard").mode("append").save(loc)
    assert rows_of(loc) == before + Counter({(2, "pear"): 2})


def test_row_describe_extended_and_where_the_location_is(spark, table, has_companion_catalog):
    """Without the companion Spark describes a Python source's table from its own table
    object (no location, MANAGED); with the companion's catalog from the catalog entry."""
    name, loc = table
    described = {
        r.col_name: r.data_type for r in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    }
    if has_companion_catalog:
        assert described["Type"] == "EXTERNAL" and described["Provider"] == "persistshard"
        assert ps.open_shard(described["Location"]).location == ps.open_shard(loc).location
    else:
        assert described["Type"] == "MANAGED" and "Location" not in described
    field = spark.table(name).schema["id"]
    assert field.metadata["persistshard.location"] == ps.open_shard(loc).location


def test_row_ctas_fails_and_leaves_no_table(spark, table, tmp_path, has_companion_catalog):
    """Without the companion CTAS is refused and leaves no table; with its catalog the rows
    land in the new table's shard, and nowhere else."""
    name, loc = table
    ctas = f"{name}_ctas"
    statement = (
        f"CREATE TABLE {ctas} USING persistshard LOCATION '{tmp_path / ctas}' "
        f"AS SELECT * FROM {name}_src"
    )
    if not has_companion_catalog:
        with pytest.raises(Exception, match=NO_LOCATION):
            spark.sql(statement)
        assert not spark.catalog.tableExists(ctas)
        assert not (tmp_path / ctas).exists()
        return
    try:
        spark.sql(statement)
        assert rows_of(str(tmp_path / ctas)) == Counter({(2, "pear"): 1})
        assert counts(spark.table(ctas)) == Counter({(2, "pear"): 1})
        assert rows_of(loc) == Counter({(1, "apple"): 1})
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {ctas}")


@pytest.mark.parametrize(
    "statement, message, with_companion",
    [
        ("DELETE FROM {t} WHERE id = 1", "does not support deletes", Counter()),
        ("UPDATE {t} SET item = 'x'", "does not support UPDATE", Counter({(1, "x"): 1})),
        ("TRUNCATE TABLE {t}", "does not support truncates", None),
        (
            "MERGE INTO {t} USING {t}_src s ON {t}.id = s.id WHEN MATCHED THEN DELETE "
            "WHEN NOT MATCHED THEN INSERT *",
            "MERGE",
            Counter({(1, "apple"): 1, (2, "pear"): 1}),
        ),
        ("SELECT * FROM {t} VERSION AS OF 0", "TIME_TRAVEL", Counter({(1, "apple"): 1})),
        ("ALTER TABLE {t} ALTER COLUMN id TYPE INT", "NOT_SUPPORTED_CHANGE_COLUMN", None),
    ],
)
def test_row_unsupported_statements(
    spark, table, statement, message, with_companion, has_companion_catalog
):
    """Spark refuses these for a Python source. With the companion's catalog DELETE, UPDATE,
    MERGE and VERSION AS OF work (``with_companion``: the shard's rows after it, or the rows
    read); TRUNCATE and a column's new type are refused either way."""
    name, loc = table
    sql = statement.format(t=name)
    if has_companion_catalog and with_companion is not None:
        got = spark.sql(sql).collect()
        if sql.startswith("SELECT"):
            assert Counter(tuple(r) for r in got) == with_companion
            assert rows_of(loc) == Counter({(1, "apple"): 1})
        else:
            assert rows_of(loc) == with_companion
        return
    with pytest.raises(Exception, match=message):
        spark.sql(sql).collect()
    assert rows_of(loc) == Counter({(1, "apple"): 1})


def test_row_delete_written_as_self_overwrite_and_time_travel_with_as_of(spark, table):
    name, _ = table
    spark.sql(f"INSERT INTO {name} VALUES (2, 'pear')")
    _, loc = table
    spark.sql(
        f"INSERT OVERWRITE {name} WITH ('path' = '{loc}') SELECT * FROM {name} WHERE NOT (id = 1)"
    )
    assert counts(spark.sql(f"SELECT * FROM {name}")) == Counter({(2, "pear"): 1})
    assert counts(spark.sql(f"SELECT * FROM {name} WITH ('as_of' = '0')")) == Counter(
        {(1, "apple"): 1}
    )


# --- change reads in SQL -------------------------------------------------------------------


def test_row_alter_table_add_columns(spark, table):
    name, _ = table
    spark.sql(f"ALTER TABLE {name} ADD COLUMNS (price DOUBLE)")
    spark.sql(f"INSERT INTO {name} VALUES (2, 'pear', 1.5)")
    assert counts(spark.sql(f"SELECT * FROM {name}")) == Counter(
        {(1, "apple", None): 1, (2, "pear", 1.5): 1}
    )


def test_row_change_read_of_a_plain_table_is_refused(spark, table):
    name, _ = table
    for options in ("'updates_from' = '0'", "'changes' = 'true'"):
        with pytest.raises(
            Exception, match=r"InvalidOption: option .* reads changes.*changes 'true'"
        ):
            spark.sql(f"SELECT * FROM {name} WITH ({options})").collect()
    with pytest.raises(Exception, match="InvalidOption: option with_diff"):
        spark.sql(f"SELECT * FROM {name} WITH ('with_diff' = 'true')").collect()


def test_row_change_table_keeps_time_and_diff(spark, table):
    name, loc = table
    spark.sql(f"INSERT OVERWRITE {name} SELECT 1 AS id, 'apricot' AS item")
    changes = f"{name}_changes"
    spark.sql(
        f"CREATE TABLE {changes} USING persistshard LOCATION '{loc}' OPTIONS (changes 'true')"
    )
    try:
        got = spark.sql(f"SELECT id, item, _time, _diff FROM {changes} WITH ('updates_from' = '1')")
        assert counts(got) == Counter({(1, "apple", 1, -1): 1, (1, "apricot", 1, 1): 1})
        assert counts(spark.sql(f"SELECT * FROM {changes}")) == Counter({(1, "apricot", 1, 1): 1})
        # A change table takes updates with explicit times and diffs.
        spark.sql(f"INSERT INTO {changes} VALUES (1, 'apricot', 2, -1)")
        assert rows_of(loc) == Counter()
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {changes}")


# --- columns by name, schema evolution --------------------------------------------------------


def test_dataframe_columns_by_name_any_order_and_case(spark, table):
    _, loc = table
    df = spark.createDataFrame([("kiwi", 7)], "ITEM STRING, Id BIGINT")
    df.write.format("persistshard").mode("append").save(loc)
    assert rows_of(loc) == Counter({(1, "apple"): 1, (7, "kiwi"): 1})


def test_column_mismatch_is_one_driver_side_line(spark, table):
    _, loc = table
    df = spark.createDataFrame([(1, 2.0)], "id SMALLINT, price DOUBLE")
    with pytest.raises(Exception) as e:
        df.write.format("persistshard").mode("append").save(loc)
    text = str(e.value)
    assert "missing: item string" in text
    assert "extra: price double" in text
    assert "retyped" not in text  # SMALLINT into BIGINT is cast (core/write/validate.widens)
    assert "Task" not in text  # refused while planning, not in a failed task
    narrow = spark.createDataFrame([(1.5, "x")], "id DOUBLE, item STRING")
    with pytest.raises(Exception) as e:
        narrow.write.format("persistshard").mode("append").save(loc)
    assert "retyped: id is double, the shard has int64" in str(e.value)
    assert "Task" not in str(e.value)


def test_a_narrower_integer_column_is_cast_to_the_shards(spark, table):
    _, loc = table
    df = spark.createDataFrame([(2**31 - 1, "max")], "id INT, item STRING")
    df.write.format("persistshard").mode("append").save(loc)
    assert rows_of(loc) == Counter({(1, "apple"): 1, (2**31 - 1, "max"): 1})
    assert ps.open_shard(loc).schema.field("id").type == pa.int64()


def test_alter_table_add_columns(spark, table):
    name, loc = table
    spark.sql(f"ALTER TABLE {name} ADD COLUMNS (price DOUBLE)")
    assert counts(spark.sql(f"SELECT * FROM {name}")) == Counter({(1, "apple", None): 1})
    spark.sql(f"INSERT INTO {name} VALUES (2, 'pear', 1.5)")
    assert counts(spark.sql(f"SELECT * FROM {name}")) == Counter(
        {(1, "apple", None): 1, (2, "pear", 1.5): 1}
    )
    assert [f.name for f in ps.open_shard(loc).schema] == ["id", "item", "price"]
    # Time travel to before the column existed: nulls; change reads across it are exact.
    assert counts(spark.sql(f"SELECT * FROM {name} WITH ('as_of' = '0')")) == Counter(
        {(1, "apple", None): 1}
    )
    shard = ps.open_shard(loc)
    assert shard.updates(0, 2).to_pylist() == [
        {"id": 1, "item": "apple", "price": None, "_time": 0, "_diff": 1},
        {"id": 2, "item": "pear", "price": 1.5, "_time": 1, "_diff": 1},
    ]
    # An overwrite retracts an old-schema row exactly, and compaction keeps it all.
    spark.sql(f"INSERT OVERWRITE {name} WITH ('path' = '{loc}') SELECT * FROM {name} WHERE id = 2")
    shard.advance_since(shard.upper - 1)
    shard.compact()
    assert counts(spark.sql(f"SELECT * FROM {name}")) == Counter({(2, "pear", 1.5): 1})
    assert shard.verify().ok


def test_row_alter_table_drop_or_rename_is_refused_clearly(spark, table):
    name, _ = table
    spark.sql(f"ALTER TABLE {name} RENAME COLUMN item TO name")
    with pytest.raises(Exception, match=r"InvalidOption: the table's columns .* no longer"):
        spark.sql(f"INSERT INTO {name} VALUES (2, 'pear')")
    with pytest.raises(Exception, match=r"InvalidOption: the table's columns .* no longer"):
        spark.sql(f"SELECT * FROM {name}").collect()


def test_drop_table_keeps_the_shard_and_rename_keeps_the_location(spark, table):
    """A persistshard table with a LOCATION is external: DROP TABLE removes the catalog entry
    and never the shard's data; ALTER TABLE ... RENAME TO keeps the location (and, with the
    companion's catalog, the OPTIONS), so the renamed table reads and writes the same shard."""
    name, loc = table
    renamed = f"{name}_renamed"
    before = ps.open_shard(loc).inspect.state()
    spark.sql(f"ALTER TABLE {name} RENAME TO {renamed}")
    try:
        assert not spark.catalog.tableExists(name)
        assert counts(spark.table(renamed)) == Counter({(1, "apple"): 1})
        spark.sql(f"INSERT INTO {renamed} VALUES (2, 'pear')")
        assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 1})
        assert counts(spark.table(renamed)) == Counter({(1, "apple"): 1, (2, "pear"): 1})
        after_insert = ps.open_shard(loc).inspect.state()
        spark.sql(f"DROP TABLE {renamed}")
        assert not spark.catalog.tableExists(renamed)
        assert ps.open_shard(loc).inspect.state() == after_insert
        assert after_insert.version > before.version
        assert rows_of(loc) == Counter({(1, "apple"): 1, (2, "pear"): 1})
        # The shard is a table again, with its rows, by creating one over it.
        spark.sql(f"CREATE TABLE {name} USING persistshard LOCATION '{loc}'")
        assert counts(spark.table(name)) == Counter({(1, "apple"): 1, (2, "pear"): 1})
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {renamed}")


def test_alter_table_add_columns_on_a_table_declared_with_columns(
    spark, tmp_path, has_companion_catalog
):
    """With the companion's catalog a table created with a column list (no location in its
    columns' metadata) follows ALTER TABLE ... ADD COLUMNS too, its reads pruned or not:
    rows written before read the new column as null, the next write adds it to the shard,
    and a renamed column is refused on both reads and writes."""
    if not has_companion_catalog:
        pytest.skip("without the companion a table declared with columns has no location")
    name = f"t_{uuid.uuid4().hex[:8]}"
    loc = str(tmp_path / name)
    spark.sql(f"CREATE TABLE {name} (id BIGINT, item STRING) USING persistshard LOCATION '{loc}'")
    try:
        assert counts(spark.table(name)) == Counter()
        spark.sql(f"INSERT INTO {name} VALUES (1, 'apple')")
        spark.sql(f"ALTER TABLE {name} ADD COLUMNS (price DOUBLE)")
        assert counts(spark.table(name)) == Counter({(1, "apple", None): 1})
        assert counts(spark.sql(f"SELECT price FROM {name}")) == Counter({(None,): 1})
        spark.sql(f"INSERT INTO {name} VALUES (2, 'pear', 1.5)")
        assert [f.name for f in ps.open_shard(loc).schema] == ["id", "item", "price"]
        assert counts(spark.sql(f"SELECT id, price FROM {name}")) == Counter(
            {(1, None): 1, (2, 1.5): 1}
        )
        before = shard_state(loc)
        spark.sql(f"ALTER TABLE {name} RENAME COLUMN item TO name")
        refused = r"InvalidOption: the table's columns .* no longer include the shard's column"
        with pytest.raises(Exception, match=refused):
            spark.sql(f"INSERT INTO {name} VALUES (3, 'fig', 1.0)")
        with pytest.raises(Exception, match=refused):
            spark.sql(f"SELECT id FROM {name}").collect()
        assert shard_state(loc) == before
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


# --- replacing a table's contents with the companion's catalog ------------------------------


FAILING_SELECT = (
    "SELECT id, CASE WHEN id = 3 THEN CAST(raise_error('boom') AS STRING) ELSE item END AS item "
    "FROM {src}"
)


@pytest.fixture
def two_tables(spark, table, tmp_path, has_companion_catalog) -> Iterator[tuple[str, str, str]]:
    """`table` (t: (1, 'apple')), a second table over its own shard holding (9, 'other'), and
    a view ``<t>_rows`` with (2, 'pear'), (3, 'plum'); with the companion's catalog only."""
    if not has_companion_catalog:
        pytest.skip("these statements replace a table's rows only with the companion's catalog")
    name, loc = table
    other_loc = str(tmp_path / "other")
    other = f"{name}_other"
    spark.sql(
        f"CREATE TABLE {other} USING persistshard LOCATION '{other_loc}' "
        "OPTIONS (columns 'id BIGINT, item STRING')"
    )
    spark.sql(f"INSERT INTO {other} VALUES (9, 'other')")
    rows = spark.createDataFrame([(2, "pear"), (3, "plum")], "id BIGINT, item STRING")
    rows.createOrReplaceTempView(f"{name}_rows")
    try:
        yield name, loc, other_loc
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {other}")
        spark.catalog.dropTempView(f"{name}_rows")


def shard_state(loc: str) -> tuple[int, int, Counter]:
    """The shard's (version, upper, rows): a failed statement leaves all three as they were."""
    shard = ps.open_shard(loc)
    return shard.inspect.state().version, shard.upper, rows_of(loc)


def test_overwrite_save_as_table_with_a_path_replaces_the_tables_rows(spark, two_tables):
    name, loc, other_loc = two_tables
    other_before = shard_state(other_loc)
    df = spark.table(f"{name}_rows")
    df.write.format("persistshard").mode("overwrite").option("path", loc).saveAsTable(name)
    assert rows_of(loc) == Counter({(2, "pear"): 1, (3, "plum"): 1})
    assert counts(spark.table(name)) == Counter({(2, "pear"): 1, (3, "plum"): 1})
    assert shard_state(other_loc) == other_before
    before = shard_state(loc)
    failing = spark.sql(FAILING_SELECT.format(src=f"{name}_rows"))
    with pytest.raises(Exception, match="boom"):
        failing.write.format("persistshard").mode("overwrite").option("path", loc).saveAsTable(name)
    assert shard_state(loc) == before
    assert shard_state(other_loc) == other_before


def test_create_or_replace_table_as_select_replaces_the_tables_rows(
    spark, two_tables, has_companion_catalog
):
    name, loc, other_loc = two_tables
    other_before = shard_state(other_loc)
    replace = f"CREATE OR REPLACE TABLE {name} USING persistshard LOCATION '{loc}' AS "
    spark.sql(replace + f"SELECT * FROM {name}_rows WHERE id = 3")
    assert rows_of(loc) == Counter({(3, "plum"): 1})
    assert counts(spark.table(name)) == Counter({(3, "plum"): 1})
    assert shard_state(other_loc) == other_before
    before = shard_state(loc)
    with pytest.raises(Exception, match="boom"):
        spark.sql(replace + FAILING_SELECT.format(src=f"{name}_rows"))
    # The shard is as it was. The companion's catalog stages the replace, so the table is
    # too; Spark's own session catalog does not: the failed statement dropped the table's
    # entry there (never its data, the table is external).
    assert shard_state(loc) == before
    assert shard_state(other_loc) == other_before
    if has_companion_catalog:
        assert counts(spark.table(name)) == Counter({(3, "plum"): 1})


def test_insert_overwrite_select_replaces_the_tables_rows(spark, two_tables):
    name, loc, other_loc = two_tables
    other_before = shard_state(other_loc)
    spark.sql(f"INSERT OVERWRITE {name} SELECT * FROM {name}_rows")
    assert rows_of(loc) == Counter({(2, "pear"): 1, (3, "plum"): 1})
    # Only the difference was written: apple retracted, pear and plum inserted.
    diffs = ps.open_shard(loc).updates(1, 2).to_pylist()
    assert Counter(r["_diff"] for r in diffs) == Counter({-1: 1, 1: 2})
    assert shard_state(other_loc) == other_before
    before = shard_state(loc)
    with pytest.raises(Exception, match="boom"):
        spark.sql(f"INSERT OVERWRITE {name} " + FAILING_SELECT.format(src=f"{name}_rows"))
    assert shard_state(loc) == before
    assert shard_state(other_loc) == other_before
    assert counts(spark.table(name)) == Counter({(2, "pear"): 1, (3, "plum"): 1})


def test_merge_schema_option(spark, table):
    _, loc = table
    df = spark.createDataFrame([(3, "plum", 2.5)], "id BIGINT, item STRING, price DOUBLE")
    with pytest.raises(Exception, match=r"extra: price double.*merge_schema"):
        df.write.format("persistshard").mode("append").save(loc)
    df.write.format("persistshard").mode("append").option("merge_schema", "true").save(loc)
    got = spark.read.format("persistshard").load(loc)
    assert counts(got) == Counter({(1, "apple", None): 1, (3, "plum", 2.5): 1})


def test_overwrite_right_after_alter_table_add_columns(spark, table):
    name, loc = table
    spark.sql(f"ALTER TABLE {name} ADD COLUMNS (price DOUBLE)")
    spark.sql(f"INSERT OVERWRITE {name} VALUES (1, 'apple', 0.5), (2, 'pear', NULL)")
    assert counts(spark.sql(f"SELECT * FROM {name}")) == Counter(
        {(1, "apple", 0.5): 1, (2, "pear", None): 1}
    )
    # Only the difference: apple's old row (price null) retracted, two rows inserted.
    shard = ps.open_shard(loc)
    assert Counter(r["_diff"] for r in shard.updates(1, 2).to_pylist()) == Counter({-1: 1, 1: 2})


def test_case_sensitive_session_wants_exact_names(spark, table):
    _, loc = table
    df = spark.createDataFrame([(7, "kiwi")], "id BIGINT, ITEM STRING")
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        with pytest.raises(
            Exception, match=r"caseSensitive is true and columns ITEM \(shard: item\)"
        ):
            df.write.format("persistshard").mode("append").save(loc)
    finally:
        spark.conf.unset("spark.sql.caseSensitive")
    assert rows_of(loc) == Counter({(1, "apple"): 1})


def test_errors_a_user_can_act_on(spark, table, tmp_path):
    _, loc = table
    a_file = tmp_path / "a_file"
    a_file.write_text("not a shard")
    df = spark.createDataFrame([(1, "x")], "id BIGINT, item STRING")
    with pytest.raises(Exception) as e:
        df.write.format("persistshard").mode("append").save(str(a_file))
    assert "StorageError: cannot write the shard at" in str(e.value)
    assert "NotADirectoryError" in str(e.value)
    with pytest.raises(Exception) as e:
        spark.read.format("persistshard").load(str(tmp_path / "nothing")).collect()
    assert "NoShard: no shard at" in str(e.value)
    assert "OPTIONS" not in str(e.value)
    with pytest.raises(Exception) as e:
        spark.read.format("persistshard").option("updates_from", 100).load(loc).collect()
    assert "InvalidOption: updates_from 100 is after the shard's upper 1" in str(e.value)
    assert "updates_to" not in str(e.value)
    bad_time = spark.createDataFrame([(2, "y", "later")], "id BIGINT, item STRING, _time STRING")
    with pytest.raises(Exception) as e:
        bad_time.write.format("persistshard").mode("append").save(loc)
    assert "InvalidUpdates: column _time must hold integers" in str(e.value)
    assert "Task" not in str(e.value)


def readme_sql_statements(readme: str, data: str) -> list[str]:
    """The statements of the README's SQL section, in order, with ``/data`` at ``data``."""
    marker = "<!-- sql-section:"
    block = readme[readme.index(marker) :]
    block = block[
        block.index("```sql") + len("```sql") : block.index("```", block.index("```sql") + 6)
    ]
    lines = [line.split("--")[0].rstrip() for line in block.splitlines()]
    text = "\n".join(line for line in lines if line.strip())
    return [s.strip().replace("'/data/", f"'{data}/") for s in text.split(";") if s.strip()]


def test_readme_sql_section(spark, repo_root, tmp_path):
    """The README's SQL section, executed statement by statement, in order."""
    with open(f"{repo_root}/README.md", encoding="utf-8") as f:
        statements = readme_sql_statements(f.read(), str(tmp_path))
    assert len(statements) >= 10
    results = []
    try:
        for statement in statements:
            results.append(spark.sql(statement).collect())
    finally:
        for t in ("orders", "orders_changes", "orders_again"):
            spark.sql(f"DROP TABLE IF EXISTS {t}")
        spark.catalog.dropTempView("staging")
    selects = [r for s, r in zip(statements, results, strict=True) if s.startswith("SELECT")]
    assert Counter(tuple(r) for r in selects[0]) == Counter({(3, "plum"): 1})
    assert Counter(tuple(r) for r in selects[-1]) == Counter(
        {(3, "plum", None): 1, (4, "fig", 2.5): 1}
    )
    changes = Counter(tuple(r) for r in selects[2])
    assert (2, "pear", 2, -1) in changes and (1, "apple", 2, -1) in changes
