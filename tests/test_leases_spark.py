"""Write leases on the Spark paths: a job longer than the lease is kept by gc and commits.

The driver of the distributed overwrite and compaction holds its writes' leases (the
process's lease keeper renews them) from the mint to the commit; upsert staging tasks renew
their write's lease while they run; the streaming sinks' commits hold every task's lease and
a long diff or delta renews its own. Without those, each test below fails: gc deletes the
parts of the job (then CorruptData, or the commit refused with LeaseExpired).

The unit tests drive the process's clock by hand (the ``process_clock`` fixture: the Spark
paths open their shards themselves, on the default clock) and play the Spark tasks
and the driver in this process, with gc running "meanwhile": time passes in steps of ten
minutes, each step renews the leases that are due (`leases.renew_due`, what the keeper
thread does) and runs gc. One test runs a real distributed overwrite on the session's
Spark, with the lease shortened to two seconds in this (the driver's) process and gc running in
a thread while a task waits, past the lease, for gc to have had its chance.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from conformance_helpers import Clock, rows_of, updates
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.core.statemachine import leases
from persistshard.core.storage.layout import new_id
from persistshard.core.write import transaction
from persistshard.datasource import compact as spark_compact
from persistshard.datasource import view
from persistshard.datasource.options import WriteOptions
from persistshard.datasource.upsert import commit_upserts, plan_upsert, stage_task
from persistshard.datasource.writer import StreamTaskWritten, describe_write, write_task
from persistshard.errors import LeaseExpired

STEP_MS = 10 * 60 * 1000


@pytest.fixture
def clock(process_clock: Clock) -> Clock:
    """The process's clock: the shards the Spark paths open take no clock of ours."""
    return process_clock


SCHEMA = StructType([StructField("id", LongType()), StructField("item", StringType())])


