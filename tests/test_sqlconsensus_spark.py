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


def test_sql_with_consensus_per_statement(spark, tmp_path):
    loc, url = str(tmp_path / "w"), f"sqlite:///{tmp_path}/log.db"
    df = spark.createDataFrame([(7, "kiwi")], "id BIGINT, item STRING")
    df.write.format("persistshard").mode("append").option("consensus", url).save(loc)
    t = f"w_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {t} (id BIGINT, item STRING) USING persistshard")
    try:
        got = spark.sql(f"SELECT * FROM {t} WITH ('path' = '{loc}', 'consensus' = '{url}')")
        assert [tuple(r) for r in got.collect()] == [(7, "kiwi")]
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
