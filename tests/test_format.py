"""Part format: round trips of every storable type, chunking, projection, statistics, API."""

from __future__ import annotations

import datetime
import decimal
import io
import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistshard.errors import InvalidUpdates
from persistshard.format import FORMAT_VERSION, PartReader, PartWriter, encode_part
from persistshard.format import chunk as chunk_codec
from persistshard.format.testing import assert_exact

NAN_PAYLOAD = np.array([0x7FF8_0000_0000_0123, 0xFFF0_0000_0000_0001], dtype=np.uint64).view(
    np.float64
)
NAN32_PAYLOAD = np.array([0x7FC0_0042], dtype=np.uint32).view(np.float32)


def all_types_table() -> pa.Table:
    """Seven rows of every type Spark can produce (and a few more), nulls in every column."""
    n = 7
    utc = datetime.UTC
    point = pa.struct([("x", pa.int32()), ("tags", pa.list_(pa.string()))])
    cols: dict[str, pa.Array] = {
        "i8": pa.array([1, None, -128, 127, 0, 5, None], pa.int8()),
        "i16": pa.array([1, None, -32768, 32767, 0, 5, 6], pa.int16()),
        "i32": pa.array([None, 2, -(2**31), 2**31 - 1, 0, 5, 6], pa.int32()),
        "i64": pa.array([1, 2, -(2**63), 2**63 - 1, None, 5, 6], pa.int64()),
        "u8": pa.array([1, None, 255, 0, 4, 5, 6], pa.uint8()),
        "u64": pa.array([1, None, 2**64 - 1, 0, 4, 5, 6], pa.uint64()),
        "f16": pa.array(
            np.array([1.5, np.nan, -0.0, 0.0, np.inf, -np.inf, 2], np.float16), pa.float16()
        ),
        "f32": pa.array(
            [1.5, None, -0.0, float(NAN32_PAYLOAD[0]), float("inf"), 3.4e38, 1e-45], pa.float32()
        ),
        "f64": pa.array(
            np.array(
                [NAN_PAYLOAD[0], NAN_PAYLOAD[1], -0.0, 0.0, np.nan, 5e-324, 1.7976931348623157e308]
            ),
            mask=np.array([False, False, False, False, True, False, False]),
        ),
        "dec": pa.array(
            [decimal.Decimal("1.23"), None, decimal.Decimal("-999.99"), decimal.Decimal("0.00")] * 1
            + [None, decimal.Decimal("5.5"), decimal.Decimal("6")],
            pa.decimal128(5, 2),
        ),
        "dec38": pa.array(
            [decimal.Decimal("9" * 28 + "." + "9" * 10), None]
            + [decimal.Decimal(i) for i in range(5)],
            pa.decimal128(38, 10),
        ),
        "dec256": pa.array(
            [decimal.Decimal("-1" + "0" * 60), None, 1, 2, 3, 4, 5], pa.decimal256(76, 0)
        ),
        "s": pa.array(["", None, "héllo", "日本語", "a" * 100, "x", "\x00nul"]),
        "ls": pa.array(["a", "b", None, "", "d", "e", "f"], pa.large_string()),
        "bin": pa.array([b"", None, b"\x00\xff", b"abc", b"d", b"e", b"f"]),
        "lbin": pa.array([b"", None, b"\x00\xff", b"abc", b"d", b"e", b"f"], pa.large_binary()),
        "fbin": pa.array(
            [b"abc", None, b"\x00\x00\x00", b"xyz", b"123", b"456", b"789"], pa.binary(3)
        ),
        "d32": pa.array(
            [datetime.date(2024, 2, 29), None, datetime.date(1, 1, 1)] + [None] * 4, pa.date32()
        ),
        "d64": pa.array([0, None, 86_400_000, -86_400_000, 4, 5, 6], pa.date64()),
        "ts": pa.array([0, None, -1, 2**62, 4, 5, 6], pa.timestamp("us")),
        "tstz": pa.array(
            [datetime.datetime(2024, 1, 1, tzinfo=utc), None] + [None] * 5,
            pa.timestamp("us", tz="UTC"),
        ),
        "tsny": pa.array([1, 2, None, 4, 5, 6, 7], pa.timestamp("ns", tz="America/New_York")),
        "tss": pa.array([1, 2, None, 4, 5, 6, 7], pa.timestamp("s")),
        "tms": pa.array([1, 2, None, 4, 5, 6, 7], pa.timestamp("ms", tz="+05:30")),
        "t32": pa.array([1, None, 3, 4, 5, 6, 7], pa.time32("ms")),
        "t64": pa.array([1, None, 3, 4, 5, 6, 7], pa.time64("ns")),
        "dur": pa.array([1, None, -3, 4, 5, 6, 7], pa.duration("us")),
        "mdn": pa.array(
            [pa.MonthDayNano([1, 2, 3]), None]
            + [pa.MonthDayNano([i, -i, i * 1000]) for i in range(5)],
            pa.month_day_nano_interval(),
        ),
        "b": pa.array([True, None, False, True, True, False, None]),
        "null": pa.nulls(n),
        "list": pa.array([[1, None, 3], None, [], [4], [5, 6], None, [7]], pa.list_(pa.int64())),
        "llist": pa.array(
            [["a"], None, [], [None], ["b", "c"], [], ["d"]], pa.large_list(pa.string())
        ),
        "flist": pa.array(
            [[1.0, -0.0], None, [float("nan"), None], [1, 2], [3, 4], [5, 6], [7, 8]],
            pa.list_(pa.float64(), 2),
        ),
        "struct": pa.array(
            [{"x": 1, "tags": ["a"]}, None, {"x": None, "tags": None}, {"x": 4, "tags": []}]
            + [{"x": 5, "tags": [None]}] * 3,
            point,
        ),
        "map": pa.array(
            [[("a", 1), ("b", None)], None, [], [("c", 3)], [("d", 4)], [("e", 5)], [("a", 1)]],
            pa.map_(pa.string(), pa.int64()),
        ),
        "nested": pa.array(
            [
                [{"k": {"z": [1.5, None]}, "m": [(1, [b"x"])]}],
                None,
                [],
                [None, {"k": None, "m": None}],
                [{"k": {"z": []}, "m": []}],
                [{"k": {"z": None}, "m": [(2, None)]}],
                [None],
            ],
            pa.list_(
                pa.struct(
                    [
                        ("k", pa.struct([("z", pa.list_(pa.float32()))])),
                        ("m", pa.map_(pa.int16(), pa.list_(pa.binary()))),
                    ]
                )
            ),
        ),
        "_time": pa.array([0, 1, 1, 2, 3, 5, 8], pa.int64()),
        "_diff": pa.array([1, -1, 2, 1, 1, -3, 1], pa.int64()),
    }
    if hasattr(pa, "decimal64"):
        cols["dec64"] = pa.array([decimal.Decimal("1.5"), None, 3, 4, 5, 6, 7], pa.decimal64(18, 1))
        cols["dec32"] = pa.array([decimal.Decimal("1.5"), None, 3, 4, 5, 6, 7], pa.decimal32(9, 1))
    table = pa.table(cols)
    fields = [
        f.with_metadata({"comment": f"column {f.name}"}) if f.name in ("i32", "s") else f
        for f in table.schema
    ]
    fields = [f.with_nullable(False) if f.name in ("_time", "_diff") else f for f in fields]
    schema = pa.schema(fields, metadata={"origin": "test", "spark": '{"type":"struct"}'})
    return table.cast(schema)