class Meanwhile:
    """Time passing while a job runs: each step renews what is due, then gc runs (and
    deletes the parts of every write whose lease ran out). Records what gc deleted."""

    def __init__(self, location: str, clock: Clock) -> None:
        self.shard = ps.open_shard(location)
        self.clock = clock
        self.deleted: set[str] = set()
        self.gc_runs = 0

    def hours(self, hours: float) -> None:
        for _ in range(int(hours * 3600 * 1000 // STEP_MS)):
            self.clock.ms += STEP_MS
            leases.renew_due()
            report = self.shard.gc(dry_run=False, now_ms=self.clock.ms)
            self.deleted |= set(report.parts)
            self.gc_runs += 1


def _shard_with_rows(location: str, n: int = 4) -> ps.Shard:
    shard = ps.open_shard(location)
    for t in range(n):
        shard.append(updates([(t, f"x{t}", t, 1)]))
    return shard


class FakeRdd:
    """Just what `persistshard.compact` asks of Spark: parallelize, map, collect. The tasks
    run here, and ``meanwhile`` runs after them, before the results reach the driver."""

    def __init__(self, items: list[Any], meanwhile: Callable[[], None]) -> None:
        self.items, self.meanwhile = items, meanwhile

    def map(self, f: Callable[[Any], Any]) -> FakeRdd:
        return FakeRdd([f(x) for x in self.items], self.meanwhile)

    def collect(self) -> list[Any]:
        self.meanwhile()
        return self.items


class FakeSpark:
    def __init__(self, meanwhile: Callable[[], None]) -> None:
        self.sparkContext = self
        self.meanwhile = meanwhile

    def parallelize(self, items: list[Any], _slices: int) -> FakeRdd:
        return FakeRdd(list(items), self.meanwhile)


def test_distributed_compaction_longer_than_the_lease_commits(tmp_path, clock):
    """Every round's merge tasks take two hours while gc runs; the driver holds each merge's
    lease, so gc keeps the merged parts and every merge commits."""
    location = str(tmp_path / "s")
    shard = _shard_with_rows(location)
    before = rows_of(shard.snapshot())
    meanwhile = Meanwhile(location, clock)
    report = spark_compact.compact(FakeSpark(lambda: meanwhile.hours(2)), location)  # type: ignore[arg-type]
    assert report.merges and all(m.committed for m in report.merges), report
    assert report.conflicts == 0 and meanwhile.gc_runs >= 12
    fresh = ps.open_shard(location)
    assert len(fresh.inspect.state().trace) < 4
    assert rows_of(fresh.snapshot()) == before
    assert not meanwhile.deleted & fresh.inspect.state().part_keys()
    assert fresh.verify().ok


def test_upsert_staging_longer_than_the_lease_commits(tmp_path, clock):
    """Two staging tasks share the write id: the first stages at once, the second runs two
    hours with gc running. The running task renews the write's lease, so the first task's
    staged rows survive to the commit, which applies both."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(updates([(1, "a", 0, 1), (2, "b", 0, 1)]))
    _, spec, d = plan_upsert(
        {"path": location, "key_columns": "id"}, SCHEMA, False, streaming=False
    )
    meanwhile = Meanwhile(location, clock)
    first = stage_task(d, spec, [pa.record_batch({"id": [1], "item": ["A"]})])

    def slow() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"id": [3], "item": ["c"]})
        meanwhile.hours(2)

    second = stage_task(d, spec, slow())
    assert not meanwhile.deleted, "gc deleted staged rows of a running write"
    commit_upserts(d, spec, [first, second], staged_ids=[d.write_id])
    fresh = ps.open_shard(location)
    assert rows_of(fresh.snapshot()) == {(1, "A"): 1, (2, "b"): 1, (3, "c"): 1}
    assert fresh.verify().ok


def _staged_view_task(location: str) -> tuple[WriteOptions, StreamTaskWritten]:
    """One complete-mode micro-batch task, staged (as `PersistShardStreamWriter.write`)."""
    opts = WriteOptions.parse({"path": location, "writer_id": "w"}, SCHEMA)
    shard = ps.open_shard(location)
    d = replace(describe_write(opts, SCHEMA, True, shard), write_id=new_id())
    batch = pa.record_batch({"id": [1, 5], "item": ["a", "e"]})
    out = write_task(d, iter([batch]), d.lower)
    return opts, StreamTaskWritten(
        out.sealed, out.unsealed, out.max_time, out.rows_in, d.lower, d.write_id
    )


def test_complete_mode_diff_longer_than_the_lease_commits(tmp_path, clock, monkeypatch):
    """The micro-batch's diff takes two hours while gc runs: the commit keeps the staged
    task's lease and the diff's own, and the micro-batch commits exactly its output."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(updates([(1, "a", 0, 1), (2, "b", 0, 1)]))
    opts, task = _staged_view_task(location)
    meanwhile = Meanwhile(location, clock)
    real_diff = transaction.diff_parts

    def slow_diff(*args: Any, **kwargs: Any) -> Any:
        out = real_diff(*args, **kwargs)
        meanwhile.hours(2)
        return out

    monkeypatch.setattr(transaction, "diff_parts", slow_diff)
    view.commit_complete(opts, SCHEMA, [task], 0)
    fresh = ps.open_shard(location)
    assert rows_of(fresh.snapshot()) == {(1, "a"): 1, (5, "e"): 1}
    assert fresh.inspect.state().writers == {"w": 0}
    assert not meanwhile.deleted & fresh.inspect.state().part_keys()
    assert fresh.verify().ok


def test_a_staged_task_whose_lease_ran_out_is_refused_not_corrupt(tmp_path, clock):
    """Nobody held the staged task's lease for two hours and gc swept its parts: the commit
    says LeaseExpired (write again) before reading anything, never CorruptData, and the
    shard is unchanged."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(updates([(1, "a", 0, 1)]))
    opts, task = _staged_view_task(location)
    before = shard.inspect.state()
    Meanwhile(location, clock).hours(2)
    with pytest.raises(LeaseExpired, match=task.write_id):
        view.commit_complete(opts, SCHEMA, [task], 0)
    fresh = ps.open_shard(location)
    assert fresh.upper == before.upper and rows_of(fresh.snapshot()) == {(1, "a"): 1}


def test_spark_overwrite_longer_than_the_lease_commits_while_gc_runs(spark, tmp_path, monkeypatch):
    """A real distributed overwrite (two staging tasks), the write lease shortened to two
    seconds on the driver (this process), gc running in a thread all along. One task stages
    at once; the other waits until gc has run past twice the lease after the first task's
    parts appeared. The driver's keeper renews the write's lease, so gc never deletes a part
    of the write and the overwrite commits exactly the DataFrame."""
    lease = 2.0  # the keeper renews with a third of it left: slack for a loaded machine
    monkeypatch.setattr(leases, "DEFAULT_WRITE_LEASE_SECONDS", lease)
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(updates([(1, "a", 0, 1), (99, "gone", 0, 1)]))
    gate = str(tmp_path / "gate")
    done = threading.Event()
    deleted: set[str] = set()
    errors: list[BaseException] = []

    def run_gc() -> None:
        gc_shard = ps.open_shard(location)
        first_seen: float | None = None
        try:
            while not done.is_set():
                report = gc_shard.gc(dry_run=False)
                deleted.update(report.parts)
                referenced = gc_shard.inspect.state().part_keys()
                pending = [m for m in gc_shard._blob.list("parts/") if m.key not in referenced]
                if first_seen is None and pending:
                    first_seen = time.monotonic()
                if first_seen is not None and time.monotonic() > first_seen + 2 * lease:
                    if not os.path.exists(gate):  # gc ran past the lease: let the task go
                        open(gate, "w").close()
                time.sleep(0.1)
        except BaseException as e:  # reported by the test
            errors.append(e)
        finally:
            open(gate, "a").close()  # never leave the task waiting

    def wait_for_gate(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 1:
            deadline = time.monotonic() + 120
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield from batches

    items = "element_at(array('a', 'b', 'c', 'd'), cast(id as int)) as item"
    df = spark.range(1, 5, 1, 2).selectExpr("id", items)  # two partitions, no shuffle
    df = df.mapInArrow(wait_for_gate, df.schema)
    worker = threading.Thread(target=run_gc, daemon=True)
    worker.start()
    try:
        ps.overwrite(spark, df, location, compact=False)
    finally:
        done.set()
        worker.join()
    assert not errors, errors
    assert os.path.exists(gate)
    fresh = ps.open_shard(location)
    assert rows_of(fresh.snapshot()) == {(1, "a"): 1, (2, "b"): 1, (3, "c"): 1, (4, "d"): 1}
    assert not deleted & fresh.inspect.state().part_keys()
    assert fresh.verify().ok
