"""Parts on blob storage: writing sorted, consolidated updates as part files and reading them.

This is the only module of `core` that talks to `persistshard.format`. Invariants:
- A part is written once, under a key no other part uses (``parts/<write id>/<uuid>.part``),
  with a single ``put``; it is sorted by (row, time) and consolidated.
- Parts are read with ranged gets: the footer first, then only the chunks and columns needed.
- A small part may be *inline* (`PartRef.inline`): its bytes, in the same format, travel in
  the commit instead of a file (``write_part(..., inline_max=n)``), and `open_part` reads them
  from memory, so every reader of parts (reads, scans, listen, compaction) treats it like a
  file. The writer keeps a state's inline bytes under a cap (`fit_inline`: beyond it, inline
  parts are stored as files before the commit), and compaction writes files only, so it moves
  inline data into parts.
- A part is read *as its reference says* (`adapt_part_table`): a ``rewrite_time`` replaces
  every stored time (a rebased plain append), and columns the shard gained after the part
  was written (schema evolution) read as nulls. Every reader of parts goes through it.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import ShardConfig
from persistshard.core.rows import TIME, row_columns, sort_table
from persistshard.core.statemachine.state import MAX_INLINE_PART_BYTES, PartRef, ShardState
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.layout import part_key
from persistshard.core.storage.metrics import run_in_context
from persistshard.core.storage.recent import RECENT
from persistshard.errors import (
    CorruptData,
    InvalidUpdates,
    PersistShardError,
    is_storage_error,
    storage_error,
)
from persistshard.format import PartInfo, PartReader, encode_part

log = logging.getLogger("persistshard.core.storage.parts")


class PutsBehind:
    """Puts a writer's parts on a thread of their own while the writer encodes the next one.

    A put to local files returns once its bytes and directory entry are synced, which for a
    large part is the disk writing it back: done in line, the encoder waits for it; done
    here, the sync of one part overlaps the encoding of the next. At most ``depth`` encoded
    parts wait or are being put (memory: that many parts). `close` waits for every put and
    raises the first failure: only then are the parts stored, so a writer commits nothing
    before it (a failed put fails the write, whose other parts gc sweeps as any failed
    write's). Use as a context manager; leaving it on an error still waits for the puts
    under way (never a put running after its write gave up). The thread counts its requests
    into the caller's operation (`run_in_context`)."""

    def __init__(self, blob: Blob, depth: int = 1) -> None:
        self._blob = blob
        self._depth = max(1, depth)
        self._pending: deque[threading.Thread] = deque()
        self._errors: list[BaseException] = []

    def put(self, key: str, data: bytes) -> None:
        self._wait(self._depth - 1)
        self._raise()
        put = run_in_context(self._put)
        thread = threading.Thread(target=put, args=(key, data), name="persistshard-put")
        thread.start()
        self._pending.append(thread)

    def _put(self, key: str, data: bytes) -> None:
        try:
            self._blob.put(key, data)
        except BaseException as e:  # handed to the writer's thread by `close`
            self._errors.append(e)

    def _wait(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._pending.popleft().join()

    def _raise(self) -> None:
        if self._errors:
            raise self._errors[0]

    def close(self) -> None:
        """Wait for every put; raise the first that failed."""
        self._wait(0)
        self._raise()

    def __enter__(self) -> PutsBehind:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._wait(0)  # the write failed: let the puts under way end, report its error


def written_ref(key: str, size: int, info: PartInfo) -> PartRef:
    """The reference to a part of ``size`` bytes just written under ``key``, from the summary
    its writer returned (a part without times reads as at time 0)."""
    return PartRef(
        key=key,
        size=size,
        num_rows=info.num_rows,
        min_time=info.min_time if info.min_time is not None else 0,
        max_time=info.max_time if info.max_time is not None else 0,
    )


def write_part(
    blob: Blob,
    write_id: str,
    table: pa.Table,
    *,
    config: ShardConfig,
    metadata: dict[str, str] | None = None,
    inline_max: int = 0,
    puts: PutsBehind | None = None,
    hold: bool = False,
) -> PartRef:
    """Write one part of ``table`` (already sorted by (row, time) and consolidated), in
    chunks of ``config.chunk_bytes``; when its
    bytes are at most ``inline_max``, return them as an inline part instead (nothing stored).
    With ``puts`` the part is put behind (`PutsBehind`): stored only once ``puts`` closes.
    With ``hold`` a small part's updates are kept decoded for this process's compaction
    (`persistshard.core.storage.recent`)."""
    columns = row_columns(table.schema)
    data, info = encode_part(
        table,
        sort_column=columns[0] if columns else None,
        chunk_bytes=config.chunk_bytes,
        metadata=metadata,
    )
    ref = written_ref(part_key(write_id), len(data), info)
    if hold:
        RECENT.hold(blob.url, ref, table)
    if len(data) <= min(inline_max, MAX_INLINE_PART_BYTES):
        return replace(ref, inline=bytes(data), inline_crc=crc32c.crc32c(data))
    if puts is not None:
        puts.put(ref.key, data)
    else:
        blob.put(ref.key, data)
    log.debug("wrote part %s: %d rows, %d bytes", ref.key, table.num_rows, len(data))
    return ref


def store_inline(blob: Blob, ref: PartRef) -> PartRef:
    """``ref`` as a part file: an inline part's bytes are put under its key (unchanged
    otherwise)."""
    if ref.inline is None:
        return ref
    blob.put(ref.key, ref.inline)
    return ref.stored()


def fit_inline(
    blob: Blob, refs: Sequence[PartRef], state: ShardState, *, limit: int, cap: int
) -> list[PartRef]:
    """``refs`` to commit on top of ``state``: inline parts stay inline only while each is at
    most ``limit`` bytes and ``state``'s inline bytes plus theirs stay within ``cap``; the
    others are stored as files first (one put each). So a writer never grows a state's inline
    bytes past its cap (racing writers may each add up to ``limit`` beyond it)."""
    room = cap - state.inline_bytes()
    out = []
    for ref in refs:
        if ref.inline is not None and ref.size <= limit and ref.size <= room:
            room -= ref.size
            out.append(ref)
        else:
            out.append(store_inline(blob, ref))
    return out


def write_parts(
    blob: Blob,
    write_id: str,
    table: pa.Table,
    *,
    config: ShardConfig,
    inline_max: int = 0,
    hold: bool = False,
) -> list[PartRef]:
    """Write ``table`` (sorted, consolidated) as parts of at most about ``config.part_bytes``;
    a table that encodes to at most ``inline_max`` bytes is one inline part (nothing stored).
    ``hold``: see `write_part` (only a table written as one part can be small enough)."""
    if table.num_rows == 0:
        return []
    if inline_max > 0 and table.nbytes <= 4 * inline_max:
        return [write_part(blob, write_id, table, config=config, inline_max=inline_max, hold=hold)]
    n_parts = max(1, -(-table.nbytes // config.part_bytes))
    step = -(-table.num_rows // n_parts)
    if n_parts == 1:
        return [write_part(blob, write_id, table, config=config, hold=hold)]
    with PutsBehind(blob) as puts:  # each part's sync overlaps the next one's encoding
        return [
            write_part(blob, write_id, table.slice(start, step), config=config, puts=puts)
            for start in range(0, table.num_rows, step)
        ]


class PartSink:
    """Turns a stream of consolidated batches into sorted parts of bounded size.

    Batches arrive consolidated as a whole and sorted by (time, row), as a Correction buffer
    yields them; they are gathered up to ``part_bytes`` (default the configuration's) and
    each gathering is sorted by
    (row, time) (unless it holds a single time, when it already is) and written as one part.
    Memory: about two gatherings (one being sorted).
    Because the input is consolidated as a whole, so is every slice of it.
    """

    def __init__(
        self, blob: Blob, write_id: str, *, config: ShardConfig, part_bytes: int | None = None
    ) -> None:
        self.blob = blob
        self.write_id = write_id
        self.config = config
        self.part_bytes = config.part_bytes if part_bytes is None else part_bytes
        self.parts: list[PartRef] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self.part_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending)
        self._pending, self._pending_bytes = [], 0
        times = table.column(TIME)
        if pc.min(times).as_py() != pc.max(times).as_py():
            table = sort_table(table, row_columns(table.schema), "row_time")
        # else: one time, so the input's (time, row) order is already (row, time) order.
        self.parts.append(write_part(self.blob, self.write_id, table, config=self.config))

    def close(self) -> list[PartRef]:
        self.flush()
        return self.parts


def part_blob(blob: Blob, ref: PartRef) -> Blob:
    """The store ``ref`` lives in: ``blob`` (the shard's), or for a part another shard owns
    (``ref.source``, a fork naming its source's part) that shard's (`Blob.sibling`)."""
    return blob.sibling(ref.source.location) if ref.source is not None else blob


def open_part(
    blob: Blob,
    ref: PartRef,
    *,
    mapped: bool = False,
    on_map: Callable[[mmap.mmap], None] | None = None,
) -> PartReader:
    """A reader over ``ref`` that fetches bytes with ranged gets.

    A part the state references but the storage lacks is `CorruptData` naming it, with
    ``missing`` set (the state promises it exists: something deleted it), never a raw
    ``FileNotFoundError``. Whether that is damage or a read that outlived its version (gc
    collected it) only the newest state can tell: readers that pinned a version ask
    `persistshard.core.read.race`. An inline part is read from its bytes in the state (no
    request).

    With ``mapped``, a part in a local directory (``blob.local_file``) is memory-mapped on its
    first read and every range is a view of the mapping: no copy into a new buffer (the
    decompressor reads the page cache directly). The mapping (and its file descriptor) lives
    as long as the reader or a view of it. Relies on: a part file is never truncated or
    rewritten in place (parts are published by rename and removed by unlink, which leave a
    mapping intact); a file shorter than asked gives a short view, which the reader reports
    as `CorruptData`. Any other storage, or a file that cannot be mapped, reads as without.
    ``on_map`` is told of the mapping when it is made (`release_mapped` can then give its
    pages back).

    A part another shard owns (``ref.source``, a fork naming its source's part) is read from
    that shard's store (`Blob.sibling`), under its own key there.
    """
    if ref.inline is not None:
        return PartReader.from_bytes(ref.key, ref.inline)
    blob = part_blob(blob, ref)

    def fetch(offset: int, length: int) -> bytes:
        try:
            return blob.get_range(ref.key, offset, length)
        except FileNotFoundError:
            raise CorruptData(
                f"part {ref.key} is referenced by the shard's state but missing from storage",
                file=ref.key,
                location=blob.url,
                missing=True,
            ) from None

    local = getattr(blob, "local_file", None)
    path = local(ref.key) if mapped and local is not None else None
    if path is None:
        return PartReader.open(ref.key, ref.size, fetch)
    mapping: list[mmap.mmap | None] = []

    def fetch_mapped(offset: int, length: int) -> Any:
        if not mapping:
            try:
                with open(path, "rb") as f:
                    mapping.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                if on_map is not None and mapping[0] is not None:
                    on_map(mapping[0])
            except (OSError, ValueError):  # missing (fetch says so), empty, or unmappable
                mapping.append(None)
        mm = mapping[0]
        if mm is None:
            return fetch(offset, length)
        return memoryview(mm)[offset : offset + length]

    return PartReader.open(ref.key, ref.size, fetch_mapped)


def release_mapped(mappings: Iterable[mmap.mmap]) -> None:
    """Give back the resident pages of ``mappings`` (read-only maps of immutable part files):
    the process's resident set no longer counts the parts a streamed read went through. Safe
    while views of them live: a page touched again is read back from the file (or the page
    cache), unchanged."""
    dontneed = getattr(mmap, "MADV_DONTNEED", None)
    if dontneed is None:
        return
    for mm in mappings:
        try:
            mm.madvise(dontneed)
        except (ValueError, OSError):  # closed, or a platform that refuses: nothing to give
            pass


def adapt_part_table(table: pa.Table, ref: PartRef, schema: pa.Schema) -> pa.Table:
    """Rows of part ``ref`` as updates of ``schema``: times rewritten when the reference says
    so, columns the part lacks added as nulls, order and types those of ``schema``."""
    if ref.rewrite_time is not None and TIME in table.column_names:
        index = table.schema.get_field_index(TIME)
        times = pa.array(np.full(table.num_rows, ref.rewrite_time, dtype=np.int64))
        table = table.set_column(index, table.schema.field(index), times)
    return conform_columns(table, schema)


def conform_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with the columns of ``schema`` in its order and types; columns it lacks (added
    to the shard after it was written) are nulls."""
    if table.schema == schema:
        return table
    names = set(table.column_names)
    if all(f.name in names for f in schema):
        if table.column_names != schema.names:
            table = table.select(schema.names)
        return table if table.schema == schema else table.cast(schema)
    arrays = [
        table.column(f.name) if f.name in names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=pa.schema(list(schema))).cast(schema)


def read_part(
    blob: Blob,
    ref: PartRef,
    *,
    columns: Sequence[str] | None = None,
    min_time: int | None = None,
    max_time: int | None = None,
) -> pa.Table:
    """The rows of ``ref`` with ``min_time <= _time <= max_time`` (bounds optional)."""
    reader = open_part(blob, ref)
    chunks = [
        i
        for i, c in enumerate(reader.chunks)
        if ref.rewrite_time is not None  # stored times are not the times read
        or (
            (max_time is None or c.min_time is None or c.min_time <= max_time)
            and (min_time is None or c.max_time is None or c.max_time >= min_time)
        )
    ]
    table = reader.read(columns=columns, chunks=chunks)
    if ref.rewrite_time is not None:
        table = adapt_part_table(table, ref, table.schema)
    if table.num_rows and TIME in table.column_names:
        lo_ok = min_time is None or ref.min_time >= min_time
        hi_ok = max_time is None or ref.max_time <= max_time
        if not (lo_ok and hi_ok):
            mask = None
            times = table.column(TIME)
            if min_time is not None:
                mask = pc.greater_equal(times, min_time)
            if max_time is not None:
                upper_mask = pc.less_equal(times, max_time)
                mask = upper_mask if mask is None else pc.and_(mask, upper_mask)
            table = table.filter(mask)
    return table


def read_parts(
    blob: Blob,
    refs: Iterable[PartRef],
    schema: pa.Schema,
    *,
    min_time: int | None = None,
    max_time: int | None = None,
    threads: int = 4,
) -> pa.Table:
    """All rows of ``refs`` within the time bounds, concatenated (no consolidation)."""
    wanted = [
        r
        for r in refs
        if r.num_rows
        and (max_time is None or r.min_time <= max_time)
        and (min_time is None or r.max_time >= min_time)
    ]
    if not wanted:
        return schema.empty_table()
    if len(wanted) == 1:
        tables = [read_part(blob, wanted[0], min_time=min_time, max_time=max_time)]
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(wanted))) as pool:
            tables = list(
                pool.map(
                    run_in_context(
                        lambda r: read_part(blob, r, min_time=min_time, max_time=max_time)
                    ),
                    wanted,
                )
            )
    return pa.concat_tables(
        [adapt_part_table(t, r, schema) for t, r in zip(tables, wanted, strict=True)]
    )


#: A group of parts a commit names and the times their updates must lie in: ``(parts, lower,
#: upper)``, every time ``t`` of every part with ``lower <= t < upper`` (None: unbounded).
PartsWithin = tuple[Sequence[PartRef], int | None, int | None]

#: At most this many write directories are listed at once by `check_parts`.
CHECK_THREADS = 16


def check_parts(
    blob: Blob,
    groups: Sequence[PartsWithin],
    *,
    location: str,
    threads: int = CHECK_THREADS,
) -> None:
    """Check parts that a commit is about to name but that this process did not write (Spark
    task messages, an external caller's `WrittenUpdates`); raise before anything is committed.

    - Times: each part's recorded update times (``min_time``..``max_time``, or its
      ``rewrite_time``) lie inside its group's ``[lower, upper)``; a part without rows has
      none. Else `InvalidUpdates` naming the part, its times and the bounds. No request.
    - Stored parts (not inline): present, with the recorded ``size``. Else `CorruptData`
      naming the part (the commit records what the storage does not hold: a length that does
      not match, or a file that is gone, is what `CorruptData` means, and what every reader
      of the commit would have met). One listing per write directory (``parts/<write id>/``,
      the directory of the key), the directories listed in parallel (``threads``): a commit of
      many parts from few writes costs a few requests, not one per part. A listing the
      storage refuses or fails is `StorageError`.

    Determinate: on any error nothing was committed and nothing was deleted (the caller's
    parts stay; gc sweeps those no commit names once their write's lease is over).
    Relies on: a part is written once under a fresh key and never rewritten, so its listed
    size is its size; a listing holds every object put before it began (read-after-write
    listing: local files, S3 since 2020).
    """
    for parts, lower, upper in groups:
        for ref in parts:
            if ref.num_rows == 0:
                continue
            lo, hi = ref.min_time, ref.max_time
            if ref.rewrite_time is not None:
                lo = hi = ref.rewrite_time
            if (lower is not None and lo < lower) or (upper is not None and hi >= upper):
                low = "-inf" if lower is None else str(lower)
                bounds = f"[{low}, {'inf' if upper is None else upper})"
                raise InvalidUpdates(
                    f"commit refused, nothing applied: part {ref.key} holds update times "
                    f"{lo}..{hi}, outside its batch's times {bounds} (a task that wrote at "
                    "another upper than the commit's, or a part reference built by hand)",
                    location=location,
                )
    by_dir: dict[str, list[PartRef]] = {}
    for parts, _, _ in groups:
        for ref in parts:
            if ref.inline is None:
                by_dir.setdefault(ref.key.rpartition("/")[0] + "/", []).append(ref)
    if not by_dir:
        return

    def listed(directory: str) -> dict[str, int]:
        return {m.key: m.size for m in blob.list(directory)}

    try:
        if len(by_dir) == 1:
            sizes = [listed(next(iter(by_dir)))]
        else:
            with ThreadPoolExecutor(max_workers=max(1, min(threads, len(by_dir)))) as pool:
                sizes = list(pool.map(run_in_context(listed), by_dir))
    except PersistShardError:
        raise
    except Exception as e:
        if not is_storage_error(e):
            raise
        raise storage_error(e, location, "check the parts of a commit") from e
    problems: list[tuple[PartRef, str]] = []
    for refs, found in zip(by_dir.values(), sizes, strict=True):
        for ref in refs:
            size = found.get(ref.key)
            if size is None:
                problems.append((ref, f"part {ref.key} is missing from storage"))
            elif size != ref.size:
                problems.append(
                    (ref, f"part {ref.key} has {size} bytes, the commit records {ref.size}")
                )
    if problems:
        ref, first = problems[0]
        more = f" (and {len(problems) - 1} more such parts)" if len(problems) > 1 else ""
        log.warning("%s: a commit names %d unsound parts: %s", location, len(problems), first)
        raise CorruptData(
            f"commit refused, nothing applied: {first}{more}; the parts a commit names must be "
            "stored as their writer reported (deleted by someone, a write whose lease ran out "
            "and gc swept, or another store than the shard's?)",
            file=ref.key,
            location=location,
        )
