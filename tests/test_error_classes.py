"""Which class each refusal is (issue 37, item 4): `InvalidUpdates` for bad data only,
`InvalidOption` for options and arguments (malformed, out of range, or contradicting the
shard), `NoShard` for a location without a shard, `StorageError` for the storage; four of
them are also the built-in their case belongs to.

Each case here was `InvalidUpdates` before and had no test (the others are tested where
their feature is); every message starts with the class name and nothing is written."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard import errors
from persistshard.core.remap import open_remap
from persistshard.core.shard import Shard
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.leases import renew
from persistshard.core.statemachine.state import Batch
from persistshard.core.storage.layout import new_id
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
    with pytest.raises(LookupError, match=r"^NoShard: "):
        ps.open_shard("/nonexistent/persistshard/never-written").snapshot()


@pytest.fixture
def shard(tmp_path) -> Shard:
    s = ps.open_shard(str(tmp_path / "s"))
    s.compare_and_append(pa.table({"id": [1, 2], "_time": [0, 1], "_diff": [1, 1]}), 0, 2)
    s.upsert(pa.table({"id": [3]}), "id")
    return s


def below_expected_upper(shard: Shard, tmp_path: Any) -> None:
    shard.compare_and_append(pa.table({"id": [9], "_time": [3], "_diff": [1]}), 3, 2)


def append_commit_backwards(shard: Shard, tmp_path: Any) -> None:
    """The commit's own check (a caller that builds the commit by hand)."""
    shard._machine.commit(Append(3, 2, Batch("w", 3, 2, ()), id=new_id()))


def write_lease_not_positive(shard: Shard, tmp_path: Any) -> None:
    renew(shard._machine, "w", -1.0)


def updates_range_backwards(shard: Shard, tmp_path: Any) -> None:
    shard.updates(2, 1)


def follow_since_without_outputs(shard: Shard, tmp_path: Any) -> None:
    open_remap(str(tmp_path / "remap")).follow_since([])


def part_chunk_bytes(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), chunk_bytes=0)


def part_compression_level(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), compression_level=30)


def part_sort_column(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), sort_column="nope")


def part_metadata(shard: Shard, tmp_path: Any) -> None:
    PartWriter(io.BytesIO(), pa.schema([("id", pa.int64())]), metadata={"k": 1})  # type: ignore[dict-item]


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


# --- the Spark paths' checks, called as Spark's driver calls them (no JVM needed) ------------

ROWS = "id BIGINT, v STRING"