def roundtrip(table: pa.Table, **kwargs: object) -> tuple[PartReader, pa.Table]:
    data, info = encode_part(table, **kwargs)  # type: ignore[arg-type]
    assert info.size_bytes == len(data)
    assert info.num_rows == table.num_rows
    reader = PartReader.from_bytes("test.part", data)
    reader.verify()
    return reader, reader.read()


@pytest.mark.parametrize("chunk_bytes", [1, 200, 8 << 20])
def test_all_types_round_trip_exactly(chunk_bytes: int) -> None:
    table = all_types_table()
    reader, out = roundtrip(table, chunk_bytes=chunk_bytes)
    assert_exact(out, table)
    assert reader.schema.equals(table.schema, check_metadata=True)
    if chunk_bytes == 1:
        assert len(reader.chunks) == table.num_rows


@pytest.mark.parametrize("offset,length", [(1, 5), (3, 4), (6, 1), (0, 0), (7, 0)])
def test_slices_are_written_from_their_offset(offset: int, length: int) -> None:
    table = all_types_table().slice(offset, length)
    _, out = roundtrip(table, chunk_bytes=300)
    assert_exact(out, table)


def test_bitmaps_at_every_bit_offset() -> None:
    rng = np.random.default_rng(1)
    values = pa.array(rng.random(100) < 0.5, mask=rng.random(100) < 0.3)
    ints = pa.array(rng.integers(0, 9, 100), mask=rng.random(100) < 0.3)
    base = pa.table({"b": values, "i": ints})
    for offset in range(17):
        table = base.slice(offset, 100 - 2 * offset)
        _, out = roundtrip(table, chunk_bytes=40)
        assert_exact(out, table)


