"""The error contract: every class in `persistshard.errors` is raised where documented, its
message starts with its class name, and it is determinate (the shard is unchanged) unless it is
`Indeterminate`."""

from __future__ import annotations

from collections.abc import Callable

import fsspec
import pyarrow as pa
import pytest
from conformance_helpers import updates
from fsspec.implementations.memory import MemoryFileSystem

import persistshard as ps
from persistshard import errors
from persistshard.conformance.faults import FaultyBlob
from persistshard.core.shard import write_transaction
from persistshard.core.statemachine.commits.advance_since import AdvanceSince
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.compact import Compact
from persistshard.core.statemachine.state import Batch
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.layout import new_id


class NoAtomicCreate(MemoryFileSystem):
    """An fsspec filesystem whose exclusive create is not atomic (like fsspec's generic one)."""

    protocol = "psnoatomic"


fsspec.register_implementation("psnoatomic", NoAtomicCreate, clobber=True)


def _shard(tmp_path, **options) -> ps.Shard:
    shard = ps.open_shard(str(tmp_path / "s"), **options)
    shard.append(updates([(1, "a", 0, 1), (2, "b", 0, 1)]))
    shard.append(updates([(1, "a", 1, -1)]))
    return shard


def upper_mismatch(shard: ps.Shard, tmp_path) -> None:
    shard.compare_and_append(updates([(3, "c", 9, 1)]), 7, 10)


def since_violation(shard: ps.Shard, tmp_path) -> None:
    shard.advance_since(1)
    shard.snapshot(0)


def not_sealed(shard: ps.Shard, tmp_path) -> None:
    shard.snapshot(5)


def invalid_updates(shard: ps.Shard, tmp_path) -> None:
    bad = pa.table({"id": [3], "item": ["c"], "_time": pa.array([None], pa.int64()), "_diff": [1]})
    shard.append(bad)


