"""Checks of the parts a commit names when they come from elsewhere (issue 36, item 7): Spark
task messages committed on the driver, and external callers' `WrittenUpdates`. Every stored
part is present with its recorded size, and its update times lie inside its batch (sealed:
``[lower, new_upper)``, unsealed: ``>= new_upper``); otherwise the commit is refused with a
clear error and nothing changes. The check lists each write directory once
(`persistshard.core.storage.parts.check_parts`)."""

from __future__ import annotations

import os
import threading
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.shard import WrittenUpdates
from persistshard.core.statemachine.state import PartRef
from persistshard.core.storage.blob import Blob, BlobMeta, BlobWrapper
from persistshard.core.storage.layout import new_id
from persistshard.core.storage.parts import check_parts, write_parts
from persistshard.errors import CorruptData, InvalidUpdates

SCHEMA = pa.schema([("id", pa.int64())])


def _updates(ids: list[int], time: int) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "_time": pa.array(np.full(n, time), pa.int64()),
            "_diff": pa.array(np.ones(n), pa.int64()),
        }
    )


def _written(shard: ps.Shard, ids: list[int], time: int, write_id: str | None = None) -> list:
    return write_parts(shard._blob, write_id or new_id(), _updates(ids, time), config=shard.config)


def _path(shard: ps.Shard, ref: PartRef) -> str:
    return shard.location[len("file://") :] + "/" + ref.key


@pytest.fixture
def shard(tmp_path):
    s = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    s.compare_and_append(_updates([1], 0), 0, 1)
    return s


# --- the external entry: Shard.commit_checked ---------------------------------------------


def test_a_missing_part_is_refused_naming_it_and_nothing_changes(shard):
    parts = _written(shard, [2, 3], 1)
    os.remove(_path(shard, parts[0]))
    before = shard.inspect.state()
    with pytest.raises(CorruptData, match=rf"part {parts[0].key} .*missing") as e:
        shard.commit_checked(
            WrittenUpdates(sealed=parts), expected_upper=1, new_upper=2, schema=SCHEMA
        )
    assert e.value.file == parts[0].key and "refused" in str(e.value)
    assert shard.inspect.state().version == before.version and shard.upper == 1


def test_a_part_of_another_size_is_refused(shard):
    parts = _written(shard, [2, 3], 1)
    with open(_path(shard, parts[0]), "ab") as f:
        f.write(b"x")
    with pytest.raises(CorruptData, match=rf"part {parts[0].key} has {parts[0].size + 1} bytes"):
        shard.commit_checked(
            WrittenUpdates(sealed=parts), expected_upper=1, new_upper=2, schema=SCHEMA
        )
    short = replace(_written(shard, [4], 1)[0], size=10**6)  # the record says more bytes
    with pytest.raises(CorruptData, match="the commit records 1000000"):
        shard.commit_checked(
            WrittenUpdates(sealed=[short]), expected_upper=1, new_upper=2, schema=SCHEMA
        )
    assert shard.upper == 1 and shard.snapshot().num_rows == 1


@pytest.mark.parametrize(
    "case",
    ["sealed below lower", "sealed at new upper", "unsealed below new upper", "recorded wrong"],
)
def test_parts_whose_times_lie_outside_their_batch_are_refused(shard, case):
    shard.compare_and_append(_updates([5], 1), 1, 3)  # upper 3
    written = WrittenUpdates()
    if case == "sealed below lower":  # a task that wrote at a stale upper
        written.sealed = _written(shard, [2], 1)
    elif case == "sealed at new upper":
        written.sealed = _written(shard, [2], 5)
    elif case == "unsealed below new upper":
        written.unsealed = _written(shard, [2], 4)
    else:  # the bytes hold time 3 but the record claims time 9: the record is checked
        written.sealed = [replace(_written(shard, [2], 3)[0], min_time=3, max_time=9)]
    before = shard.inspect.state().version
    with pytest.raises(InvalidUpdates, match=r"part parts/.* times .* outside"):
        shard.commit_checked(written, expected_upper=3, new_upper=5, schema=SCHEMA)
    assert shard.inspect.state().version == before


def test_good_parts_commit_and_read(shard):
    sealed = _written(shard, [2, 3], 1) + _written(shard, [4], 2)
    unsealed = _written(shard, [9], 7)
    shard.commit_checked(
        WrittenUpdates(sealed=sealed, unsealed=unsealed),
        expected_upper=1,
        new_upper=3,
        schema=SCHEMA,
    )
    assert shard.upper == 3 and shard.snapshot()["id"].to_pylist() == [1, 2, 3, 4]
    shard.seal(8)
    assert shard.snapshot()["id"].to_pylist() == [1, 2, 3, 4, 9]


def test_inline_parts_need_no_listing_but_their_times_are_checked(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=4096)
    shard.append(_updates([1], 0))
    (ref,) = write_parts(
        shard._blob, new_id(), _updates([2], 1), config=shard.config, inline_max=4096
    )
    assert ref.inline is not None
    with pytest.raises(InvalidUpdates, match="outside"):
        shard.commit_checked(
            WrittenUpdates(sealed=[ref]), expected_upper=1, new_upper=1, schema=SCHEMA
        )
    shard.commit_checked(WrittenUpdates(sealed=[ref]), expected_upper=1, new_upper=2, schema=SCHEMA)
    assert shard.snapshot()["id"].to_pylist() == [1, 2]


# --- the check itself: one listing per write directory, in parallel -----------------------


