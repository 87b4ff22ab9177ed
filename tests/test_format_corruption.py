"""Part format integrity: every flipped byte, every truncation and every foreign file is caught.

Each case must raise `CorruptData` (never another exception, never data) when the part is
opened and fully read; errors name the file, and the chunk when a chunk's bytes are bad.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from persistshard.errors import CorruptData
from persistshard.format import FORMAT_VERSION, PartReader, encode_part
from persistshard.format.testing import assert_exact

NAME = "shard/batch-7/part-0"


def small_table() -> pa.Table:
    return pa.table(
        {
            "k": pa.array([3, None, 1, 7, 2, 9], pa.int64()),
            "s": pa.array(["a", "bb", None, "", "dddd", "e"]),
            "f": pa.array([1.5, float("nan"), -0.0, None, 2.0, 3.0]),
            "l": pa.array([[1], None, [], [2, None], [3], [4, 5]], pa.list_(pa.int32())),
            "m": pa.array(
                [[("x", {"a": True})], None, [], [("y", None)], [("z", {"a": None})], []],
                pa.map_(pa.string(), pa.struct([("a", pa.bool_())])),
            ),
            "_time": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
            "_diff": pa.array([1, 1, -1, 1, 2, 1], pa.int64()),
        }
    )


@pytest.fixture(scope="module")
def part() -> bytes:
    data, _ = encode_part(small_table(), sort_column="k", chunk_bytes=120)
    reader = PartReader.from_bytes(NAME, data)
    assert len(reader.chunks) >= 2  # corruption must be located in more than one chunk
    return data


def read_in_memory(data: bytes) -> None:
    reader = PartReader.from_bytes(NAME, data)
    reader.read()
    reader.verify()


def read_ranged(data: bytes) -> None:
    def read_range(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    reader = PartReader.open(NAME, len(data), read_range)
    for i in range(len(reader.chunks)):
        reader.read_chunk(i)
    reader.verify()


def read_everything(data: bytes) -> None:
    """Open and read a part both ways: in memory and through ranged reads."""
    read_in_memory(data)
    read_ranged(data)


def expect_corrupt(data: bytes) -> CorruptData:
    """Both ways of reading `data` raise CorruptData naming the file; returns the first."""
    errors = []
    for read in (read_in_memory, read_ranged):
        with pytest.raises(CorruptData) as info:
            read(data)
        err = info.value
        assert str(err).startswith("CorruptData: ")
        assert err.file == NAME and NAME in str(err)
        errors.append(err)
    assert errors[0].chunk == errors[1].chunk, (str(errors[0]), str(errors[1]))
    return errors[0]


def test_the_part_reads_back(part: bytes) -> None:
    read_everything(part)
    assert_exact(PartReader.from_bytes(NAME, part).read(), small_table())


def test_every_flipped_byte_is_caught(part: bytes) -> None:
    reader = PartReader.from_bytes(NAME, part)
    spans = [(c.offset, c.offset + c.length, i) for i, c in enumerate(reader.chunks)]
    for mask in (0xFF, 0x01, 0x80):
        for pos in range(len(part)):
            bad = bytearray(part)
            bad[pos] ^= mask
            err = expect_corrupt(bytes(bad))
            in_chunk = [i for start, end, i in spans if start <= pos < end]
            if in_chunk:
                assert err.chunk == in_chunk[0], (pos, str(err))
                assert f"chunk {in_chunk[0]}" in str(err)


def test_every_truncation_is_caught(part: bytes) -> None:
    for length in range(len(part)):
        expect_corrupt(part[:length])


def test_appended_or_prepended_bytes_are_caught(part: bytes) -> None:
    for extra in (b"\x00", b"PSPART", part[-16:]):
        expect_corrupt(part + extra)
        expect_corrupt(extra + part)
    expect_corrupt(part + part)


def foreign_files() -> dict[str, bytes]:
    table = small_table()
    parquet = io.BytesIO()
    pq.write_table(table.drop_columns(["m"]), parquet)
    ipc = io.BytesIO()
    with pa.ipc.new_file(ipc, table.schema) as w:
        w.write_table(table)
    rng = np.random.default_rng(0)
    files = {
        "empty": b"",
        "one byte": b"P",
        "magic only": b"PSPART",
        "header and tail, nothing else": b"PSPART\x01\x00" + b"PSPART\x01\x00",
        "parquet": parquet.getvalue(),
        "arrow ipc": ipc.getvalue(),
        "json": b'{"chunks": []}',
        "zeros": bytes(4096),
        "zstd frame": zstandard.ZstdCompressor().compress(b"hello" * 100),
    }
    for n in (7, 24, 100, 70_000):
        files[f"random {n}"] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    return files


@pytest.mark.parametrize("kind", list(foreign_files()))
def test_foreign_files_are_caught(kind: str) -> None:
    expect_corrupt(foreign_files()[kind])


def test_newer_format_version_is_refused(part: bytes) -> None:
    newer = bytearray(part)
    struct.pack_into("<H", newer, 6, FORMAT_VERSION + 1)
    struct.pack_into("<H", newer, len(newer) - 8, FORMAT_VERSION + 1)
    assert "format version" in str(expect_corrupt(bytes(newer)))


def test_header_of_a_large_part_is_checked_by_verify() -> None:
    """Through ranged reads only the tail is fetched at open; verify() fetches the header."""
    table = pa.table({"v": np.random.default_rng(0).standard_normal(20_000)})
    data, _ = encode_part(table)
    assert len(data) > 64 << 10
    bad = b"XX" + data[2:]

    def read_range(offset: int, length: int) -> bytes:
        return bad[offset : offset + length]

    reader = PartReader.open(NAME, len(bad), read_range)
    assert_exact(reader.read(), table)  # the data itself is intact and checksummed
    with pytest.raises(CorruptData, match="header magic"):
        reader.verify()
    with pytest.raises(CorruptData, match="header magic"):
        PartReader.from_bytes(NAME, bad)


def test_short_reads_are_caught(part: bytes) -> None:
    def short(offset: int, length: int) -> bytes:
        return part[offset : offset + max(0, length - 1)]

    with pytest.raises(CorruptData, match="short read"):
        PartReader.open(NAME, len(part), short)
    reader = PartReader.open(NAME, len(part), lambda o, n: part[o : o + n])
    reader._read_range = short  # the object shrank after the footer was read
    with pytest.raises(CorruptData, match="short read") as info:
        reader.read_chunk(1)
    assert info.value.chunk == 1


# ---------------------------------------------------------------------------------------------
# Well-checksummed but malformed parts (a buggy writer): still CorruptData, never a crash.


def split(data: bytes) -> tuple[bytes, dict[str, Any]]:
    footer_len = struct.unpack_from("<I", data, len(data) - 16)[0]
    start = len(data) - 16 - footer_len
    return data[:start], json.loads(data[start : len(data) - 16])


def join(body: bytes, footer: dict[str, Any] | bytes) -> bytes:
    raw = footer if isinstance(footer, bytes) else json.dumps(footer).encode()
    return (
        body + raw + struct.pack("<IIH6s", len(raw), crc32c.crc32c(raw), FORMAT_VERSION, b"PSPART")
    )


def test_resealed_original_still_reads(part: bytes) -> None:
    body, footer = split(part)
    read_everything(join(body, footer))


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(footer: dict[str, Any]) -> None:
        obj: Any = footer
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value

    return apply


FOOTER_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "num_rows": _set(["num_rows"], 5),
    "chunk rows": _set(["chunks", 0, "num_rows"], 1),
    "chunk rows zero": _set(["chunks", 0, "num_rows"], 0),
    "chunk offset": _set(["chunks", 1, "offset"], 9),
    "chunk length": _set(["chunks", 0, "length"], 3),
    "segment length": _set(["chunks", 0, "columns", 0, 0], 2),
    "raw length": _set(["chunks", 0, "columns", 1, 1], 7),
    "raw length big": _set(["chunks", 0, "columns", 1, 1], 1 << 40),
    "crc type": _set(["chunks", 0, "columns", 1, 2], "x"),
    "columns missing": _set(["chunks", 0, "columns"], []),
    "version": _set(["version"], 99),
    "codec": _set(["codec"], "lz4"),
    "type narrowed": _set(["schema", "fields", 0, "type"], {"type": "int32"}),
    "type to string": _set(["schema", "fields", 0, "type"], {"type": "string"}),
    "type unknown": _set(["schema", "fields", 0, "type"], {"type": "quaternion"}),
    "list to struct": _set(["schema", "fields", 3, "type"], {"type": "struct", "children": []}),
    "decimal width": _set(["schema", "fields", 0, "type"], {"type": "decimal", "bits": 7}),
    "field missing": _set(["schema", "fields"], []),
    "sort column": _set(["sort_column"], "nope"),
    "key stat type": _set(["chunks", 0, "key_min"], "three"),
    "metadata": _set(["metadata"], [1]),
    "chunks": _set(["chunks"], {}),
    "no schema": lambda f: f.pop("schema"),
}


@pytest.mark.parametrize("mutation", list(FOOTER_MUTATIONS))
def test_malformed_footers_are_caught(part: bytes, mutation: str) -> None:
    body, footer = split(part)
    FOOTER_MUTATIONS[mutation](footer)
    expect_corrupt(join(body, footer))


@pytest.mark.parametrize("raw", [b"[]", b"null", b"{", b"\xff\xfe", b'{"version": 1}', b""])
def test_footers_that_are_not_objects_are_caught(part: bytes, raw: bytes) -> None:
    body, _ = split(part)
    expect_corrupt(join(body, raw))


def _reencode_segment(part: bytes, column: int, edit: Callable[[bytearray], None]) -> bytes:
    """Rewrite one segment of chunk 0 with an edited payload, checksums made valid again."""
    body, footer = split(part)
    reader = PartReader.from_bytes(NAME, part)
    seg = reader.chunks[0].segments[column]
    payload = bytearray(
        zstandard.ZstdDecompressor().decompress(part[seg.offset : seg.offset + seg.length])
    )
    edit(payload)
    frame = zstandard.ZstdCompressor().compress(bytes(payload))
    new_body = body[: seg.offset] + frame + body[seg.offset + seg.length :]
    delta = len(frame) - seg.length
    footer["chunks"][0]["columns"][column] = [len(frame), len(payload), crc32c.crc32c(frame)]
    footer["chunks"][0]["length"] += delta
    for c in footer["chunks"][1:]:
        c["offset"] += delta
    return join(new_body, footer)


def _poke(word: int, value: int) -> Callable[[bytearray], None]:
    def edit(payload: bytearray) -> None:
        struct.pack_into("<Q", payload, 8 * word, value)

    return edit


PAYLOAD_MUTATIONS: dict[str, tuple[int, Callable[[bytearray], None]]] = {
    "int rows": (0, _poke(0, 99)),
    "int nulls > rows": (0, _poke(1, 99)),
    "int validity length": (0, _poke(2, 16)),
    "int values length": (0, _poke(3, 5)),
    "string offsets length": (1, _poke(3, 1 << 62)),
    "string data length": (1, _poke(4, 1000)),
    "string negative length": (
        1,
        lambda p: p.__setitem__(slice(24 + 8 + 8 + 3, 24 + 8 + 8 + 4), b"\xff"),
    ),
    "list child rows": (3, _poke(5, 50)),
    "trailing bytes": (0, lambda p: p.extend(bytes(8))),
    "truncated payload": (2, lambda p: p.__delitem__(slice(len(p) - 8, None))),
    "empty payload": (4, lambda p: p.clear()),
}


@pytest.mark.parametrize("mutation", list(PAYLOAD_MUTATIONS))
def test_malformed_payloads_are_caught(part: bytes, mutation: str) -> None:
    column, edit = PAYLOAD_MUTATIONS[mutation]
    bad = _reencode_segment(part, column, edit)
    err = expect_corrupt(bad)
    assert err.chunk == 0


def test_unmodified_reencoding_reads(part: bytes) -> None:
    read_everything(_reencode_segment(part, 1, lambda p: None))


def with_footer(
    data: bytes, mutate: Callable[[dict[str, Any]], None], version: int | None = None
) -> bytes:
    """``data`` with its footer JSON changed by ``mutate`` and checksummed anew (and the
    header and tail saying ``version``, when given): what a buggy writer could produce."""
    footer_len, _, tail_version, magic = struct.unpack_from("<IIH6s", data, len(data) - 16)
    start = len(data) - 16 - footer_len
    footer = json.loads(data[start : len(data) - 16])
    mutate(footer)
    version = tail_version if version is None else version
    footer["version"] = version
    raw = json.dumps(footer, sort_keys=True, separators=(",", ":")).encode("ascii")
    head = bytearray(data[:start])
    struct.pack_into("<H", head, 6, version)
    tail = struct.pack("<IIH6s", len(raw), crc32c.crc32c(raw), version, magic)
    return bytes(head) + raw + tail


def plain_part() -> bytes:
    """A part whose double column does not compress (stored plain) and whose ids do."""
    rng = np.random.default_rng(4)
    table = pa.table({"id": np.arange(4000, dtype=np.int64), "v": rng.random(4000)})
    data, _ = encode_part(table, sort_column="id", chunk_bytes=16_000)
    return data


def _plain_entries(footer: dict[str, Any]) -> list[list[int]]:
    return [col for chunk in footer["chunks"] for col in chunk["columns"] if len(col) == 4]


def test_a_plain_entry_must_say_plain_and_pad_less_than_eight_bytes() -> None:
    data = plain_part()

    def bad_marker(footer: dict[str, Any]) -> None:
        _plain_entries(footer)[0][3] = 2

    def bad_padding(footer: dict[str, Any]) -> None:
        entry = _plain_entries(footer)[0]
        entry[1] -= 8  # the stored length would then hold 8 or more bytes of padding

    for mutate in (bad_marker, bad_padding):
        assert "plain column entry" in str(expect_corrupt_named(with_footer(data, mutate)))


def test_a_version_2_part_has_no_plain_segments() -> None:
    """Version 2 readers knew only zstd segments: a version 2 footer naming a plain one is
    malformed, never read as zstd."""
    data = plain_part()
    assert "integers" in str(expect_corrupt_named(with_footer(data, lambda f: None, version=2)))


def expect_corrupt_named(data: bytes) -> CorruptData:
    """`expect_corrupt` for parts written under another name than `NAME`."""
    with pytest.raises(CorruptData) as info:
        PartReader.from_bytes(NAME, data).read()
    return info.value
