"""Which class each refusal is (issue 37, item 4): `InvalidUpdates` for bad data only,
`InvalidOption` for options and arguments (malformed, out of range, or contradicting the
shard), `NoShard` for a location without a shard, `StorageError` for the storage; four of
them are also the built-in their case belongs to.

Each case here was `InvalidUpdates` before and had no test of its class; every message
starts with the class name and nothing is written."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard import errors
from persistshard.core.remap import open_remap, resume_frontier
from persistshard.core.shard import Shard
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.holds import ReaderHold
from persistshard.core.statemachine.leases import renew
from persistshard.core.statemachine.state import Batch
from persistshard.core.storage.layout import new_id
from persistshard.core.storage.sqlconsensus import open_consensus
from persistshard.core.upsert import upsert_input
from persistshard.format.part import PartWriter


def test_error_classes_are_the_matching_built_ins():
    """Code written against the built-ins catches ours: a bad option or bad data is a
    `ValueError`, a missing shard a `LookupError`, a storage refusal an `OSError`."""
    assert issubclass(errors.InvalidOption, ValueError)
    assert issubclass(errors.InvalidUpdates, ValueError)
    assert issubclass(errors.NoShard, LookupError)
    assert issubclass(errors.StorageError, OSError)
    for name in errors.__all__:  # and each stays a PersistShardError whose text is its own
        cls = getattr(errors, name)
        assert issubclass(cls, errors.PersistShardError)
    refused = errors.StorageError("cannot write", location="file:///s", cause=None)
    assert str(refused) == "StorageError: cannot write (shard file:///s)"
    assert refused.errno is None and not isinstance(refused, errors.Indeterminate)
    with pytest.raises(LookupError, match="^NoShard: "):
        ps.open_shard("/nonexistent/persistshard/never-written").snapshot()


@pytest.fixture
def shard(tmp_path) -> Shard:
    s = ps.open_shard(str(tmp_path / "s"))
    s.compare_and_append(pa.table({"id": [1, 2], "_time": [0, 1], "_diff": [1, 1]}), 0, 2)
    s.upsert(pa.table({"id": [3]}), "id")
    return s


def below_expected_upper(shard: Shard, tmp_path: Any) -> None:
    shard.compare_and_append(pa.table({"id": [9], "_time": [3], "_diff": [1]}), 3, 2)


def seal_backwards(shard: Shard, tmp_path: Any) -> None:
    shard.seal(1)


def append_commit_backwards(shard: Shard, tmp_path: Any) -> None:
    """The commit's own check (a caller that builds the commit by hand)."""
    shard.machine.commit(Append(3, 2, Batch("w", 3, 2, ()), id=new_id()))


def reader_registered_twice(shard: Shard, tmp_path: Any) -> None:
    shard.register_reader("r")
    shard.register_reader("r")


def reader_id_empty(shard: Shard, tmp_path: Any) -> None:
    ReaderHold.register(shard.machine, "")


def hold_lease_not_positive(shard: Shard, tmp_path: Any) -> None:
    shard.register_reader("r", lease_seconds=0)


def write_lease_not_positive(shard: Shard, tmp_path: Any) -> None:
    renew(shard.machine, "w", -1.0)


def updates_range_backwards(shard: Shard, tmp_path: Any) -> None:
    shard.updates(2, 1)


def key_columns_unknown(shard: Shard, tmp_path: Any) -> None:
    shard.upsert(pa.table({"id": [4]}), "nope")


def key_columns_empty(shard: Shard, tmp_path: Any) -> None:
    shard.upsert(pa.table({"id": [4]}), " , ")


def delete_column_unknown(shard: Shard, tmp_path: Any) -> None:
    upsert_input(pa.table({"id": [4]}), delete_column="gone", location=shard.location)


def foreign_files(shard: Shard, tmp_path: Any) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a shard")
    ps.open_shard(str(tmp_path / "other")).append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))


def not_a_remap_shard(shard: Shard, tmp_path: Any) -> None:
    open_remap(shard.location).bindings()


def resume_without_outputs(shard: Shard, tmp_path: Any) -> None:
    resume_frontier(str(tmp_path / "remap"), [])


def follow_since_without_outputs(shard: Shard, tmp_path: Any) -> None:
    open_remap(str(tmp_path / "remap")).follow_since([])


def consensus_url_unknown(shard: Shard, tmp_path: Any) -> None:
    open_consensus("mysql://db/persist", shard.location)


