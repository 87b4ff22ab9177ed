"""Upsert writes through Spark (datasource/upsert.py): batch ``mode("append")`` with
``key_columns``, streams with ``key_columns``, ``foreachBatch`` with ``batch_id``, errors,
and the crash points of the commit protocol (driven without Spark, as the tasks and the
driver would run it)."""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.core.shard import Shard
from persistshard.core.write.transaction import WriteTransaction
from persistshard.datasource.upsert import (
    UpsertStreamWriter,
    commit_upserts,
    plan_upsert,
    stage_task,
)
from persistshard.datasource.writer import StreamTaskWritten
from persistshard.errors import InvalidOption

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])


@pytest.fixture
def location(tmp_path: Any) -> str:
    return str(tmp_path / "shard")


def table_of(shard: Shard) -> dict[int, str]:
    out: dict[int, str] = {}
    for r in shard.snapshot().to_pylist():
        assert r["_diff"] == 1 and r["id"] not in out, r
        out[r["id"]] = r["v"]
    return out


def test_batch_upsert_writes(spark: Any, location: str) -> None:
    first = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id long, v string")
    first.write.format("persistshard").mode("append").option("key_columns", "id").save(location)
    changes = spark.createDataFrame(
        [(2, "B", False), (3, None, True), (4, "d", False), (1, "a", False)],
        "id long, v string, deleted boolean",
    ).repartition(2)
    (
        changes.write.format("persistshard")
        .mode("append")
        .option("key_columns", "id")
        .option("delete_column", "deleted")
        .save(location)
    )
    shard = ps.open_shard(location)
    assert table_of(shard) == {1: "a", 2: "B", 4: "d"}
    assert shard.upper == 2
    got = {(r["id"], r["v"], r["_diff"]) for r in shard.updates(1, 2).to_pylist()}
    assert got == {(2, "b", -1), (2, "B", 1), (3, "c", -1), (4, "d", 1)}
    # _diff = -1 deletes as well
    spark.createDataFrame([(4, "d", -1)], "id long, v string, _diff long").write.format(
        "persistshard"
    ).mode("append").option("key_columns", "id").save(location)
    assert table_of(shard) == {1: "a", 2: "B"}
    read = spark.read.format("persistshard").load(location)
    assert sorted(tuple(r) for r in read.collect()) == [(1, "a"), (2, "B")]
    shard.gc(dry_run=False, retention_seconds=0)  # compaction's inputs; no staged part left
    assert {m.key for m in shard._blob.list("parts/")} == shard.inspect.state().stored_part_keys()


def test_duplicate_keys_across_tasks_are_refused(spark: Any, location: str) -> None:
    ps.open_shard(location).upsert(pa.table({"id": [1], "v": ["a"]}), "id")
    shard = ps.open_shard(location)
    before = (shard.upper, {m.key for m in shard._blob.list("")})
    dupes = spark.createDataFrame([(5, "x"), (5, "y")], "id long, v string").repartition(2, "v")
    with pytest.raises(Exception, match=r"InvalidUpdates: duplicate key in one upsert: \(id=5\)"):
        dupes.write.format("persistshard").mode("append").option("key_columns", "id").save(location)
    assert (shard.upper, {m.key for m in shard._blob.list("")}) == before


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("append", {"key_columns": "nope"}, r"key column 'nope' is not a column"),
        ("overwrite", {"key_columns": "id"}, r"mode\('overwrite'\) replaces the whole table"),
        ("append", {"key_columns": "id", "upper": "9"}, r"takes no upper option"),
        ("append", {"key_columns": "id", "delete_column": "x"}, r"delete_column names column"),
        ("append", {"key_columns": "id", "batch_id": "3"}, r"batch_id needs option writer_id"),
    ],
)
def test_upsert_options_are_checked_before_any_task(
    spark: Any, location: str, mode: str, options: dict[str, str], message: str
) -> None:
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    with pytest.raises(Exception, match="InvalidOption: .*" + message):
        df.write.format("persistshard").mode(mode).options(**options).save(location)
    assert ps.open_shard(location).upper == 0


def test_foreach_batch_upserts_once_per_batch_id(spark: Any, location: str) -> None:
    shard = ps.open_shard(location)

    def write(rows: list[tuple[int, str]], batch_id: int) -> None:
        df = spark.createDataFrame(rows, "id long, v string")
        (
            df.write.format("persistshard")
            .mode("append")
            .option("key_columns", "id")
            .option("writer_id", "agg")
            .option("batch_id", batch_id)
            .option("compact", "false")
            .save(location)
        )

    write([(1, "a")], 0)
    write([(1, "b")], 1)
    version = shard.inspect.state().version
    write([(1, "b")], 1)  # replayed by Spark after a crash: a no-op
    # An older batch id: the stream's checkpoint was lost (Spark numbers batches from 0
    # again); refused naming it, never dropped as a replay (issue 36, item 5).
    with pytest.raises(Exception, match="restarted without its checkpoint"):
        write([(1, "zzz")], 0)
    with pytest.raises(Exception, match="restarted without its checkpoint"):
        write([(1, "zzz")], 1)  # the recorded id with other rows, outside a stream
    assert shard.inspect.state().version == version
    assert table_of(shard) == {1: "b"}
    assert shard.inspect.state().writers["agg"] == 1
    assert {m.key for m in shard._blob.list("parts/")} == shard.inspect.state().stored_part_keys()


