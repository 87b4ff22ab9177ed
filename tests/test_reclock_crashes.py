"""Reclocking under crashes, without Spark: a randomized model of a query feeding two outputs.

The model plays Spark's part: an offset log per query (the checkpoint: the micro-batch range is
recorded before the batch runs, its end committed after), tasks that each reclock a slice of
the batch (`reclock_task`), and a driver commit per output (`commit_reclocked`), the two outputs
written one after the other as ``foreachBatch`` does. Crashes are injected at the issue's three
points: after the remap commit and before the data commit, after output 1's data commit and
before output 2's, and in the middle of a task. After a crash the query restarts either from
its checkpoint (the same micro-batch again) or with the checkpoint deleted, from the outputs'
resumption frontier. Expected: whatever the schedule, both outputs end with every source record
exactly once, at the same into-times, and no part file is left behind.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.core.remap import join
from persistshard.datasource import reclock
from persistshard.datasource.options import WriteOptions
from persistshard.datasource.writer import describe_write, sweep_write

SCHEMA = StructType(
    [
        StructField("partition", StringType()),
        StructField("offset", LongType()),
        StructField("v", StringType()),
    ]
)
PARTITIONS = ("t:0", "t:1", "t:2")


class Crash(Exception):
    """An injected crash."""


class Source:
    """Append-only partition logs in memory; record ``(p, o)`` has value ``"p/o"``."""

    def __init__(self) -> None:
        self.ends = dict.fromkeys(PARTITIONS, 0)

    def append(self, rng: random.Random) -> None:
        for p in PARTITIONS:
            self.ends[p] += rng.randint(0, 6)

    def records(self, start: dict[str, int], end: dict[str, int]) -> list[tuple[str, int]]:
        return [(p, o) for p in PARTITIONS for o in range(start.get(p, 0), end.get(p, 0))]


def write_output(
    location, remap, records, whole, crash: str | None, rng, options: dict | None = None
) -> None:
    """One batch write with reclocking of ``records`` into ``location`` (2 or 3 tasks);
    ``options`` are more write options (over ``compact`` false)."""
    opts = WriteOptions.parse(
        {
            "path": location,
            "remap": remap,
            "source_frontier": json.dumps(whole),
            "compact": "false",
            **(options or {}),
        }
    )
    shard = ps.open_shard(location)
    d = describe_write(opts, SCHEMA, False, shard)
    spec = reclock.spec_of(opts, SCHEMA, location)
    bindings = ps.open_remap(remap).pinned()
    rng.shuffle(records)
    tasks = rng.randint(1, 3)
    messages = []
    for i in range(tasks):
        mine = records[i::tasks]
        batch = pa.record_batch(
            {
                "partition": pa.array([p for p, _ in mine], pa.string()),
                "offset": pa.array([o for _, o in mine], pa.int64()),
                "v": pa.array([f"{p}/{o}" for p, o in mine], pa.string()),
            }
        )

        def batches(batch=batch, fail=(crash == "task" and i == tasks - 1)):
            half = batch.num_rows // 2
            yield batch.slice(0, half)
            if fail:
                raise Crash("in the middle of a task")
            yield batch.slice(half)

        try:
            messages.append(reclock.reclock_task(d, spec, batches(), bindings))
        except Crash:
            sweep_write(shard, d.write_id, set())  # what Spark's abort() does for the job
            raise
    reclock.commit_reclocked(d, spec, messages, compact=opts.compact, maintenance=opts.maintenance)


def run_batch(outputs, remap, source, start, end, crash, rng) -> None:
    """One micro-batch into both outputs (even offsets to output 0, odd to output 1)."""
    records = source.records(start, end)
    whole = join(*({p: o + 1} for p, o in records))
    for index, location in enumerate(outputs):
        point = crash[1] if crash is not None and crash[0] == index else None

        def hook(name: str, point=point) -> None:
            if name == point:
                raise Crash(name)

        reclock.CRASH_HOOK = hook
        try:
            mine = [(p, o) for p, o in records if o % 2 == index]
            write_output(location, remap, mine, whole, point, rng)
        finally:
            reclock.CRASH_HOOK = None


@pytest.mark.parametrize("seed", range(16))
def test_random_crashes_converge_to_exactly_once(tmp_path, seed):
    rng = random.Random(seed)
    remap = str(tmp_path / "remap")
    outputs = [str(tmp_path / "even"), str(tmp_path / "odd")]
    source = Source()
    checkpoint: dict[str, object] = {"committed": {}, "pending": None}
    crashes = restarts = 0
    for _ in range(10):
        source.append(rng)
        if checkpoint["pending"] is not None:
            start, end = checkpoint["pending"]  # Spark replays the recorded range
        else:
            start = checkpoint["committed"]
            available = dict(source.ends)
            end = {p: rng.randint(start.get(p, 0), available[p]) for p in PARTITIONS}
            # A restarted query reads at least to what the remap shard has bound (documented).
            end = join(end, ps.open_remap(remap).pinned().frontier)
            checkpoint["pending"] = (start, end)
        crash = None
        if rng.random() < 0.5:
            crash = (
                rng.randint(0, 1),
                rng.choice(["after_remap_commit", "after_data_commit", "task"]),
            )
        try:
            run_batch(outputs, remap, source, start, end, crash, rng)
        except Crash:
            crashes += 1
            if rng.random() < 0.5:  # the checkpoint is deleted: restart from the outputs
                restarts += 1
                resume = ps.resume_frontier(remap, outputs)
                checkpoint = {"committed": resume, "pending": None}
            continue
        checkpoint = {"committed": end, "pending": None}
    # Catch up with everything, no more crashes.
    if checkpoint["pending"] is not None:
        start, end = checkpoint["pending"]
        run_batch(outputs, remap, source, start, end, None, rng)
        checkpoint = {"committed": end, "pending": None}
    run_batch(outputs, remap, source, checkpoint["committed"], dict(source.ends), None, rng)

    shards = [ps.open_shard(o) for o in outputs]
    bindings = ps.open_remap(remap).bindings()
    assert bindings[-1][1] == {p: n for p, n in source.ends.items() if n}
    for index, shard in enumerate(shards):
        got = Counter({r["v"]: r["_diff"] for r in shard.snapshot().to_pylist()})
        want = Counter(f"{p}/{o}" for p, o in source.records({}, source.ends) if o % 2 == index)
        assert got == want, (
            f"output {index} (seed {seed}, {crashes} crashes, {restarts} without checkpoint)"
        )
        assert shard.upper == bindings[-1][0] + 1
        assert {
            m.key for m in shard._blob.list("parts/")
        } == shard.inspect.state().stored_part_keys()
        for t, frontier in bindings:
            prefix = Counter(f"{p}/{o}" for p, o in source.records({}, frontier) if o % 2 == index)
            assert Counter({r["v"]: r["_diff"] for r in shard.snapshot(t).to_pylist()}) == prefix


def test_a_batch_behind_the_remap_is_refused_not_sealed_short(tmp_path):
    """A write that holds rows bound at an into-time whose frontier it did not read entirely
    (another minter ran ahead) is refused with NotSealed; nothing is written."""
    remap = str(tmp_path / "remap")
    out = str(tmp_path / "out")
    rng = random.Random(0)
    rmp = ps.open_remap(remap)
    rmp.mint({"t:0": 2, "t:1": 2})
    rmp.mint({"t:0": 4, "t:1": 9})  # t:1 bound far beyond what the write below reads
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: this write holds rows at into-time 1"):
        write_output(out, remap, [("t:0", 0), ("t:0", 3), ("t:1", 0)], {}, None, rng)
    shard = ps.open_shard(out)
    assert shard.upper == 0 and list(shard._blob.list("parts/")) == []
    # Reading the whole bound stretch makes it sealable.
    records = [(p, o) for p, n in (("t:0", 4), ("t:1", 9)) for o in range(n)]
    write_output(out, remap, records, {}, None, rng)
    assert shard.upper == 2 and len(shard.snapshot().to_pylist()) == 13


def test_reclocked_writes_honour_the_maintenance_option(tmp_path):
    """A reclocked write's driver runs the after-commit maintenance only when the write
    option ``maintenance`` is on, as a plain write's does: eight batches with it off leave
    the due merge alone; the next, with it on, runs it."""
    remap = str(tmp_path / "remap")
    out = str(tmp_path / "out")
    rng = random.Random(1)
    quiet = {"compact": "true", "maintenance": "false"}
    for n in range(8):
        write_output(out, remap, [("t:0", n)], {"t:0": n + 1}, None, rng, quiet)
    assert len(ps.open_shard(out).inspect.state().trace) == 8
    write_output(out, remap, [("t:0", 8)], {"t:0": 9}, None, rng, {"compact": "true"})
    state = ps.open_shard(out).inspect.state()
    assert len(state.trace) <= 2 and state.upper == 9
