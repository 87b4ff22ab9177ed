"""Spark reads and writes a shard whose log is in a database (SQLite, local[2]): the
``consensus`` option of the DataFrame API, SQL ``WITH`` per statement, and a SQL table that
remembers its consensus (never one with a password)."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

import persistshard as ps
from persistshard.core.storage.consensus import LOG_HOME_KEY
from persistshard.datasource.options import CONSENSUS_KEY

pytestmark = pytest.mark.spark


def rows_of(loc: str, consensus: str | None) -> Counter:
    snap = ps.open_shard(loc, consensus=consensus).snapshot()
    return Counter({(r["id"], r["item"]): r["_diff"] for r in snap.to_pylist()})


def test_dataframe_write_and_read_with_sqlite_consensus(spark, tmp_path):
    loc, url = str(tmp_path / "orders"), f"sqlite:///{tmp_path}/log.db"
    df = spark.createDataFrame([(1, "apple"), (2, "pear")], "id BIGINT, item STRING")
    df.write.format("persistshard").mode("append").option("consensus", url).save(loc)
    more = spark.createDataFrame([(3, "fig")], "id BIGINT, item STRING").repartition(2)
    more.write.format("persistshard").mode("append").option("consensus", url).save(loc)
    read = spark.read.format("persistshard").option("consensus", url).load(loc)
    assert sorted(tuple(r) for r in read.collect()) == [(1, "apple"), (2, "pear"), (3, "fig")]
    assert rows_of(loc, url) == Counter({(1, "apple"): 1, (2, "pear"): 1, (3, "fig"): 1})
    shard = ps.open_shard(loc, consensus=url)
    # The log is in the database only; beside the data, just the marker saying so.
    assert [m.key for m in shard._blob.list("consensus/")] == [LOG_HOME_KEY]
    assert shard.upper == 2
    # Without the URL the read is refused, naming where the log is (never an empty shard).
    with pytest.raises(Exception, match=r"InvalidOption: the shard keeps its log in a database"):
        spark.read.format("persistshard").load(loc).collect()


def test_sql_table_remembers_its_consensus(spark, tmp_path):
    loc, url = str(tmp_path / "t"), f"sqlite:///{tmp_path}/log.db"
    t = f"t_{uuid.uuid4().hex[:8]}"
    spark.sql(
        f"CREATE TABLE {t} USING persistshard LOCATION '{loc}' "
        f"OPTIONS (columns 'id BIGINT, item STRING', consensus '{url}')"
    )
    try:
        assert all(f.metadata.get(CONSENSUS_KEY) == url for f in spark.table(t).schema.fields)
        spark.sql(f"INSERT INTO {t} VALUES (1, 'apple'), (2, 'pear')")
        spark.sql(f"INSERT INTO {t} WITH ('path' = '{loc}') VALUES (3, 'fig')")
        assert sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {t}").collect()) == [
            (1, "apple"),
            (2, "pear"),
            (3, "fig"),
        ]
        assert rows_of(loc, url) == Counter({(1, "apple"): 1, (2, "pear"): 1, (3, "fig"): 1})
        assert ps.open_shard(loc)._consensus.head() is None
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {t}")


def test_sql_with_consensus_per_statement(spark, tmp_path, has_companion_catalog):
    """A statement's ``WITH ('consensus' = ...)`` reaches the shard, so the table's catalog
    entry needs no consensus. The Python source's table may have no location (the statement
    names it); the companion's catalog refuses a table without one, so there the table has
    the shard's location and the statement gives only the consensus, which the table lacks
    (without it the read is refused, naming where the log is)."""
    loc, url = str(tmp_path / "w"), f"sqlite:///{tmp_path}/log.db"
    df = spark.createDataFrame([(7, "kiwi")], "id BIGINT, item STRING")
    df.write.format("persistshard").mode("append").option("consensus", url).save(loc)
    t = f"w_{uuid.uuid4().hex[:8]}"
    where = f"LOCATION '{loc}'" if has_companion_catalog else ""
    spark.sql(f"CREATE TABLE {t} (id BIGINT, item STRING) USING persistshard {where}")
    try:
        given = f"'consensus' = '{url}'"
        if not has_companion_catalog:
            given = f"'path' = '{loc}', {given}"
        got = spark.sql(f"SELECT * FROM {t} WITH ({given})")
        assert [tuple(r) for r in got.collect()] == [(7, "kiwi")]
        if has_companion_catalog:
            with pytest.raises(Exception, match=r"InvalidOption: the shard keeps its log"):
                spark.sql(f"SELECT * FROM {t}").collect()
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {t}")


@pytest.mark.parametrize(
    "option, secret",
    [
        ("consensus", "postgresql://user:hunter2pw@127.0.0.1:1/db"),
        ("consensus", "postgresql://user@127.0.0.1:1/db?password=hunter2pw"),
        ("storage.secret", "hunter2pw"),
        ("storage.key", "hunter2pw"),
    ],
)
def test_a_table_with_declared_columns_refuses_secrets(
    spark, tmp_path, has_companion_catalog, option, secret
):
    """With a column list Spark never asks the Python source at CREATE TABLE, so only the
    companion's session catalog can refuse what would keep a secret in the catalog (which
    stores OPTIONS as given and shows them): it asks the Python source's check first, and
    nothing is stored; the message names the cause, never the secret."""
    if not has_companion_catalog:
        pytest.skip("the Python source alone is not asked at a CREATE with a column list")
    loc = str(tmp_path / "d")
    t = f"d_{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(Exception, match=r"InvalidOption: a table's OPTIONS are stored") as e:
            spark.sql(
                f"CREATE TABLE {t} (id BIGINT) USING persistshard LOCATION '{loc}' "
                f"OPTIONS ('{option}' '{secret}')"
            )
        assert "hunter2pw" not in str(e.value)
        assert not spark.catalog.tableExists(t)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {t}")


def test_table_options_refuse_a_consensus_password(spark, tmp_path):
    loc = str(tmp_path / "p")
    url = "postgresql://user:hunter2-secret@127.0.0.1:1/db"
    t = f"p_{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match="password") as e:
        spark.sql(
            f"CREATE TABLE {t} USING persistshard LOCATION '{loc}' "
            f"OPTIONS (columns 'id BIGINT', consensus '{url}')"
        )
    assert "hunter2-secret" not in str(e.value)
    spark.sql(f"DROP TABLE IF EXISTS {t}")