def test_upsert_stream(spark: Any, location: str, tmp_path: Any) -> None:
    """A stream of upserts and deletes (JSON files, one micro-batch per run)."""
    source = tmp_path / "in"
    source.mkdir()
    schema = "id long, v string, deleted boolean"

    def run(name: str, rows: list[dict[str, Any]]) -> None:
        (source / name).write_text("\n".join(json.dumps(r) for r in rows))
        q = (
            spark.readStream.schema(schema)
            .json(str(source))
            .writeStream.format("persistshard")
            .option("key_columns", "id")
            .option("delete_column", "deleted")
            .option("writer_id", "cdc")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start(location)
        )
        q.awaitTermination(120)
        assert q.exception() is None

    run("1.json", [{"id": i, "v": "a", "deleted": False} for i in range(5)])
    run(
        "2.json",
        [{"id": 1, "v": "b", "deleted": False}, {"id": 2, "v": None, "deleted": True}],
    )
    shard = ps.open_shard(location)
    assert table_of(shard) == {0: "a", 1: "b", 3: "a", 4: "a"}
    assert shard.inspect.state().writers["cdc"] == 1
    got = {(r["id"], r["v"], r["_diff"]) for r in shard.updates(1, 2).to_pylist()}
    assert got == {(1, "a", -1), (1, "b", 1), (2, "a", -1)}


