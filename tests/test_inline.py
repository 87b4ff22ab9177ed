"""Inline small writes (issue 26, item 2): a small append carries its part in the commit.

Every test here runs at the production defaults of `persistshard.core.storage.parts` (as
the whole suite does), and most fail without the feature: a 1-row append
writes no part file yet reads back through every reader (snapshot, updates, scan, listen,
Spark); over the cap or the threshold the append writes part files; compaction moves inline
data into parts; a reopened shard and a rollup carry the bytes; and a 1-row append costs at
most three store calls on S3 (moto), none with the log in SQLite, except every
`ROLLUP_EVERY`-th version, which also puts the rollup and the head hint.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from conformance_helpers import rows_of, updates

import persistshard as ps
from benchmarks.inline_bench import appends, counting_shard
from persistshard.core.config import ShardConfig
from persistshard.core.storage import layout
from persistshard.core.storage.consensus import HINT_EVERY
from persistshard.errors import InvalidOption


def part_files(shard: ps.Shard) -> list[str]:
    return [m.key for m in shard._blob.list("parts/")]


def one_row(i: int, item: str = "x") -> pa.Table:
    return pa.table({"id": pa.array([i], pa.int64()), "item": [f"{item}{i}"]})


@pytest.fixture
def shard(tmp_path) -> ps.Shard:
    # Maintenance off: these tests look at what an append itself stores (after-commit
    # maintenance moves inline batches into parts; tests/test_maintenance_auto.py has it on).
    return ps.open_shard(str(tmp_path / "s"), maintenance=False)


def test_a_one_row_append_writes_no_part_file_and_reads_back(shard):
    for i in range(3):
        shard.append(one_row(i))
    assert part_files(shard) == []
    state = shard.inspect.state()
    assert all(p.inline is not None for p in state.parts()) and len(state.parts()) == 3
    assert 0 < state.inline_bytes() <= ShardConfig().inline_cap
    want = {(i, f"x{i}"): 1 for i in range(3)}
    assert rows_of(shard.snapshot()) == want
    assert rows_of(shard.updates(0, 3).drop_columns(["_time"])) == want
    assert rows_of(shard.scan(with_diff=True).to_arrow()) == want
    assert rows_of(shard.scan(filter=pa.compute.field("id") >= 1, with_diff=True).to_arrow()) == {
        (1, "x1"): 1,
        (2, "x2"): 1,
    }
    assert rows_of(shard.scan_updates(1, 3).to_arrow().drop_columns(["_time"])) == {
        (1, "x1"): 1,
        (2, "x2"): 1,
    }
    with shard.listen(1, timeout=0.2) as sub:
        got = [(t, f) for t, f in sub]
    assert [f for _, f in got] == [2, 3]
    assert rows_of(got[1][0].drop_columns(["_time"])) == {(2, "x2"): 1}
    report = shard.verify()
    assert report.ok and report.parts_checked == 3
    # a reopened shard reads the bytes from the log
    assert rows_of(ps.open_shard(shard.location).snapshot()) == want


def test_timed_and_unsealed_updates_inline_too(shard):
    shard.compare_and_append(updates([(1, "a", 0, 1), (2, "b", 5, 1)]), 0, 2)
    assert part_files(shard) == []
    assert len(shard.inspect.state().unsealed) == 1
    assert rows_of(shard.snapshot()) == {(1, "a"): 1}
    shard.seal(6)
    assert rows_of(shard.snapshot()) == {(1, "a"): 1, (2, "b"): 1}


def test_a_rollup_carries_the_inline_bytes(shard):
    for i in range(layout.ROLLUP_EVERY + 1):
        shard.append(one_row(i))
    assert part_files(shard) == []
    version = layout.ROLLUP_EVERY
    (key,) = [m.key for m in shard._blob.list("rollups/")]
    rolled = shard._machine.load_rollup(version, key)
    assert sum(p.inline is not None for p in rolled.parts()) == version
    fresh = ps.open_shard(shard.location)  # loads that rollup and one entry
    assert rows_of(fresh.snapshot()) == {(i, f"x{i}"): 1 for i in range(version + 1)}


def test_over_the_threshold_or_the_cap_the_append_writes_part_files(tmp_path):
    big = ps.open_shard(str(tmp_path / "big"))
    rows = 2000
    big.append(pa.table({"id": pa.array(range(rows), pa.int64()), "item": ["y" * 8] * rows}))
    assert len(part_files(big)) == 1 and big.inspect.state().inline_bytes() == 0

    capped = ps.open_shard(str(tmp_path / "capped"), inline_cap=2000)
    for i in range(6):
        capped.append(one_row(i))
    state = capped.inspect.state()
    inline = [p for p in state.parts() if p.inline is not None]
    assert 1 <= len(inline) < 6 and state.inline_bytes() <= 2000
    assert len(part_files(capped)) == 6 - len(inline)
    assert rows_of(capped.snapshot()) == {(i, f"x{i}"): 1 for i in range(6)}

    off = ps.open_shard(str(tmp_path / "off"), inline_bytes=0)
    off.append(one_row(0))
    assert len(part_files(off)) == 1
    with pytest.raises(InvalidOption, match="inline_bytes -1"):
        ps.open_shard(str(tmp_path / "bad"), inline_bytes=-1)


def test_compaction_moves_inline_data_into_parts_and_gc_keeps_it(shard):
    for i in range(5):
        shard.append(one_row(i))
    shard.append(pa.table({"id": pa.array([0], pa.int64()), "item": ["x0"], "_diff": [-1]}))
    assert part_files(shard) == []
    shard.compact()
    state = shard.inspect.state()
    assert state.inline_bytes() == 0 and set(part_files(shard)) == state.part_keys()
    want = {(i, f"x{i}"): 1 for i in range(1, 5)}
    assert rows_of(shard.snapshot()) == want
    report = shard.gc(dry_run=False, retention_seconds=0)
    assert report.orphaned_parts == []
    assert rows_of(ps.open_shard(shard.location).snapshot()) == want
    assert shard.verify().ok


@pytest.mark.spark
def test_spark_appends_inline_and_reads_back(spark, tmp_path):
    """A Spark append with ``inline_bytes`` 4096 (the production default; the suite's
    workers default to 0) inlines its row; one with 0 writes a part file (the driver stores
    what its tasks inlined); a Spark read plans and reads both."""
    location = str(tmp_path / f"spark-{uuid.uuid4().hex[:8]}")
    frame = spark.createDataFrame([(0, "s0")], "id BIGINT, item STRING").coalesce(1)
    frame.write.format("persistshard").mode("append").option("inline_bytes", "4096").save(location)
    shard = ps.open_shard(location)
    assert part_files(shard) == [] and len(shard.inspect.state().parts()) == 1
    writer = frame.write.format("persistshard").mode("append").option("inline_bytes", "0")
    writer.save(location)
    assert len(part_files(shard)) == 1 and len(shard.inspect.state().parts()) == 2
    df = spark.read.format("persistshard").load(location)
    assert sorted(tuple(r) for r in df.collect()) == [(0, "s0"), (0, "s0")]


def _counts(shard: Any, n: int) -> list[int]:
    shard.append(pa.table({"id": pa.array([0], pa.int64())}))  # creates the shard
    calls, _ = appends(shard, n, start=1)
    return calls


def _ok_per_append(calls: list[int], limit: int) -> None:
    """``limit`` calls or fewer per append, except at the rollup versions (+ rollup) and the
    hint versions (+ hint)."""
    for version, n in enumerate(calls, start=2):
        extra = (version % layout.ROLLUP_EVERY == 0) + (version % HINT_EVERY == 0)
        assert n <= limit + extra, f"append at version {version} made {n} store calls: {calls}"


def test_request_count_per_one_row_append_on_s3(s3_options):
    location = f"s3://{BUCKET}/inline-{uuid.uuid4().hex[:8]}"
    calls = _counts(counting_shard(location, **s3_options), layout.ROLLUP_EVERY + 2)
    # put-if-absent the entry (with the row), list the floor; + the hint every 4th, + the
    # rollup every 16th
    _ok_per_append(calls, 2)
    extra = sum(1 for v in range(2, len(calls) + 2) if v % HINT_EVERY == 0) + 1
    assert sum(calls) <= 2 * len(calls) + extra
    before = _counts(counting_shard(f"{location}-before", before=True, **s3_options), 4)
    assert min(before) >= 8  # what the same append cost before (part + two head reads)


def test_request_count_with_the_log_in_sqlite(s3_options, tmp_path):
    location = f"s3://{BUCKET}/inline-sql-{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{tmp_path}/log.db"
    calls = _counts(counting_shard(location, consensus=url, **s3_options), 8)
    assert calls == [0] * 8


BUCKET = "persistshard-inline-test"


@pytest.fixture(scope="module")
def s3_options():
    from persistshard.conformance.s3server import moto_server

    with moto_server(BUCKET, "testing", "testing") as endpoint:
        yield {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }


def test_repair_drops_a_torn_inline_entry(shard, capsys):
    """The bytes of an inline batch live in its log entry: a torn newest entry loses that
    batch only, and `persistshard repair --apply` restores the version before it."""
    from persistshard.cli import main

    for i in range(3):
        shard.append(one_row(i))
    name = shard._consensus.entry_name(3)
    path = shard.location[len("file://") :] + "/" + name
    with open(path, "r+b") as f:
        f.truncate(40)
    with pytest.raises(ps.CorruptData, match="persistshard repair"):
        ps.open_shard(shard.location).snapshot()
    assert main(["repair", shard.location, "--apply"]) == 0
    capsys.readouterr()
    fresh = ps.open_shard(shard.location)
    assert rows_of(fresh.snapshot()) == {(0, "x0"): 1, (1, "x1"): 1}
    fresh.append(one_row(5))
    assert rows_of(fresh.snapshot()) == {(0, "x0"): 1, (1, "x1"): 1, (5, "x5"): 1}
    assert part_files(fresh) == []
