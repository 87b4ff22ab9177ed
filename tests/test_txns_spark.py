"""Transactions over many shards in Spark (issue 39, item 1): batch and streaming reads of a
registered shard see its committed writes, applied or not; a plain Spark write to it is
refused with nothing applied; ``ps.write_together`` writes several DataFrames as one
transaction (Spark tasks write the parts, the driver commits once on the txns shard)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core import txns as txns_module


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def spark_ids(spark, path: str, **options: str) -> list[int]:
    reader = spark.read.format("persistshard")
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted(r["id"] for r in reader.load(path).collect())


def test_spark_reads_a_registered_shard_with_pending_writes(tmp_path, spark, monkeypatch):
    a, b, x = (str(tmp_path / n) for n in ("a", "b", "_txns"))
    ps.open_shard(a).append(rows([1]))
    txns = ps.open_txns(x)
    txns.register(a, b)
    monkeypatch.setattr(txns_module, "apply_write", lambda data, w: 0)  # nobody applies
    with txns.begin() as tx:
        tx.append(a, rows([2]))
        tx.append(b, rows([7, 8]))
    monkeypatch.undo()
    t = tx.committed_at
    assert ps.open_shard(a).inspect.state().upper <= t  # not applied
    assert spark_ids(spark, a) == [1, 2]
    assert spark_ids(spark, b) == [7, 8]
    assert spark_ids(spark, a, as_of=str(t - 1)) == [1]
    txns.apply()
    assert spark_ids(spark, a) == [1, 2] and spark_ids(spark, b) == [7, 8]


def test_a_plain_spark_write_to_a_registered_shard_is_refused(tmp_path, spark):
    a, x = str(tmp_path / "a"), str(tmp_path / "_txns")
    ps.open_shard(a).append(rows([1]))
    txns = ps.open_txns(x)
    txns.register(a)
    before = ps.open_shard(a).inspect.state()
    df = spark.createDataFrame([(5, "v5")], "id long, v string")
    with pytest.raises(Exception, match=r"InvalidOption.*registered with the txns shard"):
        df.write.format("persistshard").mode("append").save(a)
    after = ps.open_shard(a).inspect.state()
    assert (after.upper, after.trace) == (before.upper, before.trace)
    assert spark_ids(spark, a) == [1]


def test_write_together_lands_every_dataframe_at_one_time(tmp_path, spark):
    a, b, x = (str(tmp_path / n) for n in ("a", "b", "_txns"))
    ps.open_shard(a).append(rows([1]))
    txns = ps.open_txns(x)
    txns.register(a, b)
    orders = spark.createDataFrame([(i, f"o{i}") for i in range(10, 20)], "id long, v string")
    lines = spark.createDataFrame([(i, f"l{i}") for i in range(100, 130)], "id long, v string")
    t = ps.write_together(spark, {a: orders.repartition(3), b: lines}, txns=x)
    sa, sb = ps.open_shard(a), ps.open_shard(b)
    assert sa.upper == sb.upper == t + 1 == txns.upper
    assert sa.inspect.state().upper == t + 1  # applied by the driver
    assert [r["id"] for r in sa.snapshot().to_pylist()] == [1, *range(10, 20)]
    assert [r["id"] for r in sb.snapshot().to_pylist()] == list(range(100, 130))
    assert sa.snapshot(t - 1).num_rows == 1 and sb.snapshot(t - 1).num_rows == 0
    for shard in (sa, sb):
        stored = {m.key for m in shard._blob.list("parts/")}
        assert stored == shard.inspect.state().stored_part_keys() and shard.verify().ok


def test_write_together_refuses_an_unregistered_shard_and_writes_nothing(tmp_path, spark):
    a, c, x = (str(tmp_path / n) for n in ("a", "c", "_txns"))
    txns = ps.open_txns(x)
    txns.register(a)
    df = spark.createDataFrame([(1, "v1")], "id long, v string")
    with pytest.raises(ps.InvalidOption, match="not registered"):
        ps.write_together(spark, {a: df, c: df}, txns=x)
    assert (
        ps.open_shard(a).inspect.state().upper <= txns.upper
        and not ps.open_shard(a).inspect.state().txn_pins
    )
    assert ps.open_shard(a).snapshot().num_rows == 0
    assert {m.key for m in ps.open_shard(a)._blob.list("parts/")} == set()


def test_a_stream_of_a_registered_shard_sees_each_transaction(tmp_path, spark, monkeypatch):
    """A streaming read of a registered shard: the snapshot, then each transaction's write
    at its time, whether applied yet or not."""
    a, x = str(tmp_path / "a"), str(tmp_path / "_txns")
    ps.open_shard(a).append(rows([1]))
    txns = ps.open_txns(x)
    txns.register(a)
    stream = spark.readStream.format("persistshard").option("changes", True).load(a)
    seen: list[set] = []

    def run_once() -> None:
        q = (
            stream.writeStream.foreachBatch(
                lambda df, _: seen.append({(r["id"], r["_diff"]) for r in df.collect()})
            )
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)

    run_once()
    assert set().union(*seen) == {(1, 1)}
    seen.clear()
    monkeypatch.setattr(txns_module, "apply_write", lambda data, w: 0)  # nobody applies
    with txns.begin() as tx:
        tx.append(a, rows([2]))
    monkeypatch.undo()
    run_once()  # the pending write, read from the txns shard
    assert set().union(*seen) == {(2, 1)}