def _spark_schema(ddl: str = ROWS) -> Any:
    """A Spark schema from ``name TYPE, ...`` (BIGINT and STRING only), built without a JVM."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {"BIGINT": LongType(), "STRING": StringType()}
    pairs = [column.split() for column in ddl.split(",")]
    return StructType([StructField(name, types[kind]) for name, kind in pairs])


def read_updates_past_upper(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.options import ReadOptions
    from persistshard.datasource.reader import check_query

    opts = ReadOptions.parse({"path": shard.location, "updates_from": "9"})
    check_query(shard, shard.inspect.state(), opts)


def time_column_unknown(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.options import WriteOptions
    from persistshard.datasource.writer import describe_write

    opts = WriteOptions.parse({"path": shard.location, "time_column": "ts"})
    describe_write(opts, _spark_schema(), False, shard)


def upper_below_lower(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.options import WriteOptions
    from persistshard.datasource.writer import describe_write

    opts = WriteOptions.parse({"path": shard.location, "upper": "1"})
    describe_write(opts, _spark_schema(), False, shard)


def reclock_with_time_column(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.options import WriteOptions
    from persistshard.datasource.reclock import spec_of

    remap = str(tmp_path / "remap")
    opts = WriteOptions.parse({"path": shard.location, "remap": remap, "time_column": "id"})
    spec_of(opts, _spark_schema("id BIGINT, partition STRING, offset BIGINT"), shard.location)


def upsert_batch_id_not_a_number(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.upsert import plan_upsert

    options = {"path": shard.location, "key_columns": "id", "writer_id": "w", "batch_id": "x"}
    plan_upsert(options, _spark_schema("id BIGINT"), False, streaming=False)


def table_with_a_password(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.source import PersistShardDataSource

    consensus = "postgresql://u:secret@localhost/db"
    PersistShardDataSource({"location": shard.location, "consensus": consensus}).schema()


def table_with_storage_options(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.source import PersistShardDataSource

    options = {"location": shard.location, "storage.anon": "true"}
    PersistShardDataSource(options).schema()


def new_table_without_columns(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.source import PersistShardDataSource

    PersistShardDataSource({"location": str(tmp_path / "empty")}).schema()


def columns_for_an_existing_shard(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.source import PersistShardDataSource

    PersistShardDataSource({"location": shard.location, "columns": "id BIGINT"}).schema()


def where_on_a_stream(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.source import PersistShardDataSource

    options = {"path": shard.location, "where": "id = 1"}
    PersistShardDataSource(options).streamReader(_spark_schema("id BIGINT"))


def stream_task_outside_a_stream(shard: Shard, tmp_path: Any) -> None:
    from persistshard.datasource.replay import task_batch_id

    task_batch_id()


def log_source_without_a_path(shard: Shard, tmp_path: Any) -> None:
    from persistshard.conformance.logsource import LogStreamReader

    LogStreamReader({})


def log_topic_with_a_colon(shard: Shard, tmp_path: Any) -> None:
    from persistshard.conformance.logsource import append_records

    append_records(str(tmp_path / "log"), "a:b", 0, pa.table({"v": [1]}))


def log_starting_offsets_not_json(shard: Shard, tmp_path: Any) -> None:
    from persistshard.conformance.logsource import parse_starting_offsets

    parse_starting_offsets("{not json", str(tmp_path / "log"))


def log_starting_offsets_not_an_object(shard: Shard, tmp_path: Any) -> None:
    from persistshard.conformance.logsource import parse_starting_offsets

    parse_starting_offsets("[1]", str(tmp_path / "log"))


def log_starting_offsets_negative(shard: Shard, tmp_path: Any) -> None:
    from persistshard.conformance.logsource import parse_starting_offsets

    parse_starting_offsets('{"t-0": -1}', str(tmp_path / "log"))


#: name -> (trigger, a fragment of the message, whether the message names the shard)
OPTIONS: dict[str, tuple[Callable[[Shard, Any], None], str, bool]] = {
    "below_expected_upper": (below_expected_upper, "below the expected upper 3", True),
    "append_commit_backwards": (append_commit_backwards, "new upper 2 is below", True),
    "write_lease_not_positive": (write_lease_not_positive, "lease_seconds must be", False),
    "updates_range_backwards": (updates_range_backwards, "updates_from 2 is after", True),
    "follow_since_without_outputs": (follow_since_without_outputs, "needs every output", False),
    "part_chunk_bytes": (part_chunk_bytes, "chunk_bytes must be positive", False),
    "part_compression_level": (part_compression_level, "compression_level must be in", False),
    "part_sort_column": (part_sort_column, "sort column 'nope' is not in", False),
    "part_metadata": (part_metadata, "part metadata must map str to str", False),
    "read_updates_past_upper": (read_updates_past_upper, "updates_from 9 is after", True),
    "time_column_unknown": (time_column_unknown, "option time_column names column 'ts'", True),
    "upper_below_lower": (upper_below_lower, "option upper 1 is below the write's lower", True),
    "reclock_with_time_column": (reclock_with_time_column, "takes no time_column", True),
    "upsert_batch_id_not_a_number": (upsert_batch_id_not_a_number, "batch_id must be", True),
    "table_with_a_password": (table_with_a_password, "consensus URL with a password", True),
    "table_with_storage_options": (table_with_storage_options, "(anon) are refused", True),
    "new_table_without_columns": (new_table_without_columns, "give the new table its", False),
    "columns_for_an_existing_shard": (columns_for_an_existing_shard, "already has columns", True),
    "where_on_a_stream": (where_on_a_stream, "applies to batch reads only", False),
    "stream_task_outside_a_stream": (stream_task_outside_a_stream, "without a batch id", False),
    "log_source_without_a_path": (log_source_without_a_path, "needs a directory", False),
    "log_topic_with_a_colon": (log_topic_with_a_colon, "must be non-empty and have no", False),
    "log_starting_offsets_not_json": (log_starting_offsets_not_json, "is not 'earliest'", False),
    "log_starting_offsets_not_an_object": (log_starting_offsets_not_an_object, "a JSON obj", False),
    "log_starting_offsets_negative": (log_starting_offsets_negative, "has offset -1", False),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_bad_options_and_arguments_are_invalid_option(shard, tmp_path, name):
    trigger, fragment, names_shard = OPTIONS[name]
    before = ps.open_shard(shard.location).inspect.state()
    with pytest.raises(errors.InvalidOption) as info:
        trigger(shard, tmp_path)
    err = info.value
    assert not isinstance(err, errors.InvalidUpdates)
    assert isinstance(err, ValueError)
    assert str(err).startswith("InvalidOption: "), str(err)
    assert fragment in str(err), str(err)
    if names_shard:
        assert shard.location in str(err) or "(shard " in str(err), str(err)
    assert ps.open_shard(shard.location).inspect.state() == before, f"{name} changed the shard"
