"""Parts this process wrote moments ago, kept decoded for its own compaction.

Writer-triggered compaction (`persistshard.core.maintenance.compact.maybe_compact`, run
after each append) mostly merges batches the same process has just written: eight 1,000-row
appends become one batch, eight of those become another. Reading them back costs a get, a
footer parse and a decode per part, for updates the process held in memory a moment before.
`RECENT` keeps the updates of small parts written by the Python write path
(`persistshard.core.write.transaction.WriteTransaction.write_updates`) and by compaction's own
outputs, decoded, under (storage URL, part key), and a merge takes its inputs from here when it
finds them (`held`). On S3 this saves a request per input part; on local files the open, the
footer and the decode (about 40% of a merge of eight 1,000-row batches).

Invariants:
- An entry is exactly the table that was encoded into the part under its key (the stored
  schema, the stored row order, before any time rewrite or schema adaptation), with the
  part's size. Part keys are never reused (each names a fresh id), so an entry never goes
  stale: it is what a correct read of that part returns, and the merge adapts it the way
  it adapts a decoded chunk (`persistshard.core.storage.parts.adapt_part_table`).
- Only compaction inputs come from here; every other read (scans, snapshots, listen, change
  reads) reads storage and checks every checksum. A merge over an entry writes the updates
  that were acknowledged even if the stored copy was damaged since; the damaged part is then
  unreferenced, and gc removes it.
- Bounded: a part whose decoded buffers pass `RECENT_PART_BYTES` is not kept, at most
  `RECENT_BYTES` are kept in all, and the least recently used entry goes first. An entry is
  dropped as soon as a merge replaced its part in the state (`forget`), so in steady state
  it holds only the small batches not yet merged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.rows import TIME
from persistshard.core.statemachine.state import PartRef
from persistshard.format.memo import BytesMemo

#: A part whose decoded buffers are larger than this is never kept (merges of large parts
#: are decode-light per row; their cost is sorting and encoding).
RECENT_PART_BYTES = 4 << 20
#: At most this many decoded bytes are kept per process.
RECENT_BYTES = 32 << 20
#: At most this many parts are kept per process.
RECENT_PARTS = 4096


@dataclass(frozen=True)
class HeldChunk:
    """What a merge asks of a chunk's index entry (`persistshard.format.part.ChunkInfo`)."""

    num_rows: int
    min_time: int | None
    max_time: int | None
    length: int


def _time_bounds(batch: pa.RecordBatch) -> tuple[int | None, int | None]:
    if TIME not in batch.schema.names or batch.num_rows == 0:
        return None, None
    bounds = pc.min_max(batch.column(TIME))
    return bounds["min"].as_py(), bounds["max"].as_py()


class HeldPart:
    """A kept part, read the way a merge reads a `persistshard.format.PartReader`: in chunks
    of about ``chunk_bytes`` decoded bytes (so a merge's memory bound, a chunk per input,
    holds for kept inputs too), each with its row count, times and a share of the part's
    stored size as its ``length`` (what a merge counts as bytes read)."""

    def __init__(self, key: str, entry: _Entry, chunk_bytes: int) -> None:
        self.name = key
        self.size = entry.size
        batch = entry.batch
        n = batch.num_rows
        step = max(1, min(n, int(chunk_bytes // max(1.0, entry.nbytes / max(1, n)))))
        if step >= n:
            self._pieces = [batch]
            self.chunks = [HeldChunk(n, entry.min_time, entry.max_time, entry.size)]
            return
        self._pieces = [batch.slice(start, step) for start in range(0, n, step)]
        self.chunks = [
            HeldChunk(p.num_rows, *_time_bounds(p), entry.size * p.num_rows // n)
            for p in self._pieces
        ]

    def read_chunk(self, index: int) -> pa.RecordBatch:
        return self._pieces[index]


@dataclass(frozen=True)
class _Entry:
    batch: pa.RecordBatch
    size: int  # the part's stored bytes
    nbytes: int  # the batch's decoded bytes
    min_time: int | None
    max_time: int | None


class RecentParts:
    """The process's kept parts (see the module docstring); thread-safe."""

    def __init__(
        self,
        part_bytes: int = RECENT_PART_BYTES,
        total_bytes: int = RECENT_BYTES,
        parts: int = RECENT_PARTS,
    ) -> None:
        self._memo: BytesMemo[_Entry] = BytesMemo(parts, part_bytes, total_bytes)

    @property
    def bytes(self) -> int:
        """Decoded bytes kept now."""
        return self._memo.bytes

    def __len__(self) -> int:
        return len(self._memo)

    def fits(self, nbytes: int) -> bool:
        """Whether a part of ``nbytes`` decoded bytes would be kept."""
        return 0 < nbytes <= self._memo.max_bytes

    def hold(self, url: str, ref: PartRef, table: pa.Table) -> None:
        """Keep ``table``, the updates just encoded into part ``ref`` at storage ``url``
        (nothing is kept when it is empty or too large)."""
        if table.num_rows == 0 or not self.fits(table.nbytes):
            return
        batch = table.combine_chunks().to_batches()
        if len(batch) != 1:
            return
        size = batch[0].get_total_buffer_size()  # a slice keeps its whole buffers alive
        if not self.fits(size):
            return
        entry = _Entry(batch[0], ref.size, batch[0].nbytes, *_time_bounds(batch[0]))
        self._memo.put((url, ref.key), entry, size)

    def held(self, url: str, ref: PartRef, chunk_bytes: int) -> HeldPart | None:
        """The kept part ``ref`` at ``url``, read in chunks of about ``chunk_bytes``; None
        when it is not kept (or, never expected, kept with another size or row count)."""
        found = self._memo.get((url, ref.key))
        if found is None or found.size != ref.size or found.batch.num_rows != ref.num_rows:
            return None
        return HeldPart(ref.key, found, chunk_bytes)

    def forget(self, url: str, keys: Iterable[str]) -> None:
        """Drop the entries of ``keys`` at ``url`` (parts a commit replaced or deleted)."""
        for key in keys:
            self._memo.forget((url, key))

    def clear(self) -> None:
        self._memo.clear()


#: The process's kept parts.
RECENT = RecentParts()