def test_many_batches_concatenate_into_chunks() -> None:
    table = all_types_table()
    batches = [b for i in range(table.num_rows) for b in table.slice(i, 1).to_batches()]
    multi = pa.Table.from_batches(batches * 20, schema=table.schema)
    _, out = roundtrip(multi, chunk_bytes=2000)
    assert_exact(out, multi)


def test_nested_children_with_offsets() -> None:
    """List children and struct fields that are themselves slices of larger arrays."""
    child = pa.array(list(range(20)), pa.int64()).slice(5)
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 2, 7], pa.int32()), child)
    fields = pa.StructArray.from_arrays([pa.array(["a", "b", "c", "d", "e"]).slice(2)], names=["s"])
    table = pa.table({"l": lists, "st": fields})
    _, out = roundtrip(table)
    assert_exact(out, table)


def test_big_values_and_many_rows() -> None:
    rng = np.random.default_rng(7)
    n = 50_000
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "v": rng.standard_normal(n),
            "s": pa.array([f"name-{i % 977}" for i in range(n)]),
            "big": pa.array([b"x" * 100_000 if i == 17 else b"" for i in range(n)]),
            "_time": rng.integers(0, 100, n),
            "_diff": np.ones(n, np.int64),
        }
    )
    reader, out = roundtrip(table, chunk_bytes=64 << 10, sort_column="id")
    assert_exact(out, table)
    assert len(reader.chunks) > 10
    big_chunk = [c for c in reader.chunks if c.key_min <= 17 <= c.key_max]
    assert len(big_chunk) == 1 and big_chunk[0].num_rows == 1  # one oversized row, alone
    # every other chunk stays within the byte bound
    start = 0
    for c in reader.chunks:
        if c is not big_chunk[0]:
            assert table.slice(start, c.num_rows).nbytes <= 64 << 10
        start += c.num_rows


