"""Part files: a header, a sequence of chunks, a JSON footer indexing them, and a tail.

The byte layout is specified in docs/format.md; this module is its reference implementation.

Writer invariants (`PartWriter`, `encode_part`):
- Rows are stored in the order given; nothing is reordered, dropped or deduplicated.
- A chunk holds at least one row and, unless a single row is larger, at most `chunk_bytes`
  bytes of Arrow data (`RecordBatch.nbytes` of its rows). The writer keeps at most two
  encoded chunks in flight besides the slices of the caller's batches it references.
- The bytes are a deterministic function of (schema, rows and the bytes under their null
  slots, chunk_bytes, compression level, metadata, sort column, zstd library version):
  no clocks, no randomness, no dict-order dependence.
- The sink only ever receives sequential `write` calls (no seek, no append to storage): the
  caller puts the finished bytes in one piece. The part is valid only once `close()`
  returned; before that the sink holds a prefix that every reader rejects.

Reader invariants (`PartReader`):
- Nothing decoded is returned unless the crc32c of every byte range it came from matched:
  the footer (and tail fields) before anything else, each column segment before it is
  decompressed. The header is checked whenever it is fetched (always by `from_bytes` and
  `verify`). Any mismatch, short read or malformed structure raises `CorruptData` naming
  the file and, where one is involved, the chunk; no other exception type escapes decoding.
- Only ranged reads: `open` fetches the last 64 KiB (or the footer exactly, if larger);
  `read_chunk` fetches the requested columns' segments of one chunk, coalescing those at
  most `HOLE_BYTES` (and a quarter of the wanted bytes) apart. `read_range` is only ever
  called from the thread that called the reader method.
- Decompression and decoding of segments run in a shared thread pool (zstd and numpy
  release the GIL), at most a few chunks ahead of the consumer, or in the calling thread
  when it asks (`read_chunk`'s ``in_thread``: callers that decode chunks in threads of
  their own, which must not wait on the pool).
"""

from __future__ import annotations

import io
import json
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.errors import CorruptData, InvalidOption, InvalidUpdates

from . import chunk as chunk_codec
from . import stats
from .memo import BytesMemo
from .pool import WORKERS, SharedPool
from .schema import (
    decoded_type,
    has_dictionary,
    normalize_schema,
    schema_from_json,
    schema_to_json,
)

FORMAT_VERSION = 3
#: Versions this reader reads: 1 (statistics of the sort column only), 2 (of every column)
#: and 3 (segments may be stored plain, `PLAIN_ABOVE`).
READ_VERSIONS = (1, 2, 3)
MAGIC = b"PSPART"
HEADER = struct.Struct("<6sH")  # magic, version
TAIL = struct.Struct("<IIH6s")  # footer length, footer crc32c, version, magic
HEADER_SIZE = HEADER.size  # 8
TAIL_SIZE = TAIL.size  # 16
TAIL_READ = 64 << 10
TIME_COLUMN = "_time"
DIFF_COLUMN = "_diff"
CODEC = "zstd"

#: A segment whose zstd frame would keep more than this share of its payload (random doubles:
#: about 0.85) is stored *plain* (version 3): its payload as is, fixed-width values not
#: shuffled, so a reader checks its crc32c and uses it in place, where decompressing and
#: unshuffling cost more than the bytes saved (docs/format.md, "Plain segments").
PLAIN_ABOVE = 0.8
_PAD = bytes(8)

#: Segments of one chunk this close (in bytes; and at most a quarter of what the get wants) are
#: fetched by one ranged get, the bytes between them included: on an object store a request
#: costs far more than reading that much more
#: (Arrow's Parquet reader coalesces holes of up to 8 KiB; a chunk's skipped column of
#: constant times is a few bytes, one of varied times about a byte per row).
HOLE_BYTES = 64 << 10

#: Parsed footers remembered by their checked bytes (`PartReader._from_footer_bytes`): every
#: read of a shard opens each of its parts, and parsing a footer (JSON, then checking every
#: entry and statistic) costs about 60 us for a part of one chunk. At most 4,096 footers of up
#: to 64 KiB each, 16 MiB in all (their parse takes a few times that).
_FOOTERS: BytesMemo[tuple[tuple[Any, ...], dict[str, str]]] = BytesMemo(
    entries=4096, max_bytes=64 << 10, total_bytes=16 << 20
)

_MAX_INFLIGHT_CHUNKS = 2
_INLINE_DECODE_BYTES = 1 << 20
_INLINE_ENCODE_BYTES = 1 << 20

_T = TypeVar("_T")


#: zstd level of the reference writer. Level 1 compresses this format's shuffled columns
#: about as well as level 3 (within a few percent, sometimes smaller) at a third to a half of
#: the time (docs/benchmarks.md, format): writes, compaction and overwrites are bound by it.
DEFAULT_COMPRESSION_LEVEL = 1

# ---------------------------------------------------------------------------------------------
# Shared worker pool: decodes and encodes column segments; that work never waits on anything.

_WORKERS = WORKERS
_POOL = SharedPool("persistshard-format", _WORKERS)


