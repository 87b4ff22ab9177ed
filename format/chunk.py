"""Column segments: one column of one chunk, as a self-contained zstd frame, or (format
version 3) as its payload stored plain when zstd would not save enough (docs/format.md).

A segment's uncompressed *payload* is a node table followed by the column's Arrow buffers,
each normalized to offset 0 and padded to 8 bytes. In a zstd segment fixed-width numeric
buffers are stored byte-shuffled and offsets as shuffled deltas, which zstd compresses far
better; a plain segment's fixed-width buffers are not shuffled (`unshuffled`), so they are
read in place.

Invariants:
- `encode_payload` is a pure function of the array's logical content and of the bytes under
  its null slots: slices (non-zero offsets), trailing bitmap bits and unused buffer space
  never reach the payload, so equal inputs give equal bytes (golden files rely on this).
- `decode_payload(t, n, encode_payload(a))` equals `a` (same type, values, validity, NaN
  payloads and signed zeros), for every type `schema.normalize_schema` accepts.
- `decode_payload` checks every length it uses against the buffer it indexes before
  handing buffers to Arrow, and raises `SegmentError` (never crashes) on malformed input.
  It trusts nothing but the type and the expected row count; the caller has already checked
  the segment's crc32c, so a `SegmentError` means a writer bug, not a flipped bit.

Assumes: the type was produced by `schema.normalize_schema` (no dictionaries, extensions).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

NULL, BOOL, FIXED, VARBIN, LIST, FIXED_LIST, STRUCT = range(7)

# Buffer slots per layout kind, in payload order (children follow their parent's buffers).
_SLOTS = {NULL: 0, BOOL: 2, FIXED: 2, VARBIN: 3, LIST: 2, FIXED_LIST: 1, STRUCT: 1}
_EMPTY = np.empty(0, dtype=np.uint8)
_INT32_MAX = int(np.iinfo(np.int32).max)
_INT64_MAX = int(np.iinfo(np.int64).max)
_ZERO_PAD = bytes(8)


class SegmentError(ValueError):
    """A payload that does not match its type; the caller turns it into CorruptData."""


@dataclass(frozen=True)
class Layout:
    """How one node of a type tree is laid out: its kind, widths and child layouts."""

    type: pa.DataType
    kind: int
    width: int = 0  # FIXED: bytes per value; VARBIN/LIST: bytes per offset; FIXED_LIST: size
    shuffle: bool = False  # FIXED: values stored byte-shuffled
    children: tuple[Layout, ...] = ()

    @property
    def table_words(self) -> int:
        """Number of u64 words this node and its descendants take in the node table."""
        return 2 + _SLOTS[self.kind] + sum(c.table_words for c in self.children)


@functools.lru_cache(maxsize=512)
def layout_of(t: pa.DataType) -> Layout:
    """The layout of a normalized Arrow type (cached: layouts are immutable and every part
    footer asks for its columns')."""
    if pa.types.is_null(t):
        return Layout(t, NULL)
    if pa.types.is_boolean(t):
        return Layout(t, BOOL)
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        return Layout(t, FIXED, width=t.byte_width, shuffle=False)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return Layout(t, VARBIN, width=4)
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return Layout(t, VARBIN, width=8)
    if pa.types.is_map(t):
        # A map is a list of non-null "entries" structs of (key, item).
        entries = t.field(0).type  # struct<key, item>, never null
        return Layout(t, LIST, width=4, children=(layout_of(entries),))
    if pa.types.is_fixed_size_list(t):
        return Layout(t, FIXED_LIST, width=t.list_size, children=(layout_of(t.value_type),))
    if pa.types.is_large_list(t):
        return Layout(t, LIST, width=8, children=(layout_of(t.value_type),))
    if pa.types.is_list(t):
        return Layout(t, LIST, width=4, children=(layout_of(t.value_type),))
    if pa.types.is_struct(t):
        return Layout(
            t, STRUCT, children=tuple(layout_of(t.field(i).type) for i in range(t.num_fields))
        )
    width = t.bit_width // 8  # every remaining normalized type is fixed-width numeric
    return Layout(t, FIXED, width=width, shuffle=width > 1)


@functools.lru_cache(maxsize=512)
def unshuffled(layout: Layout) -> Layout:
    """``layout`` with every fixed-width buffer stored as is, not byte-shuffled: the payload
    layout of a *plain* segment (stored without compression, docs/format.md, version 3),
    whose fixed-width values are then read in place. Offsets stay shuffled deltas."""
    children = tuple(unshuffled(c) for c in layout.children)
    if not layout.shuffle and children == layout.children:
        return layout
    return Layout(layout.type, layout.kind, layout.width, False, children)


# ---------------------------------------------------------------------------------------------
# Encoding


def _bitmap(buf: pa.Buffer, bit_offset: int, length: int) -> np.ndarray:
    """`length` bits of `buf` starting at `bit_offset`, as a fresh bitmap at bit 0.

    Bits past `length` in the last byte are zero.
    """
    nbytes = (length + 7) // 8
    if length == 0:
        return _EMPTY
    byte0, shift = divmod(bit_offset, 8)
    if shift == 0:
        out = np.frombuffer(buf, np.uint8, count=nbytes, offset=byte0).copy()
    else:
        have = min(buf.size - byte0, nbytes + 1)
        raw = np.frombuffer(buf, np.uint8, count=have, offset=byte0)
        if have < nbytes + 1:
            raw = np.concatenate([raw, np.zeros(nbytes + 1 - have, np.uint8)])
        out = (raw[:nbytes] >> np.uint8(shift)) | (raw[1 : nbytes + 1] << np.uint8(8 - shift))
    if length % 8:
        out[-1] &= np.uint8((1 << (length % 8)) - 1)
    return out


def _shuffle(data: np.ndarray, width: int) -> np.ndarray:
    """Byte-shuffle: byte j of value i goes to position j * n + i."""
    if width == 1 or data.size == 0:
        return data
    values = data.reshape(-1, width)
    out = np.empty((width, len(values)), np.uint8)
    for j in range(width):  # one strided pass per byte plane beats a 2-D transpose copy
        out[j] = values[:, j]
    return out.reshape(-1)


def _offsets(arr: pa.Array, width: int) -> tuple[np.ndarray, int, int]:
    """(shuffled offset deltas, first offset, last offset) of a list or binary array."""
    n = len(arr)
    if n == 0:
        return _EMPTY, 0, 0
    dtype = np.int32 if width == 4 else np.int64
    offs = np.frombuffer(arr.buffers()[1], dtype, count=n + 1, offset=arr.offset * width)
    deltas = np.diff(offs)
    return _shuffle(deltas.view(np.uint8), width), int(offs[0]), int(offs[-1])


def _flatten(arr: pa.Array, layout: Layout, table: list[int], bufs: list[Any]) -> None:
    n = len(arr)
    kind = layout.kind
    if kind == NULL:
        table += [n, n]
        return
    nulls = arr.null_count
    validity = _bitmap(arr.buffers()[0], arr.offset, n) if nulls else _EMPTY
    table += [n, nulls]
    own: list[Any] = [validity]
    children: list[pa.Array] = []
    if kind == FIXED:
        w = layout.width
        data = (
            np.frombuffer(arr.buffers()[1], np.uint8, count=n * w, offset=arr.offset * w)
            if n
            else _EMPTY
        )
        own.append(_shuffle(data, w) if layout.shuffle else data)
    elif kind == BOOL:
        own.append(_bitmap(arr.buffers()[1], arr.offset, n))
    elif kind == VARBIN:
        deltas, first, last = _offsets(arr, layout.width)
        own.append(deltas)
        data_buf = arr.buffers()[2]
        own.append(memoryview(data_buf)[first:last] if last > first else _EMPTY)
    elif kind == LIST:
        deltas, first, last = _offsets(arr, layout.width)
        own.append(deltas)
        children.append(arr.values.slice(first, last - first))
    elif kind == FIXED_LIST:
        size = layout.width
        children.append(arr.values.slice(arr.offset * size, n * size))
    else:  # STRUCT: field(i) is already sliced to the parent's offset and length
        children.extend(arr.field(i) for i in range(len(layout.children)))
    for b in own:
        table.append(len(b) if not isinstance(b, np.ndarray) else b.nbytes)
        bufs.append(b)
    for child, child_layout in zip(children, layout.children, strict=True):
        _flatten(child, child_layout, table, bufs)


def encode_payload(arr: pa.Array, layout: Layout) -> bytes:
    """The uncompressed payload of one column segment holding `arr`."""
    table: list[int] = []
    bufs: list[Any] = []
    _flatten(arr, layout, table, bufs)
    parts: list[Any] = [np.asarray(table, dtype="<u8").tobytes()]
    for b in bufs:
        size = len(b) if not isinstance(b, np.ndarray) else b.nbytes
        if size:
            parts.append(b)
            if size % 8:
                parts.append(_ZERO_PAD[: 8 - size % 8])
    return b"".join(parts)


_local = threading.local()


def compress(payload: bytes, level: int) -> bytes:
    """One zstd frame (with content size) of `payload`; thread-safe."""
    compressors: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if compressors is None:
        compressors = _local.compressors = {}
    c = compressors.get(level)
    if c is None:
        c = compressors[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return c.compress(payload)


_CODEC = pa.Codec("zstd")
#: Frames that expand to at most this many bytes are decompressed by this thread's own
#: `zstandard.ZstdDecompressor`, kept between calls: Arrow's codec makes a decompression
#: context per call (about 10 us, most of a small frame's cost). Larger ones go to Arrow,
#: whose buffers come from its pool (reused memory; a fresh large ``bytes`` would page-fault
#: on every first touch).
SMALL_FRAME_BYTES = 128 << 10


def decompress(data: Any, raw_length: int) -> pa.Buffer:
    """Decompress one zstd frame that must expand to exactly `raw_length` bytes.

    Returns a buffer aligned to at least 16 bytes (Arrow-allocated, 64-byte aligned, above
    `SMALL_FRAME_BYTES`); thread-safe, releases the GIL while decompressing. A frame that is
    not zstd or does not expand to `raw_length` bytes is `SegmentError`.
    """
    if raw_length == 0:
        return pa.py_buffer(b"")
    if raw_length <= SMALL_FRAME_BYTES:
        decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
        if decompressor is None:
            decompressor = _local.decompressor = zstandard.ZstdDecompressor()
        try:
            small = decompressor.decompress(data, max_output_size=raw_length)
        except zstandard.ZstdError as e:
            raise SegmentError(f"zstd frame does not decompress: {e}") from e
        if len(small) != raw_length:
            raise SegmentError(
                f"zstd frame expands to {len(small)} bytes, footer says {raw_length}"
            )
        return pa.py_buffer(small)
    try:
        out = _CODEC.decompress(data, decompressed_size=raw_length, asbytes=False)
    except (OSError, pa.ArrowException) as e:
        raise SegmentError(f"zstd frame does not decompress: {e}") from e
    if out.size != raw_length:
        raise SegmentError(f"zstd frame expands to {out.size} bytes, footer says {raw_length}")
    return out


# ---------------------------------------------------------------------------------------------
# Decoding


class _Cursor:
    """Walks the node table and buffer area of one payload, checking every bound."""

    def __init__(self, payload: pa.Buffer, table: np.ndarray, start: int) -> None:
        self.payload = payload
        self.table = table
        self.word = 0
        self.pos = start

    def word_next(self) -> int:
        if self.word >= len(self.table):
            raise SegmentError("node table ends early")
        value = int(self.table[self.word])
        self.word += 1
        return value

    def take(self, size: int) -> pa.Buffer:
        end = self.pos + size
        if end > self.payload.size:
            raise SegmentError(f"buffer of {size} bytes at {self.pos} runs past the payload")
        out = self.payload.slice(self.pos, size)
        self.pos = end + (-size % 8)
        return out


def _unshuffle(buf: pa.Buffer, n: int, width: int) -> pa.Buffer:
    if width == 1 or n == 0:
        return buf
    planes = np.frombuffer(buf, np.uint8, count=n * width).reshape(width, n)
    out = pa.allocate_buffer(n * width)  # Arrow's pool: aligned, and reused without page faults
    values = np.frombuffer(out, np.uint8).reshape(n, width)
    for j in range(width):
        values[:, j] = planes[j]
    return out


def _decode_offsets(buf: pa.Buffer, n: int, width: int, total: int | None) -> tuple[pa.Buffer, int]:
    """Offsets buffer (n + 1 entries from 0) from shuffled deltas; returns (buffer, last)."""
    dtype = np.int32 if width == 4 else np.int64
    if n == 0:
        return pa.py_buffer(np.zeros(1, dtype)), 0
    deltas = np.frombuffer(_unshuffle(buf, n, width), dtype, count=n)
    if int(deltas.min()) < 0:
        raise SegmentError("negative list or string length")
    last = int(deltas.sum(dtype=np.int64))
    if total is not None and last != total:
        raise SegmentError(f"offsets end at {last}, data holds {total} bytes")
    if last > (_INT32_MAX if width == 4 else _INT64_MAX):
        raise SegmentError("offsets overflow")
    offs = np.empty(n + 1, dtype)
    offs[0] = 0
    np.cumsum(deltas, out=offs[1:])
    return pa.py_buffer(offs), last


def _decode(cur: _Cursor, layout: Layout, expected_length: int) -> pa.Array:
    n = cur.word_next()
    nulls = cur.word_next()
    if n != expected_length:
        raise SegmentError(f"node of type {layout.type} has {n} rows, expected {expected_length}")
    if nulls > n:
        raise SegmentError(f"{nulls} nulls in {n} rows")
    kind = layout.kind
    if kind == NULL:
        if nulls != n:
            raise SegmentError("null column with non-null values")
        return pa.nulls(n)
    sizes = [cur.word_next() for _ in range(_SLOTS[kind])]
    bitmap_bytes = (n + 7) // 8
    if sizes[0] != (bitmap_bytes if nulls else 0):
        raise SegmentError(f"validity of {sizes[0]} bytes for {n} rows with {nulls} nulls")
    validity = cur.take(sizes[0]) if nulls else None
    children: list[pa.Array] = []
    if kind == FIXED:
        if sizes[1] != n * layout.width:
            raise SegmentError(f"{sizes[1]} bytes of values for {n} rows of width {layout.width}")
        raw = cur.take(sizes[1])
        data = _unshuffle(raw, n, layout.width) if layout.shuffle else raw
        buffers: list[pa.Buffer | None] = [validity, data]
    elif kind == BOOL:
        if sizes[1] != bitmap_bytes:
            raise SegmentError(f"{sizes[1]} bytes of booleans for {n} rows")
        buffers = [validity, cur.take(sizes[1])]
    elif kind == VARBIN:
        if sizes[1] != n * layout.width:
            raise SegmentError(f"{sizes[1]} bytes of offsets for {n} rows")
        raw_offsets = cur.take(sizes[1])
        data = cur.take(sizes[2])
        offsets, _ = _decode_offsets(raw_offsets, n, layout.width, sizes[2])
        buffers = [validity, offsets, data]
    elif kind == LIST:
        if sizes[1] != n * layout.width:
            raise SegmentError(f"{sizes[1]} bytes of offsets for {n} rows")
        offsets, last = _decode_offsets(cur.take(sizes[1]), n, layout.width, None)
        buffers = [validity, offsets]
        children.append(_decode(cur, layout.children[0], last))
    elif kind == FIXED_LIST:
        buffers = [validity]
        children.append(_decode(cur, layout.children[0], n * layout.width))
    else:
        buffers = [validity]
        children.extend(_decode(cur, c, n) for c in layout.children)
    return pa.Array.from_buffers(
        layout.type, n, buffers, null_count=nulls, children=children or None
    )


def decode_payload(payload: pa.Buffer, layout: Layout, num_rows: int) -> pa.Array:
    """The array of `num_rows` rows stored in `payload`; raises SegmentError if malformed."""
    words = layout.table_words
    if payload.size < 8 * words:
        raise SegmentError(f"payload of {payload.size} bytes is shorter than its node table")
    table = np.frombuffer(payload, "<u8", count=words)
    cur = _Cursor(payload, table, 8 * words)
    arr = _decode(cur, layout, num_rows)
    if cur.word != words or cur.pos != payload.size:
        raise SegmentError("payload has trailing bytes")
    arr.validate()
    return arr