def test_chunking_does_not_depend_on_input_batches() -> None:
    rng = np.random.default_rng(3)
    n = 20_000
    table = pa.table(
        {"id": np.arange(n, dtype=np.int64), "s": pa.array([f"v{i}" * (i % 5) for i in range(n)])}
    )
    whole, _ = encode_part(table, chunk_bytes=16 << 10)
    cuts = np.sort(rng.choice(np.arange(1, n), 50, replace=False))
    pieces = [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    sink = io.BytesIO()
    writer = PartWriter(sink, table.schema, chunk_bytes=16 << 10)
    for piece in pieces:
        writer.write(piece)
    writer.close()
    assert sink.getvalue() == whole


def test_encoding_is_deterministic() -> None:
    table = all_types_table()
    assert encode_part(table, chunk_bytes=100)[0] == encode_part(table, chunk_bytes=100)[0]


def test_projection_fetches_and_decompresses_only_named_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 5000
    table = pa.table({f"c{i}": np.arange(n, dtype=np.int64) * (i + 1) for i in range(20)})
    data, _ = encode_part(table, chunk_bytes=64 << 10)
    fetched: list[tuple[int, int]] = []

    def read_range(offset: int, length: int) -> bytes:
        fetched.append((offset, length))
        return data[offset : offset + length]

    reader = PartReader.open("p", len(data), read_range)
    assert fetched == [(0, len(data))] if len(data) <= 64 << 10 else len(fetched) <= 2
    fetched.clear()
    calls: list[int] = []
    real = chunk_codec.decompress

    def counting(buf: object, raw_length: int) -> pa.Buffer:
        calls.append(raw_length)
        return real(buf, raw_length)

    monkeypatch.setattr(chunk_codec, "decompress", counting)
    batch = reader.read_chunk(1, ["c13", "c2"])
    assert batch.schema.names == ["c13", "c2"]
    assert_exact(
        batch,
        table.slice(sum(c.num_rows for c in reader.chunks[:1]), batch.num_rows).select(
            ["c13", "c2"]
        ),
    )
    segs = reader.chunks[1].segments
    assert sorted(fetched) == sorted(
        [(segs[13].offset, segs[13].length), (segs[2].offset, segs[2].length)]
    )
    assert len(calls) == 2
    fetched.clear()
    reader.read_chunk(0, ["c4", "c5", "c6"])  # adjacent segments: one get
    assert fetched == [
        (reader.chunks[0].segments[4].offset, sum(s.length for s in reader.chunks[0].segments[4:7]))
    ]


def test_open_reads_only_the_tail_of_a_large_part() -> None:
    n = 200_000
    table = pa.table({"v": np.random.default_rng(0).standard_normal(n)})
    data, _ = encode_part(table, chunk_bytes=256 << 10)
    assert len(data) > 1 << 20
    fetched: list[tuple[int, int]] = []

    def read_range(offset: int, length: int) -> bytes:
        fetched.append((offset, length))
        return data[offset : offset + length]

    reader = PartReader.open("big", len(data), read_range)
    assert (
        len(fetched) == 1
        and fetched[0][0] + fetched[0][1] == len(data)
        and fetched[0][1] <= 64 << 10
    )
    assert_exact(
        reader.read(chunks=[2]),
        table.slice(sum(c.num_rows for c in reader.chunks[:2]), reader.chunks[2].num_rows),
    )


def test_read_subsets_and_iteration() -> None:
    table = all_types_table()
    reader, _ = roundtrip(table, chunk_bytes=1)
    assert_exact(
        reader.read(["s", "i8"], chunks=[5, 2]),
        pa.concat_tables([table.slice(5, 1), table.slice(2, 1)]).select(["s", "i8"]),
    )
    batches = list(reader.iter_batches(columns=["list"]))
    assert [b.num_rows for b in batches] == [1] * table.num_rows
    empty = reader.read([])
    assert empty.num_rows == table.num_rows and empty.num_columns == 0
    assert reader.read_chunk(3, []).num_rows == 1
    with pytest.raises(KeyError, match="nope"):
        reader.read(["nope"])
    with pytest.raises(IndexError):
        reader.read_chunk(99)


def test_empty_part() -> None:
    table = all_types_table().slice(0, 0)
    reader, out = roundtrip(table, sort_column="i64")
    assert reader.chunks == [] and reader.num_rows == 0
    assert_exact(out, table)
    info = encode_part(table)[1]
    assert (info.num_chunks, info.min_time, info.key_min) == (0, None, None)


def test_metadata_sort_column_and_version() -> None:
    table = all_types_table()
    data, _ = encode_part(table, sort_column="s", metadata={"batch": "b-1", "writer": "w"})
    reader = PartReader.from_bytes("m", data)
    assert reader.metadata == {"batch": "b-1", "writer": "w"}
    assert reader.sort_column == "s"
    assert data[:6] == b"PSPART" and data[-6:] == b"PSPART"
    assert struct.unpack_from("<H", data, 6)[0] == FORMAT_VERSION


def test_chunk_and_part_statistics() -> None:
    table = pa.table(
        {
            "k": pa.array([5, None, 3, 9, None, None, 1, 2], pa.int32()),
            "_time": pa.array([10, 11, 3, 4, 50, 6, 7, 8], pa.int64()),
            "_diff": pa.array([1] * 8, pa.int64()),
        }
    )
    reader, _ = roundtrip(table, sort_column="k", chunk_bytes=1)  # a chunk per row
    assert [c.key_min for c in reader.chunks] == [5, None, 3, 9, None, None, 1, 2]
    assert [c.key_null_count for c in reader.chunks] == [0, 1, 0, 0, 1, 1, 0, 0]
    assert [c.min_time for c in reader.chunks] == [10, 11, 3, 4, 50, 6, 7, 8]
    data, info = encode_part(table, sort_column="k", chunk_bytes=1 << 20)
    c = PartReader.from_bytes("s", data).chunks[0]
    assert (c.key_min, c.key_max, c.key_null_count, c.min_time, c.max_time) == (1, 9, 3, 3, 50)
    assert (info.key_min, info.key_max, info.key_null_count, info.min_time, info.max_time) == (
        1,
        9,
        3,
        3,
        50,
    )
    assert info == PartReader.from_bytes("s", data).info


@pytest.mark.parametrize(
    "column,expected",
    [
        ("s", ("", "日本語")),
        ("bin", (b"", b"f")),
        ("fbin", (b"\x00\x00\x00", b"xyz")),
        ("dec", (decimal.Decimal("-999.99"), decimal.Decimal("6.00"))),
        ("d32", (datetime.date(1, 1, 1), datetime.date(2024, 2, 29))),
        ("ts", (datetime.datetime(1969, 12, 31, 23, 59, 59, 999999), None)),
        ("tstz", (datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),) * 2),
        ("b", (False, True)),
        ("u64", (0, 2**64 - 1)),
        ("dur", (datetime.timedelta(microseconds=-3), datetime.timedelta(microseconds=7))),
        ("f64", (None, None)),
        ("list", (None, None)),
        ("struct", (None, None)),
        ("null", (None, None)),
        ("t64", (None, None)),  # time64[ns]: as_py() would truncate to microseconds
        ("mdn", (None, None)),
    ],
)
def test_key_statistics_per_type(column: str, expected: tuple[object, object]) -> None:
    table = all_types_table()
    if column == "ts":  # 2**62 us is beyond datetime; keep the small values
        table = table.slice(0, 3)
        expected = (expected[0], datetime.datetime(1970, 1, 1))
    data, info = encode_part(table, sort_column=column)
    reader = PartReader.from_bytes("k", data)
    assert (reader.chunks[0].key_min, reader.chunks[0].key_max) == expected
    assert (info.key_min, info.key_max) == expected
    assert reader.chunks[0].key_null_count == table.column(column).null_count


