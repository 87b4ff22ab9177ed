"""Every option value is used as given or refused with `InvalidOption`: an empty value, a
non-number, zero where a count must be positive, a negative time, a value beyond 64 bits, or
two options that contradict each other never fall back to a default silently (``as_of = ''``
read the latest snapshot, ``max_partitions = 0`` planned 64 partitions)."""

from __future__ import annotations

import pytest

import persistshard as ps
from persistshard.core.config import KNOBS
from persistshard.core.shard import ShardAddress
from persistshard.datasource.options import (
    COMMON_OPTIONS,
    CONFIG_OPTIONS,
    READ_OPTIONS,
    WRITE_OPTIONS,
    ReadOptions,
    WriteOptions,
)
from persistshard.errors import InvalidOption, InvalidUpdates

BASE = {"path": "options-only/shard"}  # parsed only: nothing is opened

#: Integer read options and the smallest value each accepts.
READ_INTS = {
    "as_of": 0,
    "updates_from": 0,
    "updates_to": 0,
    "partition_bytes": 1,
    "max_partitions": 1,
    "min_partitions": 1,
    "reader_lease_seconds": 1,
}
#: Integer write options and the smallest value each accepts.
WRITE_INTS = {"upper": 1, "expected_upper": 0, "memory_budget": 1}
READ_BOOLS = ("with_diff", "changes", "hold")
WRITE_BOOLS = ("compact", "merge_schema", "maintenance")
READ_NAMES = ("reader_id", "consumer")
WRITE_NAMES = ("time_column", "diff_column", "writer_id", "remap")


def test_the_lists_cover_every_option_the_parsers_read():
    """A new option must be added here, with its rules, or this fails."""
    assert set(READ_INTS) | set(READ_BOOLS) | set(READ_NAMES) == READ_OPTIONS - {"where"}
    upsert = {"key_columns", "delete_column", "batch_id"}  # parsed by datasource/upsert.py
    reclock = {"source_partition_column", "source_offset_column", "source_frontier"}
    retention = {"retention"}  # its syntax: tests/test_maintenance_auto.py
    assert (
        set(WRITE_INTS) | set(WRITE_BOOLS) | set(WRITE_NAMES) | upsert | reclock | retention
        == WRITE_OPTIONS
    )
    # The shard's configuration: options of every read and write (see the tests below).
    assert CONFIG_OPTIONS == set(KNOBS) and CONFIG_OPTIONS <= COMMON_OPTIONS


@pytest.mark.parametrize("key", ["inline_bytes", "inline_cap"])
@pytest.mark.parametrize("kind", ["read", "write"])
def test_configuration_options_are_parsed_into_the_configuration(kind, key):
    opts = parse(kind, **{key: "2048", "storage.anon": "true"})
    assert getattr(opts.address.config, key) == 2048
    assert opts.storage_options == {"anon": True}  # the storage options carry nothing else
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} "):
        parse(kind, **{key: "2k"})
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} '-1' must not"):
        parse(kind, **{key: "-1"})


def parse(kind: str, **options: str):
    return (ReadOptions if kind == "read" else WriteOptions).parse({**BASE, **options})


INTS = [("read", k, m) for k, m in READ_INTS.items()] + [
    ("write", k, m) for k, m in WRITE_INTS.items()
]


@pytest.mark.parametrize(("kind", "key", "minimum"), INTS)
@pytest.mark.parametrize("value", ["", "  ", "x", "1.5", "1e3", "10_000", "0x10", "3 4"])
def test_integer_options_refuse_what_is_not_an_integer(kind, key, minimum, value):
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} (is empty|must be)"):
        parse(kind, **{key: value})


@pytest.mark.parametrize(("kind", "key", "minimum"), INTS)
def test_integer_options_refuse_values_out_of_range(kind, key, minimum):
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} must"):
        parse(kind, **{key: str(minimum - 1)})
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} must be at most"):
        parse(kind, **{key: str(1 << 63)})
    assert getattr(parse(kind, **{key: f" {minimum} "}), key) == minimum
    assert getattr(parse(kind, **{key: str((1 << 63) - 1)}), key) == (1 << 63) - 1


def test_as_of_empty_is_refused_not_the_latest_snapshot():
    with pytest.raises(InvalidOption, match=r"^InvalidOption: option as_of is empty \(''\)"):
        parse("read", as_of="")
    assert parse("read").as_of is None  # absent: the latest snapshot


@pytest.mark.parametrize("key", ["max_partitions", "min_partitions", "partition_bytes"])
def test_zero_counts_are_refused_not_replaced_by_the_default(key):
    with pytest.raises(InvalidOption, match=rf"option {key} must be at least 1, got 0"):
        parse("read", **{key: "0"})


def test_zero_memory_budget_and_lease_are_refused():
    with pytest.raises(InvalidOption, match="option memory_budget must be at least 1, got 0"):
        parse("write", memory_budget="0")
    with pytest.raises(InvalidOption, match="reader_lease_seconds must be at least 1, got 0"):
        parse("read", reader_lease_seconds="0")


@pytest.mark.parametrize(
    ("kind", "key"), [("read", k) for k in READ_BOOLS] + [("write", k) for k in WRITE_BOOLS]
)
@pytest.mark.parametrize("value", ["", "maybe", "2", "on"])
def test_boolean_options_refuse_what_is_not_a_boolean(kind, key, value):
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} (is empty|must be)"):
        parse(kind, **{key: value})