def _done(value: _T) -> Future[_T]:
    """``value`` as an already-finished future (work done inline, consumed like pool work)."""
    future: Future[_T] = Future()
    future.set_result(value)
    return future


def _executor() -> ThreadPoolExecutor:
    return _POOL.get()


# ---------------------------------------------------------------------------------------------
# Public descriptions


@dataclass(frozen=True)
class Segment:
    """One column of one chunk: where its stored bytes are (a zstd frame, or a plain payload
    after its padding) and what they must check out to."""

    offset: int  # absolute offset in the file
    length: int  # stored bytes (a plain segment's include its alignment padding)
    raw_length: int  # bytes of the payload
    crc32c: int  # of the stored bytes
    plain: bool = False  # stored without compression, after padding to an 8-byte offset


@dataclass(frozen=True)
class ChunkInfo:
    """A chunk as the footer indexes it.

    `min_time`/`max_time` are None when the part has no `_time` column. `key_min`/`key_max`
    bound the non-null values of the sort column; None means no bound is known (no sort
    column, a type without statistics, every value null (`key_null_count == num_rows`), or
    a bound Python cannot represent). `segments` lists the column segments in schema order.
    `column_stats` (format version 2) holds every column's bounds and null count, in schema
    order; None for version 1 parts.
    """

    offset: int
    length: int
    num_rows: int
    min_time: int | None
    max_time: int | None
    key_min: Any
    key_max: Any
    key_null_count: int
    segments: tuple[Segment, ...] = ()
    column_stats: tuple[stats.ColumnStats, ...] | None = None  # per column; None in version 1


@dataclass(frozen=True)
class PartInfo:
    """What a state entry needs to know about a part, over all its chunks.

    Times and keys combine the chunks' (None when no chunk has one); `key_min`/`key_max`
    are None if any chunk's bound could not be represented in Python.
    """

    size_bytes: int
    num_rows: int
    num_chunks: int
    min_time: int | None
    max_time: int | None
    key_min: Any
    key_max: Any
    key_null_count: int = 0


def _combine(values: list[Any], pick: Callable[..., Any], key: Callable[[Any], Any]) -> Any:
    present = [v for v in values if v is not None]
    return pick(present, key=key) if present else None


def _part_info(
    size: int,
    chunks: Sequence[ChunkInfo],
    raw_keys: Sequence[tuple[Any, Any]],
    key_type: pa.DataType | None,
) -> PartInfo:
    key_min = key_max = None
    if key_type is not None:
        lo = _combine([r[0] for r in raw_keys], min, lambda r: stats.raw_sort_key(r, key_type))
        hi = _combine([r[1] for r in raw_keys], max, lambda r: stats.raw_sort_key(r, key_type))
        key_min, key_max = stats.stats_to_py(lo, hi, key_type)
    return PartInfo(
        size_bytes=size,
        num_rows=sum(c.num_rows for c in chunks),
        num_chunks=len(chunks),
        min_time=_combine([c.min_time for c in chunks], min, int),
        max_time=_combine([c.max_time for c in chunks], max, int),
        key_min=key_min,
        key_max=key_max,
        key_null_count=sum(c.key_null_count for c in chunks),
    )


def _dumps(obj: Any) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


# ---------------------------------------------------------------------------------------------
# Writer


@dataclass(frozen=True)
class _EncodedSegment:
    data: bytes
    raw_length: int
    crc: int  # of ``data``; a plain segment's is taken with its padding, when it is placed
    plain: bool = False


def _encode_segment(arr: pa.Array, layout: chunk_codec.Layout, level: int) -> _EncodedSegment:
    payload = chunk_codec.encode_payload(arr, layout)
    data = chunk_codec.compress(payload, level)
    if len(data) > PLAIN_ABOVE * len(payload):
        plain = chunk_codec.encode_payload(arr, chunk_codec.unshuffled(layout))
        return _EncodedSegment(plain, len(plain), 0, plain=True)
    return _EncodedSegment(data, len(payload), crc32c.crc32c(data))


def _chunk_stats(
    time_col: pa.Array | None, key_col: pa.Array | None, columns: Sequence[pa.Array]
) -> tuple[Any, ...]:
    min_time = max_time = None
    if time_col is not None and len(time_col):
        mm = pc.min_max(time_col)
        min_time, max_time = mm["min"].as_py(), mm["max"].as_py()
    key_min = key_max = None
    nulls = 0
    if key_col is not None:
        key_min, key_max = stats.key_stats(key_col)
        nulls = key_col.null_count
    raw_columns = [list(stats.column_stats(c)) for c in columns]
    return min_time, max_time, key_min, key_max, nulls, raw_columns