def test_bounds_python_cannot_hold_are_none() -> None:
    table = pa.table({"ts": pa.array([0, 2**62, None], pa.timestamp("us")), "x": [1, 2, 3]})
    data, info = encode_part(table, sort_column="ts", chunk_bytes=1)
    reader = PartReader.from_bytes("t", data)
    reader.verify()
    assert [(c.key_min, c.key_max) for c in reader.chunks] == [
        (datetime.datetime(1970, 1, 1), datetime.datetime(1970, 1, 1)),
        (None, None),  # year 146 thousand: stored in the footer, not representable here
        (None, None),
    ]
    assert [c.key_null_count for c in reader.chunks] == [0, 0, 1]
    assert (info.key_min, info.key_max) == (None, None)
    assert_exact(reader.read(), table)


def test_dictionary_columns_are_stored_decoded() -> None:
    table = pa.table({"d": pa.array(["a", "b", None, "a"]).dictionary_encode(), "i": [1, 2, 3, 4]})
    data, _ = encode_part(table, sort_column="d")
    reader = PartReader.from_bytes("d", data)
    assert reader.schema.field("d").type == pa.string()
    out = reader.read()
    assert out.column("d").to_pylist() == ["a", "b", None, "a"]
    assert reader.chunks[0].key_min == "a"
    # batches may bring other index types, or the decoded values
    sink = io.BytesIO()
    writer = PartWriter(sink, table.schema)
    writer.write(table)
    writer.write(
        table.cast(pa.schema([("d", pa.dictionary(pa.int8(), pa.string())), ("i", pa.int64())]))
    )
    writer.write(table.cast(pa.schema([("d", pa.string()), ("i", pa.int64())])))
    writer.close()
    assert (
        PartReader.from_bytes("d", sink.getvalue()).read().column("d").to_pylist()
        == ["a", "b", None, "a"] * 3
    )


def test_unstorable_types_are_rejected() -> None:
    class Ext(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.int64(), "test.ext")

        def __arrow_ext_serialize__(self) -> bytes:
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> Ext:
            return cls()

    bad = [
        pa.schema([("e", Ext())]),
        pa.schema([("u", pa.dense_union([pa.field("a", pa.int8())]))]),
        pa.schema([("l", pa.list_(pa.field("x", Ext())))]),
        pa.schema([("sv", pa.string_view())]),
        pa.schema([("ree", pa.run_end_encoded(pa.int32(), pa.string()))]),
        pa.schema([("a", pa.int8()), ("a", pa.int8())]),
        pa.schema([("_time", pa.int32())]),
        pa.schema([pa.field("m", pa.int8(), metadata={b"k": b"\xff"})]),
    ]
    for schema in bad:
        with pytest.raises(InvalidUpdates, match=r"^InvalidUpdates: "):
            PartWriter(io.BytesIO(), schema)


