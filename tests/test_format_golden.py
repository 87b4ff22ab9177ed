"""Golden part files: the bytes of format version N are frozen in tests/golden/.

- Each golden file decodes to the table built here (values, schema, statistics).
- Re-encoding that table gives the golden file's bytes, byte for byte. Any change to the
  encoding fails here until FORMAT_VERSION is bumped and new golden files are written:

      .venv/bin/python tests/test_format_golden.py --write

  which refuses to overwrite files of an existing version.
- zstd's output is only stable for a given libzstd version. The structural comparison
  (header, footer, every decompressed payload) is always strict; the byte comparison
  skips, saying why, only when the libzstd version differs from the one recorded in
  tests/golden/zstd-version.txt and the structure is identical.

Never edit the tables below for a version that has golden files: add new ones instead.
"""

from __future__ import annotations

import datetime
import decimal
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import zstandard

from persistshard.format import FORMAT_VERSION, READ_VERSIONS, PartReader, encode_part
from persistshard.format.testing import assert_exact

GOLDEN = Path(__file__).parent / "golden"
ZSTD_RECORD = GOLDEN / "zstd-version.txt"


def types_table() -> pa.Table:
    """Version 1 golden table: a variety of types, nested included, nulls everywhere."""
    nan_bits = np.array([0x7FF8_0000_0000_0ABC], dtype=np.uint64).view(np.float64)[0]
    schema = pa.schema(
        [
            pa.field("k", pa.int64(), nullable=False, metadata={"comment": "the key"}),
            pa.field("s", pa.string()),
            pa.field("f", pa.float64()),
            pa.field("f32", pa.float32()),
            pa.field("dec", pa.decimal128(12, 3)),
            pa.field("bin", pa.binary()),
            pa.field("day", pa.date32()),
            pa.field("ts", pa.timestamp("us")),
            pa.field("tstz", pa.timestamp("us", tz="UTC")),
            pa.field("ok", pa.bool_()),
            pa.field("nothing", pa.null()),
            pa.field("ints", pa.list_(pa.int32())),
            pa.field("pair", pa.struct([("a", pa.int16()), ("b", pa.list_(pa.string()))])),
            pa.field("attrs", pa.map_(pa.string(), pa.float64())),
            pa.field(
                "deep",
                pa.list_(
                    pa.struct(
                        [("m", pa.map_(pa.int32(), pa.list_(pa.binary()))), ("u", pa.uint8())]
                    )
                ),
            ),
            pa.field("_time", pa.int64(), nullable=False),
            pa.field("_diff", pa.int64(), nullable=False),
        ],
        metadata={"spark.sql": '{"type":"struct"}'},
    )
    utc = datetime.UTC
    rows = 9
    columns = [
        list(range(rows)),
        ["alpha", None, "", "héllo wörld", "日本", "z" * 40, None, "x", "y"],
        [1.5, float(nan_bits), -0.0, 0.0, None, float("inf"), float("-inf"), 5e-324, float("nan")],
        [1.5, None, -0.0, float("nan"), 3.25, 0.0, 1e38, -1e-38, None],
        [decimal.Decimal("1.500"), None, decimal.Decimal("-123456789.999"), decimal.Decimal(0)]
        + [None] * 5,
        [b"", None, b"\x00\x01\xff", b"bytes", None, b"q", b"r", b"s", b"t"],
        [datetime.date(2024, 2, 29), None, datetime.date(1970, 1, 1), datetime.date(1, 1, 1)]
        + [None] * 5,
        [datetime.datetime(2024, 5, 17, 12, 30, 0, 123456), None]
        + [datetime.datetime(2000, 1, 1)] * 7,
        [datetime.datetime(2024, 5, 17, tzinfo=utc), None] * 4 + [None],
        [True, False, None, True, True, False, None, False, True],
        [None] * rows,
        [[1, 2, 3], None, [], [None], [4], [5, 6], None, [7], []],
        [{"a": 1, "b": ["x"]}, None, {"a": None, "b": None}, {"a": 2, "b": []}]
        + [{"a": 3, "b": [None, "y"]}] * 5,
        [[("p", 1.0), ("q", None)], None, [], [("r", float("nan"))], [("s", -0.0)]] + [[]] * 4,
        [
            [{"m": [(1, [b"a", None])], "u": 7}],
            None,
            [],
            [None, {"m": None, "u": None}],
            [{"m": [], "u": 255}],
        ]
        + [[{"m": [(2, [])], "u": 0}]] * 4,
        [0, 0, 1, 1, 2, 3, 5, 8, 13],
        [1, -1, 1, 2, 1, 1, -1, 1, 1],
    ]
    arrays = [pa.array(values, f.type) for values, f in zip(columns, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def updates_table() -> pa.Table:
    """Version 1 golden table: the shape of the benchmark (id, name, value, _time, _diff)."""
    n = 300
    rng = np.random.default_rng(20240517)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64) * 3,
            "name": pa.array([f"name-{i:05d}-{int(rng.integers(0, 1000)):03d}" for i in range(n)]),
            "value": rng.standard_normal(n),
            "_time": rng.integers(0, 10, n),
            "_diff": np.where(rng.random(n) < 0.9, 1, -1).astype(np.int64),
        }
    )


# name -> (table builder, encode_part keyword arguments). The compression level is writer
# behaviour recorded in the footer, not format: the golden files pin the level they were
# written with, so a new default level needs no new format version.
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "types": (
        types_table,
        {
            "sort_column": "k",
            "chunk_bytes": 400,
            "metadata": {"batch": "golden"},
            "compression_level": 3,
        },
    ),
    "updates": (
        updates_table,
        {"sort_column": "id", "chunk_bytes": 4096, "compression_level": 3},
    ),
}


