"""Option ``retention`` of every Spark write path lands in the write's own commit, and a write
that fails changes nothing: the Spark writer objects driven as Spark drives them (the
driver's writer, each task's ``write``, then ``commit`` or ``abort``), without a JVM; the
same through real Spark jobs, with failures inside the tasks: tests/test_retention_spark.py.

For each path (batch append, overwrite, upsert, reclocked append; streaming append,
complete mode, upsert and reclocked micro-batches): a write whose option is refused, whose
columns are refused, or whose task raises leaves the retention, its marks, since, upper, the
log's entries and the rows as they were; a write that lands sets the retention in its one
new log entry; a write whose retention is the stored one is a plain commit and leaves it.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.core.statemachine.retention import Retention
from persistshard.datasource import reclock
from persistshard.datasource.options import TABLE_KEY
from persistshard.datasource.source import PersistShardDataSource
from persistshard.datasource.upsert import upsert_stream_task
from persistshard.datasource.writer import describe_write
from persistshard.errors import InvalidOption, InvalidUpdates, UpperMismatch

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
WEEK = Retention(ms=7 * 86_400_000)


class Boom(Exception):
    """A task's failure (a UDF raising)."""


def rows(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids], pa.string())}
    )


def failing(ids: list[int]) -> Any:
    """A task's rows that raise half way, as a UDF raising on one row does."""
    yield rows(ids[:1])
    raise Boom("a UDF raised")


@pytest.fixture
def location(tmp_path) -> str:
    """A shard of three versions (ids 1, 2, 3) with a one-hour retention."""
    loc = str(tmp_path / "s")
    shard = ps.open_shard(loc, maintenance=False)
    for i in (1, 2, 3):
        shard.append(pa.table({"id": pa.array([i], pa.int64()), "v": pa.array([f"v{i}"])}))
    shard.set_retention(seconds=3600)
    return loc


def look(location: str) -> tuple:
    """What a failed write must leave as it was: the retention and its marks, since, upper,
    the log's entries (version, commit kind, id) and the rows."""
    shard = ps.open_shard(location, maintenance=False)
    state = shard.inspect.state()
    history = [(h["version"], h["commit"], h["id"]) for h in shard.inspect.history()]
    rows_now = sorted(tuple(sorted(r.items())) for r in shard.snapshot().to_pylist())
    return state.retention, state.retention_marks, state.since, state.upper, history, rows_now


def new_entries(location: str, version: int) -> list[dict[str, Any]]:
    return [h for h in ps.open_shard(location).inspect.history() if h["version"] > version]


def options(location: str, **more: str) -> dict[str, str]:
    return {"path": location, "compact": "false", "maintenance": "false", **more}


def batch_write(location: str, ids: Any, *, overwrite: bool = False, **more: str) -> None:
    """One batch write as Spark runs it: the driver's writer, one task, commit (or abort when
    the task raised)."""
    writer = PersistShardDataSource(options(location, **more)).writer(SCHEMA, overwrite)
    try:
        message = writer.write(iter([rows(ids)]) if isinstance(ids, list) else ids)
    except Boom:
        writer.abort([None])
        raise
    writer.commit([message])


def stream_write(
    location: str, batch_id: int, ids: Any, *, complete: bool = False, **more: str
) -> None:
    """One micro-batch as Spark runs it: the sink's writer, one task, commit (or abort)."""
    opts = options(location, writer_id="w", **more)
    sink = PersistShardDataSource(opts).streamWriter(SCHEMA, complete)
    batches = iter([rows(ids)]) if isinstance(ids, list) else ids
    try:
        if "key_columns" in opts:
            message = upsert_stream_task(opts, SCHEMA, batches, batch_id, "q")
        elif "remap" in opts:
            shard = ps.open_shard(location)
            d = describe_write(sink.opts, SCHEMA, False, shard)
            bindings = ps.open_remap(opts["remap"]).pinned()
            message = reclock.reclock_task(d, sink.reclock, batches, bindings)
        else:
            from persistshard.datasource.sinks import stream_task

            message = stream_task(sink.opts, SCHEMA, complete, batches, batch_id, "q")
    except Boom:
        sink.abort([None], batch_id)
        raise
    sink.commit([message], batch_id)


