"""Option ``retention`` through real Spark jobs: a write whose tasks fail (``raise_error`` in
the query) leaves the shard's retention, since, log and rows as they were, in batch appends,
overwrites, upserts and streaming appends; a write that lands sets the retention in its one
commit. (Every path and every refusal, driven without a JVM:
tests/test_write_retention_sinks.py.)"""

from __future__ import annotations

import pytest
import test_write_retention_sinks as sinks

import persistshard as ps
from persistshard.core.statemachine.retention import Retention

pytestmark = pytest.mark.spark

#: The fixture (a shard of three versions with a one-hour retention) and what a failed write
#: must leave as it was, as in the tests without a JVM.
location = sinks.location
look = sinks.look

FAILING = "id, IF(id > 1, CAST(raise_error('boom') AS STRING), v) AS v"


@pytest.mark.parametrize(
    ("mode", "more"),
    [("append", {}), ("overwrite", {}), ("append", {"key_columns": "id"})],
    ids=["append", "overwrite", "upsert"],
)
def test_a_batch_write_whose_tasks_fail_changes_nothing(spark, location, mode, more):
    df = spark.createDataFrame([(1, "a"), (2, "b"), (5, "c")], "id BIGINT, v STRING")
    before = look(location)
    writer = df.selectExpr(*FAILING.split(", ", 1)).write.format("persistshard")
    for key, value in {"retention": "2 versions", **more}.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match="boom"):
        writer.mode(mode).save(location)
    assert look(location) == before


@pytest.mark.parametrize(
    ("mode", "more", "kind"),
    [
        ("append", {}, "append"),
        ("overwrite", {}, "overwrite"),
        ("append", {"key_columns": "id"}, "upsert"),
    ],
    ids=["append", "overwrite", "upsert"],
)
def test_a_batch_write_sets_the_retention_in_its_one_commit(spark, location, mode, more, kind):
    version = ps.open_shard(location).inspect.state().version
    df = spark.createDataFrame([(1, "a"), (5, "c")], "id BIGINT, v STRING")
    writer = df.write.format("persistshard").option("retention", "2 versions")
    for key, value in more.items():
        writer = writer.option(key, value)
    writer.mode(mode).save(location)
    shard = ps.open_shard(location)
    new = [h for h in shard.inspect.history() if h["version"] > version]
    assert [(h["commit"], h["kind"]) for h in new] == [("append_set_retention", kind)], new
    assert shard.inspect.retention() == Retention(versions=2)
    assert shard.since == shard.upper - 2


def test_a_stream_whose_tasks_fail_changes_nothing_and_one_that_runs_sets_it(
    spark, location, tmp_path
):
    from persistshard.conformance.logsource import PartitionedLogSource, append_records

    spark.dataSource.register(PartitionedLogSource)
    src = tmp_path / "src"
    append_records(str(src), "t", 0, ["x", "y", "z"])

    source = (
        spark.readStream.format("partitioned_log")
        .load(str(src))
        .selectExpr("offset + 1 AS id", "CAST(value AS STRING) AS v")
    )

    def run(select: str, checkpoint: str) -> BaseException | None:
        """The stream of ``select`` over the records, to its end; its error, or None."""
        sink = source.selectExpr(*select.split(", ", 1)).writeStream.format("persistshard")
        chk = str(tmp_path / checkpoint)
        sink = sink.options(writer_id="ingest", retention="7d", checkpointLocation=chk)
        q = sink.trigger(availableNow=True).start(location)
        try:
            q.awaitTermination(180)
        except Exception as e:  # a failed query raises here
            return e
        return q.exception()

    before = look(location)
    error = run(FAILING, "chk-failing")
    assert error is not None and "boom" in str(error), error
    assert look(location) == before
    assert run("id, v", "chk") is None
    shard = ps.open_shard(location)
    new = [h for h in shard.inspect.history() if h["version"] > before[4][-1][0]]
    assert [(h["commit"], h["kind"]) for h in new] == [("append_set_retention", "stream append")]
    assert shard.inspect.retention() == Retention(ms=7 * 86_400_000)