def test_bad_input_is_rejected_before_anything_is_written() -> None:
    schema = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), ("_time", pa.int64()), ("_diff", pa.int64())]
    )
    sink = io.BytesIO()
    writer = PartWriter(sink, schema, chunk_bytes=1)
    good = pa.table({"k": [1], "_time": [1], "_diff": [1]}, schema=schema)
    writer.write(good)
    size = sink.tell()
    for bad in (
        pa.table({"k": [None], "_time": [1], "_diff": [1]}),
        pa.table({"k": [1], "_time": [None], "_diff": [1]}),
        pa.table({"k": [1], "_time": [1], "_diff": [None]}),
        pa.table({"k": ["x"], "_time": [1], "_diff": [1]}),
        pa.table({"_time": [1], "k": [1], "_diff": [1]}),
    ):
        with pytest.raises(InvalidUpdates):
            writer.write(bad)
        assert sink.tell() == size
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(good)
    assert PartReader.from_bytes("b", sink.getvalue()).read().num_rows == 1


def test_writer_streams_chunks_to_the_sink() -> None:
    class Recorder(io.BytesIO):
        writes = 0

        def write(self, b: object) -> int:  # type: ignore[override]
            Recorder.writes += 1
            return super().write(b)  # type: ignore[arg-type]

    sink = Recorder()
    schema = pa.schema([("v", pa.int64())])
    writer = PartWriter(sink, schema, chunk_bytes=8 << 10)
    for i in range(20):
        writer.write(pa.table({"v": np.arange(i * 4096, (i + 1) * 4096, dtype=np.int64)}))
    assert sink.tell() > 0 and Recorder.writes > 10  # chunks left before close
    info = writer.close()
    assert info.num_chunks >= 40
    assert_exact(
        PartReader.from_bytes("s", sink.getvalue()).read(),
        pa.table({"v": np.arange(20 * 4096, dtype=np.int64)}),
    )


# ---------------------------------------------------------------------------------------------
# Random tables

_leaf_types = st.sampled_from(
    [
        pa.int64(),
        pa.int8(),
        pa.float64(),
        pa.float32(),
        pa.string(),
        pa.binary(),
        pa.bool_(),
        pa.date32(),
        pa.timestamp("us", tz="UTC"),
        pa.decimal128(12, 3),
        pa.null(),
    ]
)


def _extend(children: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.DataType]:
    return st.one_of(
        children.map(pa.list_),
        children.map(pa.large_list),
        st.lists(children, min_size=1, max_size=3).map(
            lambda ts: pa.struct([(f"f{i}", t) for i, t in enumerate(ts)])
        ),
        children.map(lambda t: pa.map_(pa.string(), t)),
    )


_types = st.recursive(_leaf_types, _extend, max_leaves=4)


def _values(t: pa.DataType) -> st.SearchStrategy[object]:
    if pa.types.is_null(t):
        return st.none()
    if pa.types.is_int64(t):
        base: st.SearchStrategy[object] = st.integers(-(2**63), 2**63 - 1)
    elif pa.types.is_int8(t):
        base = st.integers(-128, 127)
    elif pa.types.is_float64(t):
        base = st.floats(allow_nan=True) | st.sampled_from([float(NAN_PAYLOAD[0]), -0.0])
    elif pa.types.is_float32(t):
        base = st.floats(width=32, allow_nan=True)
    elif pa.types.is_string(t):
        base = st.text(max_size=8)
    elif pa.types.is_binary(t):
        base = st.binary(max_size=8)
    elif pa.types.is_boolean(t):
        base = st.booleans()
    elif pa.types.is_date32(t):
        base = st.dates()
    elif pa.types.is_timestamp(t):
        base = st.integers(-(2**60), 2**60)
    elif pa.types.is_decimal(t):
        base = st.decimals(min_value=-(10**8), max_value=10**8, places=3, allow_nan=False)
    elif pa.types.is_map(t):
        base = st.lists(st.tuples(st.text(max_size=3), _values(t.item_type)), max_size=3)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        base = st.lists(_values(t.value_type), max_size=3)
    else:
        base = st.fixed_dictionaries(
            {t.field(i).name: _values(t.field(i).type) for i in range(t.num_fields)}
        )
    return st.none() | base