def golden_path(case: str, version: int = FORMAT_VERSION) -> Path:
    return GOLDEN / f"part-v{version}-{case}.pspart"


def structure(data: bytes) -> dict[str, Any]:
    """Everything in a part except the compressed bytes: header, footer, decoded payloads."""
    footer_len = struct.unpack_from("<I", data, len(data) - 16)[0]
    footer = json.loads(data[len(data) - 16 - footer_len : len(data) - 16])
    payloads = []
    for chunk in footer["chunks"]:
        pos = chunk["offset"]
        for column in chunk["columns"]:
            frame = data[pos : pos + column[0]]
            if len(column) == 4:  # plain (version 3): padding, then the payload as is
                payloads.append(frame[column[0] - column[1] :])
            else:
                payloads.append(zstandard.ZstdDecompressor().decompress(frame))
            pos += column[0]
            column[0] = column[2] = None  # compressed length and crc depend on libzstd
        chunk["offset"] = chunk["length"] = None
    return {"header": data[:8], "tail": data[-4 - 6 :], "footer": footer, "payloads": payloads}


@pytest.mark.parametrize("version", READ_VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_golden_file_decodes_to_the_table(case: str, version: int) -> None:
    """Every version this reader reads still decodes (old shards stay readable)."""
    build, kwargs = CASES[case]
    data = golden_path(case, version).read_bytes()
    reader = PartReader.from_bytes(golden_path(case, version).name, data)
    reader.verify()
    assert reader.version == version
    expected = build()
    assert_exact(reader.read(), expected)
    assert reader.metadata == kwargs.get("metadata", {})
    assert reader.sort_column == kwargs["sort_column"]
    assert len(reader.chunks) > 1
    assert reader.info.num_rows == expected.num_rows
    assert reader.info.min_time == 0
    key = expected.column(kwargs["sort_column"])
    assert (reader.info.key_min, reader.info.key_max) == (key[0].as_py(), key[-1].as_py())
    if version == 1:
        assert all(c.column_stats is None for c in reader.chunks)
        return
    start = 0
    for chunk in reader.chunks:  # version 2: every column's statistics match its rows
        rows = expected.slice(start, chunk.num_rows)
        start += chunk.num_rows
        assert chunk.column_stats is not None
        for field, cs in zip(expected.schema, chunk.column_stats, strict=True):
            column = rows.column(field.name)
            assert cs.null_count == column.null_count
            if cs.min is not None:
                values = [v for v in column.to_pylist() if v is not None]
                assert (cs.min, cs.max) == (min(values), max(values)), field.name
    ints = reader.chunks[0].column_stats[expected.schema.get_field_index("_time")]
    assert ints.min is not None and ints.max is not None


@pytest.mark.parametrize("case", list(CASES))
def test_reencoding_gives_the_golden_structure(case: str) -> None:
    build, kwargs = CASES[case]
    golden = golden_path(case).read_bytes()
    data, _ = encode_part(build(), **kwargs)
    assert structure(data) == structure(golden), (
        f"the encoding of {case} changed: bump FORMAT_VERSION and write new golden files"
    )


@pytest.mark.parametrize("case", list(CASES))
def test_reencoding_gives_the_golden_bytes(case: str) -> None:
    build, kwargs = CASES[case]
    golden = golden_path(case).read_bytes()
    data, _ = encode_part(build(), **kwargs)
    if data != golden:
        recorded = ZSTD_RECORD.read_text().strip()
        if zstandard.ZSTD_VERSION != tuple(int(x) for x in recorded.split(".")) and structure(
            data
        ) == structure(golden):
            pytest.skip(
                f"libzstd {zstandard.ZSTD_VERSION} compresses differently from {recorded}, "
                "which wrote the golden files; the decoded structure is identical"
            )
        first = (
            next(i for i, (a, b) in enumerate(zip(data, golden, strict=False)) if a != b)
            if any(a != b for a, b in zip(data, golden, strict=False))
            else min(len(data), len(golden))
        )
        raise AssertionError(
            f"bytes of {case} differ from {golden_path(case).name} at offset {first} "
            f"({len(data)} vs {len(golden)} bytes): bump FORMAT_VERSION and write new golden files"
        )


def test_structure_sees_encoding_changes() -> None:
    """The structural comparison is not vacuous: a one-value change or a new cut shows."""
    build, kwargs = CASES["updates"]
    golden = structure(golden_path("updates").read_bytes())
    table = build()
    changed = table.set_column(2, "value", pa.array(np.nextafter(table.column(2).to_numpy(), 9.0)))
    assert structure(encode_part(changed, **kwargs)[0]) != golden
    assert structure(encode_part(table, **{**kwargs, "chunk_bytes": 4000})[0]) != golden
    assert (
        encode_part(table, **{**kwargs, "compression_level": 9})[0]
        != golden_path("updates").read_bytes()
    )


def test_golden_files_exist_for_the_current_version() -> None:
    for case in CASES:
        assert golden_path(case).exists(), f"no golden file for format version {FORMAT_VERSION}"


def write_golden_files() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for case, (build, kwargs) in CASES.items():
        path = golden_path(case)
        if path.exists():
            sys.exit(f"{path} exists: golden files of a released version are never rewritten")
        data, _ = encode_part(build(), **kwargs)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    ZSTD_RECORD.write_text(".".join(str(x) for x in zstandard.ZSTD_VERSION) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_golden_files()
    else:
        sys.exit("usage: test_format_golden.py --write")
