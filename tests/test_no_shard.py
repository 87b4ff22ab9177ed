"""A location that holds no shard (issue 36, item 7; API.md "What the shard promises under
faults", `NoShard`): ``upper``, ``since`` and ``schema`` read as the empty shard (so a first
compare-and-append can start at 0), every other read, inspection or maintenance call is
`NoShard` and writes nothing; only data writes create a shard. A mistyped path must not look
like an empty table."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.errors import NoShard

CALLS: dict[str, Callable[[ps.Shard], Any]] = {
    "snapshot": lambda s: s.snapshot(),
    "snapshot as_of 0": lambda s: s.snapshot(0),
    "scan": lambda s: s.scan(),
    "scan_updates": lambda s: s.scan_updates(0, 0),
    "updates": lambda s: s.updates(0, 0),
    "listen": lambda s: s.listen(0, timeout=0),
    "history": lambda s: s.history(),
    "verify": lambda s: s.verify(),
    "describe": lambda s: s.inspect.describe(),
    "readers": lambda s: s.readers(),
    "gc": lambda s: s.gc(),
    "gc applied": lambda s: s.gc(dry_run=False),
    "compact": lambda s: s.compact(),
    "maybe_compact": lambda s: s._maybe_compact(),
}


def _files(root: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
    )


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_mistyped_path_is_no_shard_and_stays_empty(tmp_path, call):
    typo = str(tmp_path / "typo")
    shard = ps.open_shard(typo)
    with pytest.raises(NoShard, match=r"^NoShard: no shard at file://.*typo"):
        CALLS[call](shard)
    assert not os.path.exists(typo) or _files(typo) == []  # nothing written anywhere


def test_an_empty_directory_is_no_shard_too(tmp_path):
    shard = ps.open_shard(str(tmp_path))
    with pytest.raises(NoShard):
        shard.snapshot()
    with pytest.raises(NoShard):
        shard.verify()  # used to say "ok": a typo looked like a healthy empty table
    assert _files(str(tmp_path)) == []


def test_frontiers_and_schema_read_as_the_empty_shard(tmp_path):
    shard = ps.open_shard(str(tmp_path / "new"))
    assert (shard.upper, shard.since, shard.schema) == (0, 0, None)
    assert shard.inspect.state().version == 0


def test_a_first_compare_and_append_starts_at_zero_and_creates_the_shard(tmp_path):
    loc = str(tmp_path / "new")
    shard = ps.open_shard(loc)
    shard.compare_and_append(
        pa.table({"id": [1, 2], "_time": [0, 0], "_diff": [1, 1]}), shard.upper, 1
    )
    again = ps.open_shard(loc)
    assert again.snapshot().to_pydict() == {"id": [1, 2], "_diff": [1, 1]}
    assert again.verify().ok and len(again.history()) == 1


def test_a_seal_creates_a_shard_without_columns_that_reads_empty(tmp_path):
    loc = str(tmp_path / "sealed")
    ps.open_shard(loc).seal(3)
    shard = ps.open_shard(loc)
    assert shard.upper == 3 and shard.schema is None
    assert shard.snapshot().num_rows == 0
    assert shard.updates(0, 3).num_rows == 0
    assert shard.verify().ok
    assert shard.inspect.describe()["upper"] == 3


def test_a_handle_made_before_the_first_write_sees_the_shard_after_it(tmp_path):
    loc = str(tmp_path / "later")
    early = ps.open_shard(loc)
    with pytest.raises(NoShard):
        early.history()
    ps.open_shard(loc).append(pa.table({"id": [7]}))
    assert early.snapshot().to_pydict() == {"id": [7], "_diff": [1]}


def test_spark_read_of_a_path_without_shard_is_no_shard_with_or_without_a_schema(spark, tmp_path):
    missing = str(tmp_path / "nothing")
    with pytest.raises(Exception, match=r"NoShard: no shard at"):
        spark.read.format("persistshard").load(missing).collect()
    with pytest.raises(Exception, match=r"NoShard: no shard at"):
        spark.read.format("persistshard").schema("id BIGINT").load(missing).collect()
    assert not os.path.exists(missing)


def test_a_sql_table_created_over_an_empty_location_reads_zero_rows(spark, tmp_path):
    loc = str(tmp_path / "fresh")
    name = "no_shard_yet"
    spark.sql(
        f"CREATE TABLE {name} USING persistshard LOCATION '{loc}' "
        "OPTIONS (columns 'id BIGINT, item STRING')"
    )
    try:
        df = spark.table(name)
        assert df.columns == ["id", "item"] and df.collect() == []
        with pytest.raises(NoShard):  # the table exists in the catalog; the shard does not yet
            ps.open_shard(loc).snapshot()
        spark.sql(f"INSERT INTO {name} VALUES (1, 'apple')")
        assert [tuple(r) for r in spark.table(name).collect()] == [(1, "apple")]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