class Recording(BlobWrapper):
    """Counts the requests a check makes, by kind and prefix."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.lists: list[str] = []
        self.others = 0
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def list(self, prefix: str = "") -> list[BlobMeta]:
        with self._lock:
            self.lists.append(prefix)
            self.threads.add(threading.get_ident())
        return super().list(prefix)

    def size(self, key: str) -> int | None:
        self.others += 1
        return super().size(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.others += 1
        return super().get_range(key, offset, length)


def test_one_listing_per_write_directory_and_nothing_else(shard):
    ids = [new_id() for _ in range(3)]
    refs = [p for i, w in enumerate(ids) for p in _written(shard, [10 * i, 10 * i + 1], 1, w)]
    refs += [p for w in ids for p in _written(shard, [100], 1, w)]  # more parts per directory
    blob = Recording(shard._blob)
    check_parts(blob, [(refs, 1, 2)], location=shard.location)
    assert sorted(blob.lists) == sorted(f"parts/{w}/" for w in ids) and blob.others == 0
    os.remove(_path(shard, refs[-1]))
    with pytest.raises(CorruptData, match=refs[-1].key):
        check_parts(Recording(shard._blob), [(refs, 1, 2)], location=shard.location)


def test_a_listing_the_storage_refuses_is_a_storage_error(shard):
    class Refusing(BlobWrapper):
        def list(self, prefix: str = "") -> list[BlobMeta]:
            raise PermissionError(13, "Permission denied", prefix)

    with pytest.raises(ps.StorageError, match="PermissionError"):
        check_parts(Refusing(shard._blob), [(_written(shard, [2], 1), 1, 2)], location="x")


# --- the Spark driver's commit (the task side runs here without a Spark session) ------------


def _spark_write(loc: str, ids_per_task: list[list[int]], **options: str):
    """The driver's description of a write and each task's message, as Spark would make them;
    ``options`` are more Spark write options (``inline_bytes="0"``: every part a file)."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import LongType, StructField, StructType

    from persistshard.datasource.options import WriteOptions
    from persistshard.datasource.writer import describe_write, write_task

    schema = StructType([StructField("id", LongType(), False)])
    opts = WriteOptions.parse({"path": loc, **options}, schema)
    shard = opts.address.open(maintenance=False)  # as the sinks open it
    d = describe_write(opts, schema, False, shard)
    messages = [
        write_task(d, [pa.record_batch({"id": pa.array(ids, pa.int64())})], d.lower)
        for ids in ids_per_task
    ]
    return shard, d, messages


@pytest.mark.parametrize("damage", ["missing", "longer", "stale lower"])
def test_a_spark_commit_of_damaged_task_parts_is_refused(tmp_path, damage):
    from persistshard.datasource.writer import commit_write

    loc = str(tmp_path / "s")
    ps.open_shard(loc).append(pa.table({"id": pa.array([0], pa.int64())}))
    shard, d, messages = _spark_write(loc, [[1, 2], [3, 4]], inline_bytes="0")  # files to damage
    victim = messages[1].sealed[0]
    if damage == "missing":
        os.remove(_path(shard, victim))
        expected: type[Exception] = CorruptData
    elif damage == "longer":
        with open(_path(shard, victim), "ab") as f:
            f.write(b"garbage")
        expected = CorruptData
    else:  # tasks that wrote their rows at an older upper than the one committed at
        ps.open_shard(loc).append(pa.table({"id": pa.array([0], pa.int64())}))
        d = replace(d, lower=d.lower + 1)
        expected = InvalidUpdates
    before = shard.inspect.state()
    with pytest.raises(expected, match=victim.key if damage != "stale lower" else "outside"):
        commit_write(d, messages, maintenance=False)
    after = ps.open_shard(loc).inspect.state()
    assert after.version == before.version and after.upper == before.upper
    table = ps.open_shard(loc).snapshot()
    assert table["id"].to_pylist() == [0] and table["_diff"].to_pylist() == [before.upper]


def test_a_spark_commit_of_sound_task_parts_lands(tmp_path):
    from persistshard.datasource.writer import commit_write

    loc = str(tmp_path / "s")
    _, d, messages = _spark_write(loc, [[1, 2], [3, 4]])
    commit_write(d, messages, maintenance=False)
    assert ps.open_shard(loc).snapshot()["id"].to_pylist() == [1, 2, 3, 4]


def test_an_upsert_commit_of_a_staged_part_of_another_size_is_refused(tmp_path):
    """The upsert's staged rows come from tasks too: a staged part whose stored bytes differ
    from the task's report was read as if whole (its tail ignored) and committed."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from persistshard.datasource.upsert import commit_upserts, plan_upsert, stage_task

    loc = str(tmp_path / "s")
    ps.open_shard(loc).append(pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]}))
    schema = StructType([StructField("id", LongType(), False), StructField("v", StringType())])
    _, spec, d = plan_upsert({"path": loc, "key_columns": "id"}, schema, False, streaming=False)
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": ["b", "c"]})
    message = stage_task(d, spec, [batch])
    shard = ps.open_shard(loc)
    with open(_path(shard, message.sealed[0]), "ab") as f:
        f.write(b"tail")
    with pytest.raises(CorruptData, match=message.sealed[0].key):
        commit_upserts(d, spec, [message], staged_ids=[d.write_id], maintenance=False)
    assert shard.snapshot().to_pydict() == {"id": [1], "v": ["a"], "_diff": [1]}