class PartWriter:
    """Writes one part to a sink, chunk by chunk, in bounded memory.

    `write` appends rows (in the given order) and cuts a chunk whenever the pending rows
    reach `chunk_bytes`; `close` writes the last chunk, the footer and the tail, and returns
    the `PartInfo`. Input must match `schema` (column names and types; dictionary columns are
    stored decoded, and may arrive encoded, with any index type, or decoded); rows in a
    non-nullable top-level column must not be null, and `_time`/`_diff`, when present, must
    be non-null int64. Violations raise `InvalidUpdates` (bad arguments: `InvalidOption`)
    before anything of that call is written. Errors of the sink propagate; after any error
    the sink holds no valid part.
    """

    def __init__(
        self,
        sink: BinaryIO,
        schema: pa.Schema,
        *,
        name: str = "<part>",
        sort_column: str | None = None,
        chunk_bytes: int = 8 << 20,
        compression_level: int = DEFAULT_COMPRESSION_LEVEL,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self._sink = sink
        self._name = name
        self._schema = normalize_schema(schema)
        if chunk_bytes < 1:
            raise InvalidOption(f"chunk_bytes must be positive, got {chunk_bytes}")
        if not 1 <= compression_level <= 22:
            raise InvalidOption(f"compression_level must be in 1..22, got {compression_level}")
        if sort_column is not None and sort_column not in self._schema.names:
            raise InvalidOption(
                f"sort column {sort_column!r} is not in the schema {self._schema.names}"
            )
        for col in (TIME_COLUMN, DIFF_COLUMN):
            if col in self._schema.names and self._schema.field(col).type != pa.int64():
                raise InvalidUpdates(
                    f"column {col!r} must be int64, got {self._schema.field(col).type}"
                )
        meta = dict(metadata or {})
        for k, v in meta.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidOption(f"part metadata must map str to str, got {k!r}: {v!r}")
        self._metadata = meta
        self._sort_column = sort_column
        self._chunk_bytes = chunk_bytes
        self._level = compression_level
        self._layouts = [chunk_codec.layout_of(f.type) for f in self._schema]
        names = self._schema.names
        self._time_index = names.index(TIME_COLUMN) if TIME_COLUMN in names else None
        self._key_index = names.index(sort_column) if sort_column is not None else None
        self._key_type = self._schema.field(sort_column).type if sort_column is not None else None
        self._not_null = [
            i
            for i, f in enumerate(self._schema)
            if not f.nullable or f.name in (TIME_COLUMN, DIFF_COLUMN)
        ]
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._inflight: deque[
            tuple[int, list[Future[_EncodedSegment]], Future[tuple[Any, ...]]]
        ] = deque()
        self._chunks: list[ChunkInfo] = []
        self._raw_keys: list[tuple[Any, Any]] = []
        self._raw_columns: list[list[list[Any]]] = []
        self._offset = 0
        self._closed = False
        self._emit(HEADER.pack(MAGIC, FORMAT_VERSION))

    @property
    def schema(self) -> pa.Schema:
        """The schema stored in the part (dictionaries decoded)."""
        return self._schema

    def _emit(self, data: bytes) -> None:
        self._sink.write(data)
        self._offset += len(data)

    # -- input ----------------------------------------------------------------------------

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch.schema.names != self._schema.names:
            raise InvalidUpdates(
                f"columns {batch.schema.names} do not match the part's columns "
                f"{self._schema.names} (part {self._name})"
            )
        arrays = []
        for arr, field in zip(batch.columns, self._schema, strict=True):
            if not arr.type.equals(field.type):
                if has_dictionary(arr.type) and decoded_type(arr.type).equals(field.type):
                    arr = arr.cast(field.type)
                else:
                    raise InvalidUpdates(
                        f"column {field.name!r} has type {arr.type}, the part's schema says "
                        f"{field.type} (part {self._name})"
                    )
            arrays.append(arr)
        for i in self._not_null:
            if arrays[i].null_count:
                raise InvalidUpdates(
                    f"column {self._schema.field(i).name!r} is not nullable but holds "
                    f"{arrays[i].null_count} nulls (part {self._name})"
                )
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        """Append the rows of `data`, in order; encodes every chunk that fills up."""
        if self._closed:
            raise ValueError(f"PartWriter for {self._name} is closed")
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        conformed = [self._conform(b) for b in batches]  # check everything before writing
        for batch in conformed:
            self._add(batch)

    def _add(self, batch: pa.RecordBatch) -> None:
        start, n = 0, batch.num_rows
        while start < n:
            room = self._chunk_bytes - self._pending_bytes
            rest = batch.slice(start)
            size = rest.nbytes
            if size <= room:
                self._pending.append(rest)
                self._pending_bytes += size
                return
            lo, hi = 0, n - start  # nbytes(rows[:lo]) <= room < nbytes(rows[:hi])
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if batch.slice(start, mid).nbytes <= room:
                    lo = mid
                else:
                    hi = mid
            take = lo if (lo or self._pending) else 1
            if take:
                self._pending.append(batch.slice(start, take))
                start += take
            self._cut()

    # -- chunks ---------------------------------------------------------------------------

    def _cut(self) -> None:
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        if not pieces:
            return
        num_rows = sum(p.num_rows for p in pieces)
        if len(pieces) == 1:
            columns = list(pieces[0].columns)
        else:
            columns = [
                pa.concat_arrays([p.column(i) for p in pieces]) for i in range(len(self._layouts))
            ]
        time_col = columns[self._time_index] if self._time_index is not None else None
        key_col = columns[self._key_index] if self._key_index is not None else None
        if sum(c.nbytes for c in columns) < _INLINE_ENCODE_BYTES:
            # A small chunk (compaction of small batches, a small append) encodes faster here
            # than the pool's hand-offs cost: done inline, as already-finished futures.
            seg_futures = [
                _done(_encode_segment(col, layout, self._level))
                for col, layout in zip(columns, self._layouts, strict=True)
            ]
            stat_future = _done(_chunk_stats(time_col, key_col, columns))
        else:
            pool = _executor()
            seg_futures = [
                pool.submit(_encode_segment, col, layout, self._level)
                for col, layout in zip(columns, self._layouts, strict=True)
            ]
            stat_future = pool.submit(_chunk_stats, time_col, key_col, columns)
        self._inflight.append((num_rows, seg_futures, stat_future))
        while len(self._inflight) > _MAX_INFLIGHT_CHUNKS - 1:
            self._drain_one()

    def _drain_one(self) -> None:
        num_rows, seg_futures, stat_future = self._inflight.popleft()
        encoded = [f.result() for f in seg_futures]
        min_time, max_time, key_min, key_max, key_nulls, raw_columns = stat_future.result()
        start = self._offset
        segments = []
        for seg in encoded:
            if seg.plain:
                # Padding first, so the payload starts at an 8-byte offset of the file (and of
                # any mapping of it): its buffers are then used in place, aligned.
                pad = _PAD[: -self._offset % 8]
                crc = crc32c.crc32c(seg.data, crc32c.crc32c(pad))
                stored = Segment(self._offset, len(pad) + len(seg.data), seg.raw_length, crc, True)
                segments.append(stored)
                self._emit(pad)
            else:
                segments.append(Segment(self._offset, len(seg.data), seg.raw_length, seg.crc))
            self._emit(seg.data)
        key_type = self._key_type
        py_min, py_max = (None, None)
        if key_type is not None:
            py_min, py_max = stats.stats_to_py(key_min, key_max, key_type)
        self._chunks.append(
            ChunkInfo(
                offset=start,
                length=self._offset - start,
                num_rows=num_rows,
                min_time=min_time,
                max_time=max_time,
                key_min=py_min,
                key_max=py_max,
                key_null_count=key_nulls,
                segments=tuple(segments),
                column_stats=tuple(
                    stats.check_column_stats(raw, f.type, num_rows)
                    for raw, f in zip(raw_columns, self._schema, strict=True)
                ),
            )
        )
        self._raw_keys.append((key_min, key_max))
        self._raw_columns.append(raw_columns)

    def close(self) -> PartInfo:
        """Write the last chunk, the footer and the tail; return the part's summary."""
        if self._closed:
            raise ValueError(f"PartWriter for {self._name} is already closed")
        self._cut()
        while self._inflight:
            self._drain_one()
        self._closed = True
        footer = _dumps(
            {
                "version": FORMAT_VERSION,
                "codec": CODEC,
                "schema": schema_to_json(self._schema),
                "metadata": self._metadata,
                "sort_column": self._sort_column,
                "num_rows": sum(c.num_rows for c in self._chunks),
                "chunks": [
                    {
                        "offset": c.offset,
                        "length": c.length,
                        "num_rows": c.num_rows,
                        "min_time": c.min_time,
                        "max_time": c.max_time,
                        "key_min": raw[0],
                        "key_max": raw[1],
                        "key_null_count": c.key_null_count,
                        "columns": [
                            [s.length, s.raw_length, s.crc32c, *([1] if s.plain else [])]
                            for s in c.segments
                        ],
                        "stats": raw_columns,
                    }
                    for c, raw, raw_columns in zip(
                        self._chunks, self._raw_keys, self._raw_columns, strict=True
                    )
                ],
            }
        )
        self._emit(footer)
        self._emit(TAIL.pack(len(footer), crc32c.crc32c(footer), FORMAT_VERSION, MAGIC))
        return _part_info(self._offset, self._chunks, self._raw_keys, self._key_type)

    def abort(self) -> None:
        """Stop without finishing the part (the sink's bytes are not a valid part)."""
        self._closed = True
        self._pending = []
        while self._inflight:
            _, futures, stat = self._inflight.popleft()
            stat.cancel()
            for f in futures:
                f.cancel()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()


def encode_part(
    table: pa.Table,
    *,
    sort_column: str | None = None,
    chunk_bytes: int = 8 << 20,
    metadata: dict[str, str] | None = None,
    compression_level: int = DEFAULT_COMPRESSION_LEVEL,
    name: str = "<part>",
) -> tuple[bytes, PartInfo]:
    """Encode a whole table as one part, in memory; returns (bytes, info)."""
    sink = io.BytesIO()
    writer = PartWriter(
        sink,
        table.schema,
        name=name,
        sort_column=sort_column,
        chunk_bytes=chunk_bytes,
        compression_level=compression_level,
        metadata=metadata,
    )
    writer.write(table)
    info = writer.close()
    return sink.getvalue(), info


# ---------------------------------------------------------------------------------------------
# Reader


def _aligned(data: Any, start: int, length: int) -> pa.Buffer:
    """``data[start:start + length]`` as an Arrow buffer: a view when it starts at an 8-byte
    aligned address (a mapped file: the writer aligned the payload), else an aligned copy
    (a fetched range starts wherever the fetch put it)."""
    view = pa.py_buffer(data).slice(start, length)
    if view.size != length:
        raise chunk_codec.SegmentError(f"plain payload of {view.size} bytes, expected {length}")
    if view.address % 8 == 0:
        return view
    out = pa.allocate_buffer(length)
    memoryview(out).cast("B")[:] = memoryview(view).cast("B")
    return out


_DECODE_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    ArithmeticError,
    struct.error,
    OSError,
    pa.ArrowException,
    RecursionError,
)