def sqlite_url_relative_marker(shard: Shard, tmp_path: Any) -> None:
    open_consensus("sqlite://host/file.db", shard.location)


def sqlite_url_in_memory(shard: Shard, tmp_path: Any) -> None:
    open_consensus("sqlite:///:memory:", shard.location)


def part_chunk_bytes(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), chunk_bytes=0)


def part_compression_level(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), compression_level=30)


def part_sort_column(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), sort_column="nope")


def part_metadata(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), metadata={"k": 1})  # type: ignore[dict-item]


#: name -> (trigger, a fragment of the message, whether the message names the shard)
OPTIONS: dict[str, tuple[Callable[[Shard, Any], None], str, bool]] = {
    "below_expected_upper": (below_expected_upper, "below the expected upper 3", True),
    "seal_backwards": (seal_backwards, "cannot seal at 1", True),
    "append_commit_backwards": (append_commit_backwards, "new upper 2 is below", True),
    "reader_registered_twice": (reader_registered_twice, "'r' is already registered", True),
    "reader_id_empty": (reader_id_empty, "a reader id must be a non-empty string", False),
    "hold_lease_not_positive": (hold_lease_not_positive, "lease_seconds must be positive", False),
    "write_lease_not_positive": (write_lease_not_positive, "lease_seconds must be", False),
    "updates_range_backwards": (updates_range_backwards, "updates_from 2 is after", True),
    "key_columns_unknown": (key_columns_unknown, "key column 'nope' is not a column", True),
    "key_columns_empty": (key_columns_empty, "key_columns must name at least one", True),
    "delete_column_unknown": (delete_column_unknown, "delete_column 'gone' is not", True),
    "foreign_files": (foreign_files, "holds files but no shard", True),
    "not_a_remap_shard": (not_a_remap_shard, "is not a remap shard", False),
    "resume_without_outputs": (resume_without_outputs, "needs at least one output", False),
    "follow_since_without_outputs": (follow_since_without_outputs, "needs every output", False),
    "consensus_url_unknown": (consensus_url_unknown, "is no consensus URL", True),
    "sqlite_url_relative_marker": (sqlite_url_relative_marker, "a SQLite URL is", True),
    "sqlite_url_in_memory": (sqlite_url_in_memory, "names no file", True),
    "part_chunk_bytes": (part_chunk_bytes, "chunk_bytes must be positive", False),
    "part_compression_level": (part_compression_level, "compression_level must be in", False),
    "part_sort_column": (part_sort_column, "sort column 'nope' is not in", False),
    "part_metadata": (part_metadata, "part metadata must map str to str", False),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_bad_options_and_arguments_are_invalid_option(shard, tmp_path, name):
    trigger, fragment, names_shard = OPTIONS[name]
    before = ps.open_shard(shard.location).state()
    with pytest.raises(errors.InvalidOption) as info:
        trigger(shard, tmp_path)
    err = info.value
    assert not isinstance(err, errors.InvalidUpdates)
    assert isinstance(err, ValueError)
    assert str(err).startswith("InvalidOption: "), str(err)
    assert fragment in str(err), str(err)
    if names_shard:
        assert shard.location in str(err) or "(shard " in str(err), str(err)
    after = ps.open_shard(shard.location).state()
    if name == "reader_registered_twice":  # the first registration is a commit of its own
        assert after.holds.keys() == {"r"} and after.version == before.version + 1
    else:
        assert after == before, f"{name} changed the shard"


def test_bad_data_stays_invalid_updates(shard):
    """The other side of the line: a refusal of the data itself is still `InvalidUpdates`."""
    for bad in (
        pa.table({"id": [5], "_time": [1], "_diff": [1]}),  # below the upper
        pa.table({"id": [5], "_time": [3], "_diff": [0]}),  # zero diff
        pa.table({"id": ["x"], "_time": [3], "_diff": [1]}),  # wrong column type
    ):
        with pytest.raises(errors.InvalidUpdates) as info:
            shard.compare_and_append(bad, 3, 4)
        assert not isinstance(info.value, errors.InvalidOption)
        assert str(info.value).startswith("InvalidUpdates: ")
    with pytest.raises(errors.InvalidUpdates, match="duplicate key"):
        shard.upsert(pa.table({"id": [7, 7]}), "id")
    assert shard.upper == 3