def test_spark_refuses_update_mode_for_python_sources(spark: Any, location: str, tmp_path: Any):
    """Spark 4.3 itself refuses outputMode('update') for a Python data source, before the
    source sees the write (so key_columns in append mode is the upsert switch)."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1, "v": "a"}')
    counts = spark.readStream.schema("id long, v string").json(str(source)).groupBy("id").count()
    q = (
        counts.writeStream.format("persistshard")
        .outputMode("update")
        .option("key_columns", "id")
        .option("writer_id", "agg")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(location)
    )
    with pytest.raises(Exception, match="does not support Update mode"):
        q.awaitTermination(120)
    assert ps.open_shard(location).upper == 0


# --- crash points and replays, without Spark ---------------------------------------------------


class Crash(Exception):
    """An injected crash."""


def _micro_batch(
    location: str, batch_id: int, ops: list[tuple[int, str | None]], tasks: int
) -> list[StreamTaskWritten]:
    """Run the tasks of micro-batch ``batch_id``: rows split over ``tasks`` tasks."""
    options = {"path": location, "writer_id": "w", "key_columns": "id", "compact": "false"}
    options["delete_column"] = "deleted"
    schema = StructType([*SCHEMA.fields, StructField("deleted", BooleanType())])
    out = []
    for t in range(tasks):
        mine = ops[t::tasks]
        _, spec, d = plan_upsert(options, schema, False, streaming=True)
        from dataclasses import replace

        d = replace(d, write_id=f"{d.write_id}-w-{batch_id}-{t}")
        batch = pa.record_batch(
            {
                "id": pa.array([k for k, _ in mine], pa.int64()),
                "v": pa.array([v for _, v in mine], pa.string()),
                "deleted": pa.array([v is None for _, v in mine], pa.bool_()),
            }
        )
        w = stage_task(d, spec, [batch])
        out.append(StreamTaskWritten(w.sealed, w.unsealed, None, w.rows_in, d.lower, d.write_id))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_crashes_and_replays_commit_each_micro_batch_once(
    location: str, seed: int, monkeypatch: Any
) -> None:
    """Crashes after the tasks (before the commit), after the delta parts are written (before
    the compare-and-set) and after the commit (before Spark records it); every micro-batch is
    replayed with its batch id until it commits. Expected: the shard equals the model after
    each micro-batch, each batch id is one commit, and after gc no part is left behind."""
    rng = random.Random(seed)
    options = {"path": location, "writer_id": "w", "key_columns": "id", "compact": "false"}
    options["delete_column"] = "deleted"
    schema = StructType([*SCHEMA.fields, StructField("deleted", BooleanType())])
    shard = ps.open_shard(location)
    model: dict[int, str] = {}
    real_commit = WriteTransaction.commit
    for batch_id in range(6):
        keys = rng.sample(range(20), rng.randint(1, 8))
        ops = [(k, rng.choice([None, "a", "b", "c"])) for k in keys]
        crashes = rng.sample(["after_tasks", "before_cas", "after_commit"], rng.randint(0, 3))
        while True:
            messages = _micro_batch(location, batch_id, ops, rng.randint(1, 3))
            if crashes and crashes[0] == "after_tasks":
                crashes.pop(0)
                continue  # the driver died: Spark replays the batch, its staged parts remain
            if crashes and crashes[0] == "before_cas":
                crashes.pop(0)

                def boom(*args: Any, **kwargs: Any) -> Any:
                    raise Crash("before the compare-and-set")

                monkeypatch.setattr(WriteTransaction, "commit", boom)
                with pytest.raises(Crash):
                    UpsertStreamWriter(options, schema, False).commit(messages, batch_id)
                monkeypatch.setattr(WriteTransaction, "commit", real_commit)
                continue
            UpsertStreamWriter(options, schema, False).commit(messages, batch_id)
            if crashes and crashes[0] == "after_commit":
                crashes.pop(0)
                version = shard.inspect.state().version
                again = _micro_batch(location, batch_id, ops, 2)
                UpsertStreamWriter(options, schema, False).commit(again, batch_id)
                assert shard.inspect.state().version == version
            break
        for k, v in ops:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        assert table_of(shard) == model
        assert shard.inspect.state().writers["w"] == batch_id
        assert shard.upper == batch_id + 1
    # The crashed writes' parts are kept while their write leases live; once those ran out
    # (gc's clock past them, and a commit recording that time: gc judges time by at most a
    # small lead past the newest commit), gc sweeps every part no version references.
    from persistshard.core.statemachine.leases import DEFAULT_WRITE_LEASE_SECONDS
    from persistshard.core.storage import layout

    later = layout.now_ms() + int(DEFAULT_WRITE_LEASE_SECONDS * 1000) + 60_000
    monkeypatch.setattr(layout, "now_ms", lambda: later)
    shard.maintenance.expire_reader("nobody")
    shard.gc(dry_run=False, retention_seconds=0)
    assert {m.key for m in shard._blob.list("parts/")} == shard.inspect.state().stored_part_keys()


def test_commit_checks_keys_staged_by_two_tasks(location: str) -> None:
    options = {"path": location, "key_columns": "id"}
    _, spec, d = plan_upsert(options, SCHEMA, False, streaming=False)
    one = stage_task(d, spec, [pa.record_batch({"id": [1, 2], "v": ["a", "b"]})])
    two = stage_task(d, spec, [pa.record_batch({"id": [2], "v": ["c"]})])
    with pytest.raises(Exception, match=r"InvalidUpdates: duplicate key .*\(id=2\)"):
        commit_upserts(d, spec, [one, two], staged_ids=[d.write_id])
    shard = ps.open_shard(location)
    assert shard.upper == 0 and not list(shard._blob.list("parts/"))


def test_streaming_aggregation_in_update_mode_through_foreach_batch(
    spark: Any, location: str, tmp_path: Any
) -> None:
    """The README's recipe: an aggregation's update-mode output upserted by foreachBatch with
    writer_id and batch_id; the table equals the aggregation after each micro-batch."""
    source = tmp_path / "in"
    source.mkdir()

    def upsert_batch(df: Any, batch_id: int) -> None:
        (
            df.write.format("persistshard")
            .mode("append")
            .option("key_columns", "user")
            .option("writer_id", "clicks")
            .option("batch_id", batch_id)
            .save(location)
        )

    def run(name: str, users: list[str]) -> None:
        (source / name).write_text("\n".join(json.dumps({"user": u}) for u in users))
        q = (
            spark.readStream.schema("user string")
            .json(str(source))
            .groupBy("user")
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(upsert_batch)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None

    run("1.json", ["a", "b", "a"])
    run("2.json", ["b", "c"])
    shard = ps.open_shard(location)
    got = {r["user"]: r["count"] for r in shard.snapshot().to_pylist() if r["_diff"] == 1}
    assert got == {"a": 2, "b": 2, "c": 1}
    assert shard.snapshot().num_rows == 3
    changes = {(r["user"], r["count"], r["_diff"]) for r in shard.updates(1, 2).to_pylist()}
    assert changes == {("b", 1, -1), ("b", 2, 1), ("c", 1, 1)}  # "a" did not change


def test_stream_writer_refusals(location: str) -> None:
    """Complete mode (Spark passes overwrite=True) and a missing writer_id are refused when
    the stream starts, with what to do instead."""
    options = {"path": location, "key_columns": "id", "writer_id": "w"}
    with pytest.raises(InvalidOption, match=r"outputMode\('complete'\) replaces the whole"):
        UpsertStreamWriter(options, SCHEMA, True)
    with pytest.raises(InvalidOption, match="needs option writer_id"):
        UpsertStreamWriter({"path": location, "key_columns": "id"}, SCHEMA, False)
    with pytest.raises(InvalidOption, match="batch_id is for batch writes"):
        UpsertStreamWriter({**options, "batch_id": "1"}, SCHEMA, False)