def _int(obj: Any, key: str, *, nullable: bool = False) -> Any:
    value = obj[key]
    if value is None and nullable:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key!r} must be an integer, got {value!r}")
    if value < 0 and key not in ("min_time", "max_time"):
        raise ValueError(f"{key!r} must be a non-negative integer, got {value!r}")
    return value


class PartReader:
    """Reads a part through ranged gets: footer first, then only the segments asked for.

    `read_range(offset, length)` must return exactly those bytes (any bytes-like object);
    fewer bytes are reported as `CorruptData` (a truncated object), and exceptions it raises
    (a missing object, a network error) propagate unchanged. Open readers are independent:
    several may be opened and read from different threads at once.
    """

    name: str
    size: int
    schema: pa.Schema
    num_rows: int
    chunks: list[ChunkInfo]
    metadata: dict[str, str]
    sort_column: str | None
    info: PartInfo  # the same summary the writer's close() returned

    def __init__(
        self,
        name: str,
        size: int,
        read_range: Callable[[int, int], Any],
        footer: dict[str, Any],
        footer_start: int,
        version: int = FORMAT_VERSION,
    ) -> None:
        """Use `open` or `from_bytes`; this takes an already checksummed footer."""
        self.name = name
        self.version = version
        self.size = size
        self._read_range = read_range
        self._footer_start = footer_start
        try:
            self._parse_footer(footer)
        except CorruptData:
            raise
        except _DECODE_ERRORS as e:
            raise CorruptData(f"malformed footer: {e}", file=name) from e

    _PARSED = ("schema", "sort_column", "_layouts", "_index", "chunks", "num_rows", "info")

    @classmethod
    def _from_footer_bytes(
        cls,
        name: str,
        size: int,
        read_range: Callable[[int, int], Any],
        footer_bytes: Any,
        footer_start: int,
        version: int,
    ) -> PartReader:
        """A reader over a footer whose checksum matched: parsed, or (the same bytes at the
        same place were parsed before in this process) taken from `_FOOTERS`. Parsing is a
        pure function of the bytes, their place and the version, so a remembered parse is the
        parse; nothing that failed to parse is remembered. Readers of the same footer share
        what the parse made (schema, chunk index, layouts): no reader mutates them."""
        key = (version, footer_start, bytes(footer_bytes))
        parsed = _FOOTERS.get(key)
        if parsed is not None:
            reader = cls.__new__(cls)
            reader.name, reader.version, reader.size = name, version, size
            reader._read_range, reader._footer_start = read_range, footer_start
            values, metadata = parsed
            for attr, value in zip(cls._PARSED, values, strict=True):
                setattr(reader, attr, value)
            reader.metadata = dict(metadata)
            return reader
        try:
            footer = json.loads(key[2].decode("ascii"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CorruptData(f"footer is not JSON: {e}", file=name) from e
        if not isinstance(footer, dict):
            raise CorruptData("footer is not a JSON object", file=name)
        reader = cls(name, size, read_range, footer, footer_start, version)
        values = tuple(getattr(reader, attr) for attr in cls._PARSED)
        _FOOTERS.put(key, (values, dict(reader.metadata)), len(key[2]))
        return reader

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, name: str, size: int, read_range: Callable[[int, int], Any]) -> PartReader:
        """Open a part of `size` bytes; `read_range(offset, length)` returns those bytes."""
        if size < HEADER_SIZE + TAIL_SIZE:
            raise CorruptData(
                f"not a part: {size} bytes is shorter than a header and a tail "
                f"({HEADER_SIZE + TAIL_SIZE} bytes)",
                file=name,
            )
        fetch = min(size, TAIL_READ)
        buf = _fetch(read_range, name, size - fetch, fetch)
        footer_len, footer_crc, version, magic = TAIL.unpack_from(buf, fetch - TAIL_SIZE)
        if magic != MAGIC:
            raise CorruptData(
                f"not a part: tail magic is {bytes(magic)!r}, expected {MAGIC!r}", file=name
            )
        if version not in READ_VERSIONS:
            raise CorruptData(
                f"tail says format version {version}; this reader reads versions "
                f"{', '.join(map(str, READ_VERSIONS))}",
                file=name,
            )
        footer_start = size - TAIL_SIZE - footer_len
        if footer_start < HEADER_SIZE:
            raise CorruptData(f"footer length {footer_len} does not fit in {size} bytes", file=name)
        if footer_start >= size - fetch:
            rel = footer_start - (size - fetch)
            footer_bytes = buf[rel : rel + footer_len]
        else:
            footer_bytes = _fetch(read_range, name, footer_start, footer_len)
        actual = crc32c.crc32c(footer_bytes)
        if actual != footer_crc:
            raise CorruptData(
                f"footer checksum mismatch: stored {footer_crc:#010x}, computed {actual:#010x}",
                file=name,
            )
        if fetch == size:
            _check_header(buf, name, version)
        return cls._from_footer_bytes(name, size, read_range, footer_bytes, footer_start, version)

    @classmethod
    def from_bytes(cls, name: str, data: bytes | bytearray | memoryview | pa.Buffer) -> PartReader:
        """Open a part held in memory (no copy is made; keep `data` unchanged while reading)."""
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        _check_header(view[:HEADER_SIZE], name, None)

        def read_range(offset: int, length: int) -> memoryview:
            return view[offset : offset + length]

        return cls.open(name, len(view), read_range)

    def _parse_footer(self, footer: dict[str, Any]) -> None:
        name = self.name
        if footer["version"] != self.version:
            raise CorruptData(
                f"footer says format version {footer['version']!r}, the tail {self.version}",
                file=name,
            )
        if footer["codec"] != CODEC:
            raise CorruptData(f"unknown codec {footer['codec']!r}", file=name)
        self.schema = schema_from_json(footer["schema"])
        meta = footer["metadata"]
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ValueError("metadata must map strings to strings")
        self.metadata = dict(meta)
        sort_column = footer["sort_column"]
        if sort_column is not None and sort_column not in self.schema.names:
            raise ValueError(f"sort column {sort_column!r} is not in the schema")
        self.sort_column = sort_column
        key_type = self.schema.field(sort_column).type if sort_column is not None else None
        self._layouts = [chunk_codec.layout_of(f.type) for f in self.schema]
        self._index = {n: i for i, n in enumerate(self.schema.names)}
        ncols = len(self.schema)
        checkers = [stats.column_stats_checker(f.type) for f in self.schema]
        offset = HEADER_SIZE
        chunks: list[ChunkInfo] = []
        raw_keys: list[tuple[Any, Any]] = []
        if not isinstance(footer["chunks"], list):
            raise ValueError("chunks must be a list")
        for i, c in enumerate(footer["chunks"]):
            if _int(c, "offset") != offset:
                raise CorruptData(
                    f"chunk starts at {c['offset']}, expected {offset}", file=name, chunk=i
                )
            columns = c["columns"]
            if not isinstance(columns, list) or len(columns) != ncols:
                raise CorruptData(
                    f"chunk indexes {len(columns)} columns, schema has {ncols}", file=name, chunk=i
                )
            segments = []
            pos = offset
            entry_lengths = (3, 4) if self.version >= 3 else (3,)
            for col in columns:
                if not (
                    type(col) is list
                    and len(col) in entry_lengths
                    and all(type(v) is int for v in col)
                ):
                    raise ValueError(
                        "a column entry is [length, raw_length, crc32c], integers"
                        + (", then 1 for a plain segment" if self.version >= 3 else "")
                    )
                length, raw_length, crc = col[:3]
                if min(col) < 0 or crc > 0xFFFFFFFF:
                    raise ValueError(f"column entry {col} out of range")
                plain = len(col) == 4
                if plain and (col[3] != 1 or not 0 <= length - raw_length < 8):
                    raise ValueError(
                        f"plain column entry {col}: the marker must be 1 and the stored length "
                        "the payload's plus at most 7 bytes of padding"
                    )
                segments.append(Segment(pos, length, raw_length, crc, plain))
                pos += length
            length = _int(c, "length")
            if pos - offset != length:
                raise CorruptData(
                    f"chunk length {length} is not the sum of its columns", file=name, chunk=i
                )
            num_rows = _int(c, "num_rows")
            if num_rows == 0:
                raise CorruptData("chunk has no rows", file=name, chunk=i)
            min_time, max_time = (
                _int(c, "min_time", nullable=True),
                _int(c, "max_time", nullable=True),
            )
            raw = (c["key_min"], c["key_max"])
            if key_type is not None:
                stats.check_raw(raw[0], key_type)
                stats.check_raw(raw[1], key_type)
                key_min, key_max = stats.stats_to_py(raw[0], raw[1], key_type)
            elif raw != (None, None):
                raise ValueError("key statistics without a sort column")
            else:
                key_min = key_max = None
            column_stats = None
            if self.version >= 2:
                entries = c["stats"]
                if not isinstance(entries, list) or len(entries) != ncols:
                    raise ValueError("stats must hold one entry per column")
                column_stats = tuple(
                    check(e, num_rows) for check, e in zip(checkers, entries, strict=True)
                )
            chunks.append(
                ChunkInfo(
                    offset=offset,
                    length=length,
                    num_rows=num_rows,
                    min_time=min_time,
                    max_time=max_time,
                    key_min=key_min,
                    key_max=key_max,
                    key_null_count=_int(c, "key_null_count"),
                    segments=tuple(segments),
                    column_stats=column_stats,
                )
            )
            raw_keys.append(raw)
            offset += length
        if offset != self._footer_start:
            raise CorruptData(
                f"chunks end at {offset}, footer starts at {self._footer_start}", file=name
            )
        self.chunks = chunks
        self.num_rows = _int(footer, "num_rows")
        if self.num_rows != sum(c.num_rows for c in chunks):
            raise CorruptData(
                f"footer says {self.num_rows} rows, chunks hold {sum(c.num_rows for c in chunks)}",
                file=name,
            )
        self.info = _part_info(self.size, chunks, raw_keys, key_type)

    # -- reading --------------------------------------------------------------------------

    def _columns(self, columns: Sequence[str] | None) -> list[int]:
        if columns is None:
            return list(range(len(self.schema)))
        if isinstance(columns, str):
            raise TypeError("columns must be a sequence of names, not a string")
        missing = [c for c in columns if c not in self._index]
        if missing:
            raise KeyError(
                f"columns {missing} are not in part {self.name} (columns {self.schema.names})"
            )
        if len(set(columns)) != len(columns):
            raise ValueError(f"columns {list(columns)} name a column twice")
        return [self._index[c] for c in columns]

    def _chunk_indices(self, chunks: Sequence[int] | None) -> list[int]:
        if chunks is None:
            return list(range(len(self.chunks)))
        for i in chunks:
            if not 0 <= i < len(self.chunks):
                raise IndexError(
                    f"chunk {i} out of range: part {self.name} has {len(self.chunks)} chunks"
                )
        return list(chunks)

    def projected_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        """The schema of what `read(columns)` returns."""
        idx = self._columns(columns)
        return pa.schema([self.schema.field(i) for i in idx], metadata=self.schema.metadata)

    def _fetch_chunk(self, index: int, cols: list[int]) -> list[Any]:
        """The raw bytes of the given columns of one chunk. Segments share one get when the
        bytes between them are at most `HOLE_BYTES` and at most a quarter of what the get
        wants (those bytes are fetched and dropped: a get fetches at most 25% more than it
        needs)."""
        segs = self.chunks[index].segments
        out: dict[int, Any] = {}
        order = sorted(cols, key=lambda c: segs[c].offset)
        run: list[int] = []

        def flush() -> None:
            if not run:
                return
            start = segs[run[0]].offset
            end = segs[run[-1]].offset + segs[run[-1]].length
            data = _fetch(self._read_range, self.name, start, end - start, chunk=index)
            for c in run:
                rel = segs[c].offset - start
                out[c] = data[rel : rel + segs[c].length]
            run.clear()

        wanted = 0  # bytes of the run's segments
        for c in order:
            if run:
                gap = segs[c].offset - (segs[run[-1]].offset + segs[run[-1]].length)
                if gap > min(HOLE_BYTES, (wanted + segs[c].length) // 4):
                    flush()
                    wanted = 0
            run.append(c)
            wanted += segs[c].length
        flush()
        return [out[c] for c in cols]

    def _decode_segment(self, index: int, col: int, data: Any) -> pa.Array:
        seg = self.chunks[index].segments[col]
        column = self.schema.names[col]
        actual = crc32c.crc32c(data)
        if actual != seg.crc32c:
            raise CorruptData(
                f"checksum mismatch in column {column!r}: stored {seg.crc32c:#010x}, "
                f"computed {actual:#010x}",
                file=self.name,
                chunk=index,
            )
        try:
            if seg.plain:
                payload = _aligned(data, seg.length - seg.raw_length, seg.raw_length)
                layout = chunk_codec.unshuffled(self._layouts[col])
            else:
                payload = chunk_codec.decompress(data, seg.raw_length)
                layout = self._layouts[col]
            return chunk_codec.decode_payload(payload, layout, self.chunks[index].num_rows)
        except _DECODE_ERRORS as e:
            raise CorruptData(
                f"column {column!r} does not decode: {e}", file=self.name, chunk=index
            ) from e

    def _batch(self, index: int, cols: list[int], arrays: list[pa.Array]) -> pa.RecordBatch:
        schema = pa.schema([self.schema.field(i) for i in cols], metadata=self.schema.metadata)
        if not cols:
            empty = pa.StructArray.from_buffers(pa.struct([]), self.chunks[index].num_rows, [None])
            return pa.RecordBatch.from_struct_array(empty).replace_schema_metadata(
                self.schema.metadata
            )
        try:
            return pa.RecordBatch.from_arrays(arrays, schema=schema)
        except _DECODE_ERRORS as e:
            raise CorruptData(
                f"decoded columns do not form a batch: {e}", file=self.name, chunk=index
            ) from e

    def read_chunk(
        self, index: int, columns: Sequence[str] | None = None, *, in_thread: bool = False
    ) -> pa.RecordBatch:
        """One chunk's rows, only the named columns (all by default), in the order named.

        With ``in_thread`` every column is decoded in the calling thread, never in the shared
        pool: for callers that decode several chunks at once in threads of their own (the
        chunk is then their unit of parallelism), and that must not wait on the pool."""
        cols = self._columns(columns)
        (index,) = self._chunk_indices([index])
        return self._assemble((index, self._start_decode(index, cols, in_thread)), cols)

    def _start_decode(
        self, index: int, cols: list[int], in_thread: bool = False
    ) -> list[Future[pa.Array] | pa.Array]:
        """Fetch one chunk's columns and decode them: in this thread when small (or asked),
        else one pool task per column (zstd and the numpy copies release the GIL, so columns
        decode at once)."""
        raw = self._fetch_chunk(index, cols)
        segs = self.chunks[index].segments
        if in_thread or sum(segs[c].raw_length for c in cols) < _INLINE_DECODE_BYTES:
            return [self._decode_segment(index, c, d) for c, d in zip(cols, raw, strict=True)]
        pool = _executor()
        return [
            pool.submit(self._decode_segment, index, c, d) for c, d in zip(cols, raw, strict=True)
        ]

    def iter_batches(
        self, columns: Sequence[str] | None = None, chunks: Sequence[int] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """One batch per chunk (all chunks by default), in order; decodes a few chunks ahead."""
        cols = self._columns(columns)
        indices = self._chunk_indices(chunks)
        window: deque[tuple[int, list[Future[pa.Array] | pa.Array]]] = deque()
        lookahead = _WORKERS
        for index in indices:
            window.append((index, self._start_decode(index, cols)))
            if len(window) > lookahead:
                yield self._assemble(window.popleft(), cols)
        while window:
            yield self._assemble(window.popleft(), cols)

    def _assemble(
        self, entry: tuple[int, list[Future[pa.Array] | pa.Array]], cols: list[int]
    ) -> pa.RecordBatch:
        index, items = entry
        arrays = [i.result() if isinstance(i, Future) else i for i in items]
        return self._batch(index, cols, arrays)

    def read(
        self, columns: Sequence[str] | None = None, chunks: Sequence[int] | None = None
    ) -> pa.Table:
        """The rows of the given chunks (all by default) as one table, only the named columns."""
        schema = self.projected_schema(columns)
        return pa.Table.from_batches(list(self.iter_batches(columns, chunks)), schema=schema)

    def verify(self) -> None:
        """Check the header, every segment's checksum and decoding, and every chunk's stats."""
        _check_header(_fetch(self._read_range, self.name, 0, HEADER_SIZE), self.name, self.version)
        key_type = (
            self.schema.field(self.sort_column).type if self.sort_column is not None else None
        )
        for index, batch in enumerate(self.iter_batches()):
            info = self.chunks[index]
            if batch.num_rows != info.num_rows:
                raise CorruptData(
                    f"chunk decodes to {batch.num_rows} rows, footer says {info.num_rows}",
                    file=self.name,
                    chunk=index,
                )
            time_col = batch.column(TIME_COLUMN) if TIME_COLUMN in self._index else None
            key_col = batch.column(self.sort_column) if self.sort_column is not None else None
            min_time, max_time, key_min, key_max, nulls, raw_columns = _chunk_stats(
                time_col, key_col, batch.columns
            )
            if key_type is not None:
                key_min, key_max = stats.stats_to_py(key_min, key_max, key_type)
            found = (min_time, max_time, key_min, key_max, nulls)
            stored = (info.min_time, info.max_time, info.key_min, info.key_max, info.key_null_count)
            if found != stored:
                raise CorruptData(
                    f"chunk statistics {stored} do not match its data {found}",
                    file=self.name,
                    chunk=index,
                )
            if info.column_stats is not None:
                computed = tuple(
                    stats.check_column_stats(raw, f.type, info.num_rows)
                    for raw, f in zip(raw_columns, self.schema, strict=True)
                )
                if computed != info.column_stats:
                    raise CorruptData(
                        f"column statistics {info.column_stats} do not match its data {computed}",
                        file=self.name,
                        chunk=index,
                    )


def _fetch(
    read_range: Callable[[int, int], Any],
    name: str,
    offset: int,
    length: int,
    chunk: int | None = None,
) -> Any:
    data = read_range(offset, length)
    if len(data) != length:
        raise CorruptData(
            f"short read: asked for {length} bytes at offset {offset}, got {len(data)} "
            "(truncated file?)",
            file=name,
            chunk=chunk,
        )
    return data


def _check_header(data: Any, name: str, expected: int | None) -> None:
    """Check a header's magic and version (``expected``: the tail's; None: any readable)."""
    if len(data) < HEADER_SIZE:
        raise CorruptData(f"not a part: {len(data)} bytes is shorter than the header", file=name)
    magic, version = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptData(
            f"not a part: header magic is {bytes(magic)!r}, expected {MAGIC!r}", file=name
        )
    if version not in READ_VERSIONS:
        raise CorruptData(
            f"header says format version {version}; this reader reads versions "
            f"{', '.join(map(str, READ_VERSIONS))}",
            file=name,
        )
    if expected is not None and version != expected:
        raise CorruptData(f"header says format version {version}, the tail {expected}", file=name)