@st.composite
def _tables(draw: st.DrawFn) -> pa.Table:
    types = draw(st.lists(_types, min_size=1, max_size=4))
    n = draw(st.integers(0, 30))
    columns = {}
    for i, t in enumerate(types):
        values = draw(st.lists(_values(t), min_size=n, max_size=n))
        columns[f"c{i}"] = pa.array(values, t)
    table = pa.table(columns)
    start = draw(st.integers(0, n))
    return table.slice(start, draw(st.integers(0, n - start)))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=_tables(), chunk_bytes=st.sampled_from([1, 64, 1000, 1 << 20]))
def test_random_tables_round_trip(table: pa.Table, chunk_bytes: int) -> None:
    reader, out = roundtrip(table, chunk_bytes=chunk_bytes, sort_column=table.column_names[0])
    assert_exact(out, table)
    if table.num_rows:
        col = table.column_names[-1]
        assert_exact(reader.read([col]), table.select([col]))


def test_format_imports_neither_spark_nor_core() -> None:
    import ast
    from pathlib import Path

    import persistshard.format as package

    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("pyspark", "persistshard.core")), (
                    f"{path.name} imports {name}"
                )


def test_round_trip_null_typed_struct_field_inside_map():
    """Found by hypothesis in CI: a map whose values are structs with a null-typed field
    (pyarrow cannot make a zero-copy view of it; the comparison falls back to values)."""
    t = pa.table(
        {
            "c3": pa.array(
                [[("", {"f0": None, "f1": None}), ("", {"f0": -0.0, "f1": None})]],
                pa.map_(pa.string(), pa.struct([("f0", pa.float64()), ("f1", pa.null())])),
            )
        }
    )
    data, _ = encode_part(t)
    assert_exact(PartReader.from_bytes("p", data).read(), t)


@pytest.mark.parametrize("t", [pa.int64(), pa.int8(), pa.string(), pa.large_string()])
@pytest.mark.parametrize(
    "raw",
    [
        [1, 5, 0],
        ["a", "b", 2],
        [None, None, 3],
        [None, None, 4],  # more nulls than rows
        [True, False, 0],
        [1.0, 2.0, 0],
        [1, None, 0],
        [1, 2, -1],
        [1, 2, True],
        [1, 2],
        (1, 2, 0),
        "x",
    ],
)
def test_column_stats_checker_agrees_with_the_general_check(t: pa.DataType, raw: object) -> None:
    """The per-type checker footers use gives the same statistics, and rejects the same
    malformed entries, as `check_column_stats`."""
    from persistshard.format import stats

    def outcome(f: Callable[[], object]) -> object:
        try:
            return f()
        except (ValueError, TypeError) as e:
            return type(e)

    general = outcome(lambda: stats.check_column_stats(raw, t, 3))
    fast = outcome(lambda: stats.column_stats_checker(t)(raw, 3))
    assert fast == general


def test_incompressible_columns_are_stored_plain_and_read_in_place() -> None:
    """A column zstd cannot shrink (random doubles) is stored plain (version 3): a footer
    entry of four integers, the payload 8-byte aligned in the file, values not shuffled. Read
    from memory at an aligned address its values are a view of the part's bytes; from a
    misaligned one, an aligned copy; both exact. Compressible columns stay zstd frames."""
    import json as json_module
    import struct as struct_module

    from persistshard.format import PLAIN_ABOVE

    rng = np.random.default_rng(8)
    table = pa.table({"id": np.arange(50_000, dtype=np.int64), "v": rng.random(50_000)})
    data, _ = encode_part(table, sort_column="id", chunk_bytes=200_000)
    footer_len = struct_module.unpack_from("<I", data, len(data) - 16)[0]
    footer = json_module.loads(data[len(data) - 16 - footer_len : len(data) - 16])
    assert footer["version"] == 3 and len(footer["chunks"]) > 1
    for chunk in footer["chunks"]:
        ids, values = chunk["columns"]
        assert len(ids) == 3  # 0, 1, 2, ...: compresses to almost nothing
        assert len(values) == 4 and values[3] == 1 and values[0] - values[1] < 8
        assert values[1] > PLAIN_ABOVE * 8 * chunk["num_rows"]  # stored at about full size
    reader = PartReader.from_bytes("p", data)
    for chunk in reader.chunks:
        assert (
            chunk.segments[1].plain
            and (chunk.segments[1].offset + chunk.segments[1].length - chunk.segments[1].raw_length)
            % 8
            == 0
        )
    aligned = pa.allocate_buffer(len(data))  # Arrow's allocations are 64-byte aligned
    memoryview(aligned).cast("B")[:] = data
    got = PartReader.from_bytes("p", aligned).read()
    assert got.equals(table)
    values = got.column("v").chunk(0).buffers()[1]
    assert aligned.address <= values.address < aligned.address + aligned.size  # in place
    shifted = pa.allocate_buffer(len(data) + 1)
    memoryview(shifted).cast("B")[1:] = data
    odd = shifted.slice(1)
    got = PartReader.from_bytes("p", odd).read()
    assert got.equals(table)
    values = got.column("v").chunk(0).buffers()[1]
    assert values.address % 8 == 0  # copied to an aligned buffer


