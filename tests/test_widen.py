"""A written column whose type converts to the shard's stored type without loss for every value
of the written type is cast to the stored type before anything is written
(`persistshard.core.write.validate.widens`); anything else is refused as retyped. The part
files carry the stored types, so readers see no difference. Without Spark."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.storage.parts import read_part
from persistshard.core.write.validate import widens
from persistshard.errors import InvalidUpdates

UTC = dt.UTC


def _part_schemas(shard: Any) -> list[pa.Schema]:
    state = shard.inspect.state()
    return [read_part(shard._blob, p).schema for p in state.parts()]


def _state(shard: Any) -> tuple[Any, ...]:
    """What a refused write must leave as it was: the upper, the history and the parts."""
    return shard.upper, shard.history(), sorted(p.key for p in shard.inspect.state().parts())


def _user(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if not f.name.startswith("_")])


def test_lossless_columns_are_cast_to_the_stored_types(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0)
    stored = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("ts", pa.timestamp("ns", tz="UTC")),
            pa.field("x", pa.float64()),
            pa.field("s", pa.string()),
            pa.field("d", pa.decimal128(12, 2)),
        ]
    )
    shard.append(
        pa.table(
            {
                "id": pa.array([1], pa.int64()),
                "ts": pa.array([1_000_000_001], pa.timestamp("ns", tz="UTC")),
                "x": pa.array([0.1], pa.float64()),
                "s": pa.array(["a"], pa.large_string()),
                "d": pa.array([Decimal("0.01")], pa.decimal128(12, 2)),
            }
        )
    )
    assert shard.schema == stored
    big = 2**31 - 1
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    shard.append(
        pa.table(
            {
                "id": pa.array([big, -big - 1], pa.int32()),
                "ts": pa.array([when, None], pa.timestamp("us", tz="UTC")),
                "x": pa.array([1.5, 3.25], pa.float32()),
                "s": pa.array(["b", "c"], pa.string()),
                "d": pa.array([Decimal("12345.67"), Decimal("-0.01")], pa.decimal128(7, 2)),
            }
        )
    )
    shard.append(
        pa.table(
            {
                "ts": pa.array([when], pa.timestamp("s", tz="Europe/Paris")),
                "id": pa.array([7], pa.uint16()),
                "x": pa.array([2.0], pa.float32()),
                "s": pa.array(["d"], pa.large_string()),
                "d": pa.array([Decimal("0.05")], pa.decimal128(12, 2)),
            }
        )
    )
    got = shard.snapshot()
    assert _user(got.schema) == stored
    rows = sorted(got.to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["x"], r["s"]) for r in rows] == [
        (-big - 1, 3.25, "c"),
        (1, 0.1, "a"),
        (7, 2.0, "d"),
        (big, 1.5, "b"),
    ]
    ts = got.sort_by("id").column("ts").cast(pa.int64()).to_pylist()
    assert ts == [None, 1_000_000_001, 1714979289_000_000_000, 1714979289_123456_000]
    assert [str(r["d"]) for r in rows] == ["-0.01", "0.01", "0.05", "12345.67"]
    for schema in _part_schemas(shard):
        assert _user(schema) == stored, schema


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        (pa.int8(), pa.int16()),
        (pa.int16(), pa.int32()),
        (pa.int32(), pa.int64()),
        (pa.uint8(), pa.int16()),
        (pa.uint16(), pa.int32()),
        (pa.uint32(), pa.int64()),
        (pa.uint8(), pa.uint64()),
        (pa.float16(), pa.float32()),
        (pa.float32(), pa.float64()),
        (pa.string(), pa.large_string()),
        (pa.large_binary(), pa.binary()),
        (pa.decimal128(5, 2), pa.decimal128(20, 2)),
        (pa.decimal128(5, 2), pa.decimal256(40, 2)),
        (pa.date32(), pa.date64()),
        (pa.timestamp("s"), pa.timestamp("ms")),
        (pa.timestamp("us"), pa.timestamp("ns")),
        (pa.timestamp("ms", tz="UTC"), pa.timestamp("ns", tz="UTC")),
        (pa.timestamp("us", tz="Asia/Tokyo"), pa.timestamp("ns", tz="UTC")),
    ],
)
def test_widenings(written, stored):
    assert widens(written, stored)


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        (pa.int64(), pa.int32()),
        (pa.int32(), pa.uint64()),  # a negative value has no unsigned form
        (pa.uint32(), pa.int32()),
        (pa.uint64(), pa.int64()),
        (pa.float64(), pa.float32()),
        (pa.int32(), pa.float64()),  # another kind: refused, not converted
        (pa.int32(), pa.string()),
        (pa.decimal128(20, 2), pa.decimal128(10, 2)),
        (pa.decimal128(10, 2), pa.decimal128(20, 3)),  # another scale
        (pa.date64(), pa.date32()),
        (pa.timestamp("ns"), pa.timestamp("us")),
        (pa.timestamp("us"), pa.timestamp("ns", tz="UTC")),  # naive into zoned
        (pa.timestamp("us", tz="UTC"), pa.timestamp("ns")),  # zoned into naive
        (pa.list_(pa.int32()), pa.list_(pa.int64())),  # nested types: only equal ones
        (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.int64())])),
    ],
)
def test_everything_else_is_not_a_widening(written, stored):
    assert not widens(written, stored)


@pytest.mark.parametrize(
    ("values", "written", "stored"),
    [
        ([dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32(), pa.date64()),
        ([0.5, -65504.0], pa.float16(), pa.float32()),
        ([Decimal("-999.99"), Decimal("1.25")], pa.decimal128(5, 2), pa.decimal256(40, 2)),
        ([0, 2**32 - 1], pa.uint32(), pa.int64()),
        ([-(2**7), 2**7 - 1], pa.int8(), pa.int16()),
        ([b"\x00", b"xy"], pa.binary(), pa.large_binary()),
    ],
)
def test_values_read_back_exactly_with_the_stored_type(tmp_path, values, written, stored):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(pa.table({"c": pa.array([values[0]], stored)}))
    stored = shard.schema.field("c").type  # its normal form (large_binary: binary)
    shard.append(pa.table({"c": pa.array(values, written)}))
    got = shard.snapshot()
    assert got.schema.field("c").type == stored
    rows = [r["c"] for r in got.to_pylist() for _ in range(r["_diff"])]
    assert sorted(rows) == sorted([values[0], *values])


def test_narrowing_is_refused_listing_every_retyped_column(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(
        pa.table(
            {
                "n": pa.array([1], pa.int32()),
                "t": pa.array([1], pa.timestamp("us")),
                "z": pa.array([1], pa.timestamp("us", tz="UTC")),
                "ok": pa.array([1], pa.int64()),
            }
        )
    )
    before = _state(shard)
    with pytest.raises(InvalidUpdates) as e:
        shard.append(
            pa.table(
                {
                    "n": pa.array([1], pa.int64()),
                    "t": pa.array([1], pa.timestamp("ns")),
                    "z": pa.array([1], pa.timestamp("us")),
                    "ok": pa.array([1], pa.int32()),
                }
            )
        )
    text = str(e.value)
    assert text.startswith("InvalidUpdates: "), text
    assert str(tmp_path / "s") in text, text
    assert (
        "retyped: n is int64, the shard has int32; t is timestamp[ns], the shard has "
        "timestamp[us]; z is timestamp[us], the shard has timestamp[us, tz=UTC]"
    ) in text, text
    assert "ok " not in text.split("retyped:")[1], text  # int32 into int64 is cast, not listed
    assert _state(shard) == before


def test_a_timestamp_beyond_the_stored_unit_is_refused_and_nothing_is_written(tmp_path):
    loc = str(tmp_path / "s")
    shard = ps.open_shard(loc, inline_bytes=0)
    shard.append(pa.table({"id": [1], "ts": pa.array([5], pa.timestamp("ns"))}))
    before = _state(shard)
    late = dt.datetime(2300, 1, 2, 3, 4, 5)
    with pytest.raises(InvalidUpdates) as e:
        shard.append(
            pa.table(
                {
                    "id": [2, 3, 4],
                    "ts": pa.array([dt.datetime(2000, 1, 1), late, None], pa.timestamp("us")),
                }
            )
        )
    text = str(e.value)
    assert text.startswith("InvalidUpdates: "), text
    assert loc in text, text
    assert "column ts" in text and "2300-01-02 03:04:05" in text, text
    assert "timestamp[ns]" in text, text
    assert _state(shard) == before
    assert ps.open_shard(loc).gc(dry_run=True, retention_seconds=0).orphaned_parts == []


def test_upsert_keys_written_narrower_replace_the_stored_rows(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    keys = [1_000_000_000, 2_000_000_000, 3_000_000_000]
    shard.upsert(
        pa.table(
            {
                "ts": pa.array(keys, pa.timestamp("ns")),
                "id": pa.array([1, 2, 3], pa.int64()),
                "v": ["a", "b", "c"],
            }
        ),
        "ts",
    )
    shard.upsert(
        pa.table(
            {
                "ts": pa.array([2_000_000, 4_000_000], pa.timestamp("us")),
                "id": pa.array([20, 40], pa.int32()),
                "v": ["B", "D"],
            }
        ),
        "ts",
    )
    got = shard.snapshot()
    assert _user(got.schema).field("ts").type == pa.timestamp("ns")
    got = got.set_column(0, "ts", got.column("ts").cast(pa.int64()))
    assert sorted((r["ts"], r["id"], r["v"], r["_diff"]) for r in got.to_pylist()) == [
        (1_000_000_000, 1, "a", 1),
        (2_000_000_000, 20, "B", 1),
        (3_000_000_000, 3, "c", 1),
        (4_000_000_000, 40, "D", 1),
    ]
    shard.upsert(pa.table({"ts": pa.array([1], pa.timestamp("s")), "id": [9], "v": ["A"]}), "ts")
    assert sorted(r["v"] for r in shard.snapshot().to_pylist()) == ["A", "B", "D", "c"]


def test_compare_and_append_with_times_casts_too(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(pa.table({"id": pa.array([1], pa.int64()), "_time": [0], "_diff": [1]}))
    shard.compare_and_append(
        pa.table({"id": pa.array([1, 2], pa.int8()), "_time": [1, 2], "_diff": [-1, 1]}),
        expected_upper=1,
        new_upper=3,
    )
    got = shard.updates(0, 3)
    assert got.schema.field("id").type == pa.int64()
    assert got.to_pylist() == [
        {"id": 1, "_time": 0, "_diff": 1},
        {"id": 1, "_time": 1, "_diff": -1},
        {"id": 2, "_time": 2, "_diff": 1},
    ]


def test_merge_schema_keeps_a_new_columns_written_type(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(pa.table({"id": pa.array([1], pa.int64())}))
    from persistshard.core.write.validate import evolve_schema

    evolved = evolve_schema(
        shard.schema,
        pa.schema([pa.field("id", pa.int32()), pa.field("n", pa.int32())]),
        shard.location,
    )
    assert evolved == pa.schema([pa.field("id", pa.int64()), pa.field("n", pa.int32())])