def corrupt_data(shard: ps.Shard, tmp_path) -> None:
    key = shard.inspect.state().trace[0].parts[0].key
    data = bytearray(shard._blob.get(key) or b"")
    data[len(data) // 3] ^= 0xFF
    shard._blob.put(key, bytes(data))
    ps.open_shard(shard.location).snapshot()


def storage_unsupported(shard: ps.Shard, tmp_path) -> None:
    ps.open_shard(f"psnoatomic://{new_id()}").append(updates([(1, "a", 0, 1)]))


def indeterminate(shard: ps.Shard, tmp_path) -> None:
    """Every storage call after the first attempt fails: whether the commit landed is unknown."""
    blob = FaultyBlob(Blob(shard.location), fail_before=0.0, fail_after=0.0, seed=1)
    faulty = ps.Shard(shard.location, blob=blob)
    faulty.inspect.state()
    real_put_if_absent = blob.put_if_absent

    def fail_after_create(key: str, data: bytes) -> bool:
        real_put_if_absent(key, data)
        blob.fail_before = 1.0  # and from now on nothing can be read back
        raise TimeoutError("injected: created, but the reply was lost")

    blob.put_if_absent = fail_after_create  # type: ignore[method-assign]
    faulty.advance_since(1)


def state_conflict(shard: ps.Shard, tmp_path) -> None:
    shard._machine.commit(Compact(("no-such-batch",), Batch("out", 0, 1, ()), id=new_id()))


def version_collected(shard: ps.Shard, tmp_path) -> None:
    """A scan pinned to a version that a compaction replaced and gc then collected."""
    import time

    scan = shard.scan()
    shard.compact()
    time.sleep(0.01)  # the replaced version's parts are older than gc's floor
    shard.append(updates([(3, "c", 2, 1)]))
    assert shard.gc(dry_run=False, retention_seconds=0).parts
    scan.to_arrow()


def hold_expired(shard: ps.Shard, tmp_path) -> None:
    hold = shard.register_reader("r")
    hold.expire()
    hold.heartbeat()


def writer_already_committed(shard: ps.Shard, tmp_path) -> None:
    shard._machine.commit(Append(2, 3, Batch("w", 2, 3, ()), writer=("w", 0), id=new_id()))
    shard._machine.commit(Append(3, 4, Batch("w2", 3, 4, ()), writer=("w", 0), id=new_id()))


def lease_expired(shard: ps.Shard, tmp_path) -> None:
    """A write whose id is older than its lease: its commit is refused."""
    from persistshard.core.statemachine import leases

    old_id = f"{new_id()[:12]}"
    old_id = f"{int(old_id, 16) - int(leases.DEFAULT_WRITE_LEASE_SECONDS * 1000) - 1:012x}"
    written = write_transaction(shard, old_id + "0" * 20).write_updates(
        updates([(3, "c", 2, 1)]), lower=2, new_upper=3, schema=None
    )
    write_transaction(shard).commit(written, expected_upper=2, new_upper=3, schema=None)


def commit_deadline(shard: ps.Shard, tmp_path) -> None:
    """Every compare-and-set loses (another writer always got there first)."""
    shard._consensus.compare_and_set = lambda expected, data: False  # type: ignore[method-assign]
    shard._machine.commit(AdvanceSince(1, id=new_id()), deadline_seconds=0.01)


def negative_diff(shard: ps.Shard, tmp_path, spark=None) -> None:
    shard.append(updates([(2, "b", 2, -1), (2, "b", 2, -1)]))
    spark.read.format("persistshard").load(shard.location).collect()


def no_shard(shard: ps.Shard, tmp_path) -> None:
    from persistshard.cli import open_existing

    open_existing(str(tmp_path / "never-written"), {})


def invalid_option(shard: ps.Shard, tmp_path) -> None:
    from persistshard.datasource.options import ReadOptions

    ReadOptions.parse({"path": shard.location, "max_partitions": "0"})


def storage_error(shard: ps.Shard, tmp_path) -> None:
    """A streaming read holds since, a commit: on a location that refuses writes (a read-only
    directory, simulated since the tests may run as root) it is a StorageError."""
    import errno
    from unittest import mock

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from persistshard.core.storage.blob import FsspecBlob
    from persistshard.datasource.stream import PersistShardStreamReader

    def refuse(self, key, data):
        raise PermissionError(errno.EROFS, "Read-only file system", key)

    schema = StructType(
        [StructField(n, t) for n, t in [("id", LongType()), ("item", StringType())]]
        + [StructField(n, LongType(), False) for n in ("_time", "_diff")]
    )
    with (
        mock.patch.object(FsspecBlob, "put", refuse),
        mock.patch.object(FsspecBlob, "put_if_absent", refuse),
    ):
        reader = PersistShardStreamReader({"path": shard.location, "changes": "true"}, schema)
        reader.initialOffset()


TRIGGERS: dict[str, Callable[..., None]] = {
    "UpperMismatch": upper_mismatch,
    "SinceViolation": since_violation,
    "NotSealed": not_sealed,
    "InvalidUpdates": invalid_updates,
    "CorruptData": corrupt_data,
    "StorageUnsupported": storage_unsupported,
    "Indeterminate": indeterminate,
    "StateConflict": state_conflict,
    "VersionCollected": version_collected,
    "HoldExpired": hold_expired,
    "WriterAlreadyCommitted": writer_already_committed,
    "NegativeDiff": negative_diff,
    "NoShard": no_shard,
    "InvalidOption": invalid_option,
    "StorageError": storage_error,
    "LeaseExpired": lease_expired,
    "CommitDeadline": commit_deadline,
}
#: What changes the shard by design before the error (so "unchanged" is judged after it).
CHANGES_FIRST = {
    "SinceViolation",
    "HoldExpired",
    "WriterAlreadyCommitted",
    "NegativeDiff",
    "VersionCollected",
}
#: Triggers that damage or collect part files: their shard writes every part as a file.
PART_FILES = {"CorruptData", "VersionCollected"}


def test_every_error_class_has_a_trigger():
    classes = {n for n in errors.__all__ if n != "PersistShardError"}
    assert classes == set(TRIGGERS)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.PersistShardError), name
        assert getattr(ps, name, getattr(errors, name)) is getattr(errors, name)


@pytest.mark.parametrize(
    "name",
    # NegativeDiff takes the session's Spark through getfixturevalue: no fixture shows it.
    [
        pytest.param(n, marks=pytest.mark.spark) if n == "NegativeDiff" else n
        for n in sorted(TRIGGERS)
    ],
)
def test_raised_where_documented(name, tmp_path, request):
    shard = _shard(tmp_path, **({"inline_bytes": 0} if name in PART_FILES else {}))
    kwargs = {}
    if name == "NegativeDiff":
        kwargs["spark"] = request.getfixturevalue("spark")
    before = shard.inspect.state()
    with pytest.raises(Exception) as info:
        TRIGGERS[name](shard, tmp_path, **kwargs)
    err = info.value
    if name == "NegativeDiff":  # Spark carries the Python error as text
        assert "NegativeDiff: " in str(err)
        return
    assert type(err).__name__ == name, repr(err)
    assert str(err).startswith(f"{name}: "), str(err)
    after = ps.open_shard(shard.location).inspect.state()
    if name == "Indeterminate":
        assert after.version == before.version + 1  # it did land: only the answer was lost
    elif name not in CHANGES_FIRST and name != "CorruptData":
        assert after == before, f"{name} changed the shard"
