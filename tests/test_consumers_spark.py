"""The Spark read option ``consumer`` and ``ps.advance_consumer``: a nightly job reads a
durable consumer's changes, commits its output, then advances the consumer; a racing copy of
the job loses the advance (issue 39, item 3)."""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.datasource.options import ReadOptions
from persistshard.errors import InvalidOption, StateConflict


def _rows(ids: list[int], time: int, diff: int = 1) -> pa.Table:
    n = len(ids)
    return pa.table({"id": ids, "_time": [time] * n, "_diff": [diff] * n})


def test_option_consumer_is_a_change_read_and_takes_no_other_start():
    opts = ReadOptions.parse({"path": "/data/x", "consumer": "etl"})
    assert opts.consumer == "etl" and opts.reads_updates
    assert ReadOptions.parse({"path": "/data/x", "consumer": "etl", "updates_to": "4"}).consumer
    for other in ({"updates_from": "1"}, {"as_of": "1"}, {"changes": "true"}):
        with pytest.raises(InvalidOption, match="option consumer reads the changes"):
            ReadOptions.parse({"path": "/data/x", "consumer": "etl", **other})
    with pytest.raises(InvalidOption, match="option consumer is empty"):
        ReadOptions.parse({"path": "/data/x", "consumer": " "})


@pytest.mark.spark
def test_a_nightly_job_reads_its_changes_and_advances(spark, tmp_path):
    location = str(tmp_path / f"orders-{uuid.uuid4().hex[:8]}")
    shard = ps.open_shard(location)
    shard.append(_rows([1, 2], 0))
    shard.append(_rows([3], 1))
    shard.advance_since(1)
    consumer = shard.consumer("nightly-etl")
    assert consumer.position == 1

    def run_job() -> tuple[Counter[tuple[int, int, int]], int, int]:
        p = ps.open_shard(location).consumers()["nightly-etl"]
        df = spark.read.format("persistshard").option("consumer", "nightly-etl").load(location)
        assert {"_time", "_diff"} <= set(df.columns)
        got = Counter((r["id"], r["_time"], r["_diff"]) for r in df.collect())
        return got, p, ps.open_shard(location).upper

    got, p, t = run_job()
    # a consumer created at since 1 has read nothing: the snapshot at 1, as updates at 1
    assert got == Counter({(1, 1, 1): 1, (2, 1, 1): 1, (3, 1, 1): 1})
    assert ps.advance_consumer(location, "nightly-etl", to=t, expected=p) == 2
    shard.append(_rows([2], 2, -1))
    shard.append(_rows([4], 3))
    assert shard.advance_since(shard.upper) == 1  # held below position 2
    got, p, t = run_job()
    assert got == Counter({(2, 2, -1): 1, (4, 3, 1): 1})
    ps.advance_consumer(location, "nightly-etl", to=t, expected=p)
    got, _, _ = run_job()
    assert got == Counter()


@pytest.mark.spark
def test_updates_to_pins_the_read_and_a_racing_copy_loses_the_advance(spark, tmp_path):
    location = str(tmp_path / f"orders-{uuid.uuid4().hex[:8]}")
    shard = ps.open_shard(location)
    for t in range(4):
        shard.append(_rows([t], t))
    shard.consumer("etl")
    p, t = 0, 2
    df = (
        spark.read.format("persistshard")
        .option("consumer", "etl")
        .option("updates_to", t)
        .load(location)
    )
    assert sorted((r["id"], r["_time"]) for r in df.collect()) == [(0, 0), (1, 1)]
    ps.advance_consumer(location, "etl", to=t, expected=p)  # the first copy of the job
    with pytest.raises(StateConflict) as e:  # the second copy planned at the same position
        ps.advance_consumer(location, "etl", to=4, expected=p)
    assert e.value.actual == 2
    assert shard.consumers() == {"etl": 2}


@pytest.mark.spark
def test_a_missing_consumer_a_stale_bound_and_a_stream_are_refused(spark, tmp_path):
    location = str(tmp_path / f"orders-{uuid.uuid4().hex[:8]}")
    shard = ps.open_shard(location)
    shard.append(_rows([1], 0))
    shard.append(_rows([2], 1))
    shard.consumer("etl").advance(2, expected=0)
    with pytest.raises(Exception, match="InvalidOption: option consumer: the shard has no"):
        spark.read.format("persistshard").option("consumer", "nobody").load(location).collect()
    assert shard.consumers() == {"etl": 2}  # a read never creates one
    with pytest.raises(Exception, match="InvalidOption: option updates_to 1 is behind"):
        (
            spark.read.format("persistshard")
            .option("consumer", "etl")
            .option("updates_to", 1)
            .load(location)
            .collect()
        )
    with pytest.raises(Exception, match="option consumer is for batch reads"):
        q = (
            spark.readStream.format("persistshard")
            .option("consumer", "etl")
            .load(location)
            .writeStream.format("console")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        q.awaitTermination(60)
        if q.exception() is not None:
            raise Exception(str(q.exception()))