def reclocked(location: str, tmp_path, ids: list[int]) -> dict[str, str]:
    """Options of a reclocked write of records ``("t:0", id)`` (a remap shard beside)."""
    frontier = json.dumps({"t:0": max(ids) + 1})
    return {"remap": str(tmp_path / "remap"), "source_frontier": frontier}


RECLOCK_SCHEMA = StructType(
    [
        StructField("partition", StringType()),
        StructField("offset", LongType()),
        StructField("v", StringType()),
    ]
)


def reclock_rows(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "partition": pa.array(["t:0"] * len(ids), pa.string()),
            "offset": pa.array(ids, pa.int64()),
            "v": pa.array([f"v{i}" for i in ids], pa.string()),
        }
    )


#: Every write path (but the reclocked ones: tested on their own), writing ``ids`` with
#: options ``more`` into the shard at a location.
PATHS: dict[str, Any] = {
    "append": lambda loc, ids, **more: batch_write(loc, ids, **more),
    "overwrite": lambda loc, ids, **more: batch_write(loc, ids, overwrite=True, **more),
    "upsert": lambda loc, ids, **more: batch_write(loc, ids, key_columns="id", **more),
    "stream-append": lambda loc, ids, **more: stream_write(loc, 0, ids, **more),
    "stream-complete": lambda loc, ids, **more: stream_write(loc, 0, ids, complete=True, **more),
    "stream-upsert": lambda loc, ids, **more: stream_write(loc, 0, ids, key_columns="id", **more),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_write_whose_task_raises_leaves_the_retention_as_it_was(location, path):
    before = look(location)
    with pytest.raises(Boom):
        PATHS[path](location, failing([7, 8]), retention="7d")
    assert look(location) == before


# --- batch writes -----------------------------------------------------------------------------


@pytest.mark.parametrize("overwrite", [False, True], ids=["append", "overwrite"])
def test_a_batch_write_sets_the_retention_with_its_data(location, overwrite):
    version = ps.open_shard(location).inspect.state().version
    batch_write(location, [7], overwrite=overwrite, retention="7d")
    (entry,) = new_entries(location, version)
    assert entry["commit"] == "append_set_retention"
    assert entry["kind"] == ("overwrite" if overwrite else "append")
    assert entry["summary"].endswith("; also set the retention to 7d"), entry["summary"]
    shard = ps.open_shard(location)
    assert shard.inspect.retention() == WEEK
    ids = sorted(r["id"] for r in shard.snapshot().to_pylist())
    assert ids == ([7] if overwrite else [1, 2, 3, 7])


def test_a_batch_write_whose_retention_is_the_stored_one_changes_nothing_about_it(location):
    before = look(location)
    version = ps.open_shard(location).inspect.state().version
    batch_write(location, [7], retention="1h")
    (entry,) = new_entries(location, version)
    assert entry["commit"] == "append" and "retention" not in entry["summary"]
    after = look(location)
    assert after[0] == before[0] == Retention(ms=3_600_000)
    assert after[1][:-1] == before[1]  # one mark more, for the new upper, as any append


def test_a_batch_write_clears_the_retention_with_none(location):
    batch_write(location, [7], retention="none")
    shard = ps.open_shard(location)
    assert shard.inspect.retention() is None
    assert shard.inspect.history()[-1]["summary"].endswith("; also cleared the retention")


@pytest.mark.parametrize(
    ("overwrite", "more", "error"),
    [
        (False, {"time_column": "nope"}, InvalidOption),  # an option naming no column
        (False, {"upper": "1"}, InvalidOption),  # an upper below the shard's
        (True, {"time_column": "id"}, InvalidUpdates),  # an overwrite takes no time column
        (True, {"remap": "elsewhere"}, InvalidOption),  # an overwrite takes no remap
        (False, {"key_columns": "id", "time_column": "id"}, InvalidOption),  # an upsert's
        (True, {"key_columns": "id"}, InvalidOption),  # an upsert does not overwrite
    ],
    ids=[
        "append-bad-time-column",
        "append-upper-below",
        "overwrite-time-column",
        "overwrite-remap",
        "upsert-time-column",
        "upsert-overwrite",
    ],
)
def test_a_refused_batch_write_leaves_the_retention_as_it_was(location, overwrite, more, error):
    before = look(location)
    with pytest.raises(error):
        batch_write(location, [7], overwrite=overwrite, retention="7d", **more)
    assert look(location) == before


def test_a_batch_write_of_refused_columns_leaves_the_retention_as_it_was(location):
    before = look(location)
    other = StructType([StructField("id", StringType()), StructField("v", StringType())])
    with pytest.raises(InvalidUpdates):
        PersistShardDataSource(options(location, retention="7d")).writer(other, False)
    assert look(location) == before
    # A SQL table whose columns dropped one of the shard's (`check_table_columns`).
    table = options(location, retention="7d", **{TABLE_KEY: "t"})
    dropped = StructType([StructField("id", LongType())])
    with pytest.raises(InvalidOption, match="no longer include the shard's column v"):
        PersistShardDataSource(table).writer(dropped, False)
    assert look(location) == before


def test_a_batch_write_refused_at_its_commit_leaves_the_retention_as_it_was(location):
    """An ``expected_upper`` another writer moved: `UpperMismatch` at the commit; the only
    new entry is the other writer's."""
    version = ps.open_shard(location).inspect.state().version
    writer = PersistShardDataSource(options(location, retention="7d", expected_upper="3")).writer(
        SCHEMA, False
    )
    message = writer.write(iter([rows([7])]))
    ps.open_shard(location).append(pa.table({"id": pa.array([9], pa.int64()), "v": ["v9"]}))
    before = look(location)
    with pytest.raises(UpperMismatch):
        writer.commit([message])
    assert look(location) == before
    assert [h["commit"] for h in new_entries(location, version)] == ["append"]
    assert before[0] == Retention(ms=3_600_000)


def test_an_upsert_sets_the_retention_with_its_data(location):
    version = ps.open_shard(location).inspect.state().version
    batch_write(location, [2, 7], key_columns="id", retention="2 versions")
    (entry,) = new_entries(location, version)
    assert (entry["commit"], entry["kind"]) == ("append_set_retention", "upsert")
    assert ps.open_shard(location).inspect.retention() == Retention(versions=2)


def test_a_reclocked_batch_write_sets_the_retention_with_its_data(tmp_path):
    loc = str(tmp_path / "r")
    version = 0
    opts = options(loc, retention="7d", **reclocked(loc, tmp_path, [0, 1]))
    writer = PersistShardDataSource(opts).writer(RECLOCK_SCHEMA, False)
    writer.commit([writer.write(iter([reclock_rows([0, 1])]))])
    (entry,) = new_entries(loc, version)
    assert entry["commit"] == "append_set_retention"
    assert ps.open_shard(loc).inspect.retention() == WEEK
    # A task that raises: nothing changes (the remap shard may have bound, the output not).
    before = look(loc)
    opts = options(loc, retention="2 versions", **reclocked(loc, tmp_path, [2, 3]))
    writer = PersistShardDataSource(opts).writer(RECLOCK_SCHEMA, False)

    def broken() -> Any:
        yield reclock_rows([2])
        raise Boom("a UDF raised")

    with pytest.raises(Boom):
        writer.write(broken())
    writer.abort([None])
    assert look(loc) == before


# --- streaming writes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("complete", "more", "kind"),
    [
        (False, {}, "stream append"),
        (True, {}, "overwrite"),
        (False, {"key_columns": "id"}, "upsert"),
    ],
    ids=["append", "complete", "upsert"],
)
def test_a_micro_batch_sets_the_retention_with_its_data(location, complete, more, kind):
    version = ps.open_shard(location).inspect.state().version
    stream_write(location, 0, [7], complete=complete, retention="7d", **more)
    (entry,) = new_entries(location, version)
    assert (entry["commit"], entry["kind"]) == ("append_set_retention", kind)
    assert ps.open_shard(location).inspect.retention() == WEEK
    # The next micro-batch finds it set: a plain commit.
    version = ps.open_shard(location).inspect.state().version
    stream_write(location, 1, [7, 8], complete=complete, retention="7d", **more)
    (entry,) = new_entries(location, version)
    assert entry["commit"] == "append"
    # A replayed micro-batch commits nothing, and sets nothing either.
    before = look(location)
    stream_write(location, 1, [7, 8], complete=complete, retention="2 versions", **more)
    assert look(location) == before