@pytest.mark.parametrize(
    ("kind", "key"),
    [("read", k) for k in READ_NAMES]
    + [("write", k) for k in WRITE_NAMES]
    + [("write", "source_partition_column"), ("write", "key_columns")],
)
@pytest.mark.parametrize("value", ["", "   "])
def test_name_options_refuse_an_empty_value(kind, key, value):
    options = {key: value}
    if key == "source_partition_column":
        options["remap"] = "options-only/remap"
    with pytest.raises(InvalidOption, match=rf"^InvalidOption: option {key} is empty"):
        parse(kind, **options)


def test_contradicting_options_are_refused():
    with pytest.raises(InvalidOption, match=r"updates_from \(5\) is above .*updates_to \(2\)"):
        parse("read", updates_from="5", updates_to="2")
    with pytest.raises(InvalidOption, match=r"min_partitions \(8\) is above .*max_partitions"):
        parse("read", min_partitions="8", max_partitions="2")
    with pytest.raises(InvalidOption, match=r"option upper \(3\) must be above .*\(3\)"):
        parse("write", upper="3", expected_upper="3")
    with pytest.raises(InvalidOption, match="as_of cannot be combined"):
        parse("read", as_of="1", updates_to="2")


def test_source_frontier_is_an_option_error():
    with pytest.raises(InvalidOption, match=r"^InvalidOption: option source_frontier is not JSON"):
        parse("write", remap="options-only/remap", source_frontier="{")
    with pytest.raises(InvalidOption, match=r"^InvalidOption: option source_frontier: "):
        parse("write", remap="options-only/remap", source_frontier='{"p": -1}')


def test_valid_values_parse_as_given():
    opts = parse("read", as_of="0", max_partitions="3", min_partitions="2", hold="false")
    assert (opts.as_of, opts.max_partitions, opts.min_partitions, opts.hold) == (0, 3, 2, False)
    w = parse("write", upper="+7", memory_budget="1024", time_column="t")
    assert (w.upper, w.memory_budget, w.time_column) == (7, 1024, "t")


def test_an_option_error_is_not_invalid_updates():
    """The error table keeps bad input data (InvalidUpdates) apart from bad options."""
    assert not issubclass(InvalidOption, InvalidUpdates)
    assert issubclass(InvalidOption, ps.PersistShardError)
    assert ps.InvalidOption is InvalidOption


def test_stream_writer_option_errors(tmp_path):
    """A streaming write without writer_id, or complete mode with remap: option errors."""
    from pyspark.sql.types import LongType, StructField, StructType

    from persistshard.datasource.sinks import PersistShardStreamWriter

    schema = StructType([StructField("id", LongType())])
    location = str(tmp_path / "s")
    with pytest.raises(InvalidOption, match=r"^InvalidOption: a streaming write needs option"):
        PersistShardStreamWriter({"path": location}, schema, False)
    with pytest.raises(InvalidOption, match=r"^InvalidOption: outputMode\('complete'\)"):
        PersistShardStreamWriter(
            {"path": location, "writer_id": "w", "remap": str(tmp_path / "r")}, schema, True
        )


def test_task_descriptions_never_show_storage_secrets():
    """What Spark ships to tasks may end in a log or an error (its repr): no secret in it."""
    import dataclasses

    from persistshard.datasource.overwrite import DiffTask
    from persistshard.datasource.writer import BatchDescription

    for cls in (BatchDescription, DiffTask):
        secret = {"secret": "hunter2"}
        given = {"storage_options": secret, "address": ShardAddress("/x", secret)}
        values = {f.name: given.get(f.name) for f in dataclasses.fields(cls)}
        assert "hunter2" not in repr(cls(**values)), cls.__name__


def test_a_catalog_tables_options_are_taken_by_the_operations_that_know_them():
    """The companion's catalog hands every statement its table's OPTIONS and lists their keys
    (`TABLE_OPTIONS_KEY`): an operation ignores a listed option of another operation (a
    change table's ``changes`` on its INSERTs, a ``retention`` on its SELECTs), and still
    refuses an unlisted one, and a listed key that is no option at all."""
    from persistshard.datasource.options import TABLE_OPTIONS_KEY

    with pytest.raises(InvalidOption, match="unknown option changes for a persistshard write"):
        WriteOptions.parse({**BASE, "changes": "true"})
    with pytest.raises(InvalidOption, match="unknown option retention for a persistshard read"):
        ReadOptions.parse({**BASE, "retention": "7d"})
    write = WriteOptions.parse({**BASE, "changes": "true", TABLE_OPTIONS_KEY: "changes,columns"})
    assert write.location.endswith("options-only/shard")
    read = ReadOptions.parse({**BASE, "retention": "7d", TABLE_OPTIONS_KEY: "retention"})
    assert read.changes is False
    with pytest.raises(InvalidOption, match="unknown option changes for a persistshard write"):
        WriteOptions.parse({**BASE, "changes": "true", TABLE_OPTIONS_KEY: "columns"})
    with pytest.raises(InvalidOption, match="unknown option colums for a persistshard write"):
        WriteOptions.parse({**BASE, "colums": "id BIGINT", TABLE_OPTIONS_KEY: "colums"})
    # A listed read option still means what it says on a read.
    assert ReadOptions.parse({**BASE, "changes": "true", TABLE_OPTIONS_KEY: "changes"}).changes