def test_footers_parse_once_per_process_and_never_from_unchecked_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A footer parsed once is not parsed again when the same checked bytes are opened (every
    read of a shard opens its parts); the remembered parse reads like a fresh one; a footer
    whose bytes changed is checked and parsed anew (or refused), never served from memory."""
    from persistshard.format import part as part_mod

    table = pa.table({"k": pa.array(range(500), pa.int64()), "v": [str(i) for i in range(500)]})
    data, _ = encode_part(table, chunk_bytes=2000, sort_column="k", metadata={"m": "1"})
    parses: list[str] = []
    original = PartReader._parse_footer

    def counting(self: PartReader, footer: dict[str, object]) -> None:
        parses.append(self.name)
        original(self, footer)

    monkeypatch.setattr(PartReader, "_parse_footer", counting)
    first = PartReader.from_bytes("a.part", data)
    again = PartReader.from_bytes("b.part", bytes(data))  # another name, the same bytes
    assert parses == ["a.part"]
    assert again.name == "b.part" and again.size == first.size
    assert again.schema == first.schema and again.chunks == first.chunks
    assert again.info == first.info and again.metadata == {"m": "1"}
    assert again.read().equals(first.read()) and again.read().equals(table)
    again.metadata["m"] = "changed"  # each reader has its own metadata
    assert PartReader.from_bytes("c.part", data).metadata == {"m": "1"}
    # a flipped byte of the footer is refused by its checksum before any lookup
    footer_len = struct.unpack_from("<I", data, len(data) - 16)[0]
    flipped = bytearray(data)
    flipped[len(data) - 16 - footer_len // 2] ^= 0x01
    with pytest.raises(part_mod.CorruptData, match="footer checksum"):
        PartReader.from_bytes("d.part", bytes(flipped))
    other, _ = encode_part(table.slice(1), chunk_bytes=2000, sort_column="k")
    PartReader.from_bytes("e.part", other)
    assert parses == ["a.part", "e.part"]
    monkeypatch.setattr(part_mod._FOOTERS, "entries", 1)
    third, _ = encode_part(table.slice(2), chunk_bytes=2000, sort_column="k")
    PartReader.from_bytes("f.part", third)  # remembered alone: the others are forgotten
    PartReader.from_bytes("g.part", other)
    assert parses == ["a.part", "e.part", "f.part", "g.part"]
    monkeypatch.setattr(part_mod._FOOTERS, "entries", 100)
    monkeypatch.setattr(part_mod._FOOTERS, "total_bytes", 1)  # no footer fits
    PartReader.from_bytes("h.part", data)
    PartReader.from_bytes("i.part", data)
    assert parses[-2:] == ["h.part", "i.part"] and not part_mod._FOOTERS
    assert part_mod._FOOTERS.bytes == 0


@pytest.mark.parametrize("size", [1000, chunk_codec.SMALL_FRAME_BYTES + 8])
def test_decompress_refuses_frames_that_do_not_expand_as_the_footer_says(size: int) -> None:
    """Small frames (this thread's own decompressor) and large ones (Arrow's codec) alike:
    the bytes back when the length matches, `SegmentError` when it does not or when the
    frame is not zstd."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frame = chunk_codec.compress(payload, 1)
    assert chunk_codec.decompress(frame, size).to_pybytes() == payload
    for wrong in (size - 1, size + 1):
        with pytest.raises(chunk_codec.SegmentError):
            chunk_codec.decompress(frame, wrong)
    with pytest.raises(chunk_codec.SegmentError):
        chunk_codec.decompress(b"not a zstd frame at all", size)