@pytest.mark.parametrize(
    ("complete", "more", "error"),
    [
        (False, {"writer_id": ""}, InvalidOption),  # no writer id (empty: refused)
        (True, {"remap": "elsewhere"}, InvalidOption),  # complete mode takes no remap
        (True, {"key_columns": "id"}, InvalidOption),  # an upsert stream is not complete
        (False, {"key_columns": "id", "upper": "9"}, InvalidOption),  # an upsert's
    ],
    ids=["no-writer-id", "complete-remap", "complete-upsert", "upsert-upper"],
)
def test_a_refused_stream_leaves_the_retention_as_it_was(location, complete, more, error):
    before = look(location)
    opts = {**options(location, retention="7d"), **more}
    if not opts.get("writer_id"):
        opts.pop("writer_id", None)
    with pytest.raises(error):
        PersistShardDataSource(opts).streamWriter(SCHEMA, complete)
    assert look(location) == before


def test_a_reclocked_micro_batch_sets_the_retention_with_its_data(tmp_path):
    loc = str(tmp_path / "r")
    more = reclocked(loc, tmp_path, [0, 1])
    opts = options(loc, writer_id="w", retention="7d", **more)
    sink = PersistShardDataSource(opts).streamWriter(RECLOCK_SCHEMA, False)
    d = describe_write(sink.opts, RECLOCK_SCHEMA, False, ps.open_shard(loc))
    bindings = ps.open_remap(more["remap"]).pinned()
    message = reclock.reclock_task(d, sink.reclock, iter([reclock_rows([0, 1])]), bindings)
    sink.commit([message], 0)
    (entry,) = new_entries(loc, 0)
    assert entry["commit"] == "append_set_retention"
    assert ps.open_shard(loc).inspect.retention() == WEEK


# --- writes that commit nothing, or nothing but the upper -------------------------------------


def test_a_write_of_no_rows_sets_the_retention_with_the_seal_it_commits(location):
    """A batch write of no rows still commits (the upper moves by one: a seal), and its
    retention lands with that commit."""
    version = ps.open_shard(location).inspect.state().version
    batch_write(location, [], retention="7d")
    (entry,) = new_entries(location, version)
    assert (entry["commit"], entry["kind"]) == ("append_set_retention", "seal")
    assert ps.open_shard(location).inspect.retention() == WEEK


def test_a_reclocked_write_with_nothing_to_seal_sets_nothing(tmp_path):
    """A reclocked write whose records bind nothing new commits nothing to its output: its
    retention waits for a write that commits, as Delta sets table properties only with a
    commit."""
    loc = str(tmp_path / "r")
    more = reclocked(loc, tmp_path, [0])
    writer = PersistShardDataSource(options(loc, **more)).writer(RECLOCK_SCHEMA, False)
    writer.commit([writer.write(iter([reclock_rows([0])]))])
    before = look(loc)
    opts = options(loc, retention="7d", remap=more["remap"], source_frontier="{}")
    writer = PersistShardDataSource(opts).writer(RECLOCK_SCHEMA, False)
    writer.commit([writer.write(iter([reclock_rows([])]))])
    assert look(loc) == before
    assert before[0] is None
