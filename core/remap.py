"""Remap shard: durable bindings of source frontiers to shard times (reclocking, seed 003).

A source counts progress in its own time: a *source frontier* maps each source partition (a
string key such as ``"orders:0"``) to an offset upper; every record of that partition with a
smaller offset is covered. A remap shard is an ordinary `Shard` with the columns
``(partition STRING, offset BIGINT)`` whose contents as of *into-time* ``t`` are the frontier
bound at ``t``: one row per partition. A new binding at ``t`` retracts, at ``t``, the rows of
the partitions that moved and inserts their new offsets, so the remap shard gets time travel,
compaction and ``verify`` from the shard itself.

Invariants (kept by `RemapShard.mint`, the only writer):
- Bindings are monotone: a partition's bound offset never decreases from one into-time to
  the next, and a partition once bound stays bound (a later frontier that omits it keeps its
  offset).
- Every binding is one compare-and-append at the remap shard's upper ``u`` that moves the
  upper to ``u + 1``: of two minters racing for one into-time exactly one wins; the other gets
  `UpperMismatch` and nothing of it is written.
- Only bindings change the remap shard, so into-time ``upper - 1`` carries the newest frontier.

`Bindings` is one pinned state of the remap shard, read once; `Bindings.reclock` gives every
record ``(partition, offset)`` the smallest into-time whose frontier covers it, vectorized over
Arrow arrays, and refuses (`NotSealed`) a record no binding covers: it never guesses a time.

Relies on: the remap shard's since not passing the uppers of the outputs it serves (bindings
below since are merged into one at since, so records covered by them reclock to since).
`RemapShard.follow_since` advances it with the outputs' since, within that bound.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.rows import DIFF, TIME
from persistshard.core.shard import Shard, ShardAddress, open_shard
from persistshard.errors import InvalidOption, InvalidUpdates, NotSealed, UpperMismatch

log = logging.getLogger("persistshard.core.remap")

PARTITION = "partition"
OFFSET = "offset"
#: The columns of a remap shard (the user columns; ``_time`` and ``_diff`` are added).
REMAP_SCHEMA = pa.schema([pa.field(PARTITION, pa.string()), pa.field(OFFSET, pa.int64())])

Frontier = dict[str, int]


def check_frontier(frontier: Mapping[Any, Any], location: str | None = None) -> Frontier:
    """A validated copy of ``frontier``: string keys, non-negative integer offsets.

    A null or empty partition key, a null, non-integer or negative offset is `InvalidUpdates`
    naming the partition.
    """
    if not isinstance(frontier, Mapping):
        raise InvalidUpdates(
            f"a source frontier is a mapping partition -> offset upper, got "
            f"{type(frontier).__name__}",
            location=location,
        )
    out: Frontier = {}
    for key, value in frontier.items():
        if key is None or (isinstance(key, str) and key == ""):
            raise InvalidUpdates(
                f"a source frontier has a null or empty partition key (offset {value!r})",
                location=location,
            )
        if not isinstance(key, str):
            raise InvalidUpdates(
                f"partition key {key!r} must be a string (e.g. 'topic:0')", location=location
            )
        if value is None:
            raise InvalidUpdates(f"partition {key!r} has a null offset", location=location)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidUpdates(
                f"partition {key!r} has offset {value!r}, which is not an integer",
                location=location,
            )
        if value < 0:
            raise InvalidUpdates(
                f"partition {key!r} has negative offset {value}; offsets start at 0",
                location=location,
            )
        out[key] = int(value)
    return out


def join(*frontiers: Mapping[str, int]) -> Frontier:
    """The per-partition maximum of ``frontiers`` (the least frontier covering all of them)."""
    out: Frontier = {}
    for f in frontiers:
        for key, value in f.items():
            if value > out.get(key, -1):
                out[key] = value
    return out


def covers(big: Mapping[str, int], small: Mapping[str, int]) -> bool:
    """Whether ``big`` covers every record ``small`` covers."""
    return all(big.get(key, 0) >= value for key, value in small.items() if value > 0)


@dataclass(frozen=True)
class Bindings:
    """One pinned state of a remap shard: its upper, since and bindings, oldest first.

    ``bindings[i] = (t_i, F_i)``: frontier ``F_i`` is bound at into-time ``t_i``; the ``t_i``
    increase and the ``F_i`` grow (module invariants). Immutable, so it can be shipped to tasks.
    """

    location: str
    upper: int
    since: int
    bindings: tuple[tuple[int, Frontier], ...] = ()
    _index: dict[str, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def frontier_at(self, into_upper: int) -> Frontier:
        """The frontier bound at ``into_upper - 1``: what is complete before ``into_upper``
        (``{}`` when nothing is bound there). `NotSealed` beyond the remap shard's upper."""
        if into_upper > self.upper:
            raise NotSealed(
                into_upper - 1,
                self.upper,
                location=self.location,
                message=f"into-time {into_upper - 1} is not bound yet: the remap shard's upper "
                f"is {self.upper}",
            )
        out: Frontier = {}
        for t, f in self.bindings:
            if t >= into_upper:
                break
            out = f
        return dict(out)

    @property
    def frontier(self) -> Frontier:
        """The newest bound frontier (``{}`` before the first binding)."""
        return dict(self.bindings[-1][1]) if self.bindings else {}

    @property
    def last_time(self) -> int | None:
        """The into-time of the newest binding, or None before the first."""
        return self.bindings[-1][0] if self.bindings else None

    def sealable(self, held: Mapping[str, int], through: int) -> int:
        """The largest into-time ``s <= through`` whose frontier ``held`` covers, or -1."""
        best = -1
        for t, f in self.bindings:
            if t > through:
                break
            if covers(held, f):
                best = t
            else:
                break
        return best

    def _lookup(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        found = self._index.get(key)
        if found is None:
            bounds = [(t, f[key]) for t, f in self.bindings if key in f]
            times = np.array([t for t, _ in bounds], dtype=np.int64)
            offsets = np.array([o for _, o in bounds], dtype=np.int64)
            found = (offsets, times)
            self._index[key] = found
        return found

    def reclock(
        self,
        partitions: pa.Array | pa.ChunkedArray,
        offsets: pa.Array | pa.ChunkedArray,
        *,
        beyond: int | None = None,
    ) -> pa.Array:
        """For each record ``(partitions[i], offsets[i])``, the smallest into-time whose bound
        frontier covers it (``offset < F[partition]``), as an int64 array.

        A record no binding covers is `NotSealed`, unless ``beyond`` is given: then it gets
        ``beyond`` (the sink's provisional time, bound before its rows are committed). A null
        partition or offset and a negative offset are `InvalidUpdates`.
        """
        parts, offs = _check_records(partitions, offsets, self.location)
        n = len(offs)
        out = np.empty(n, dtype=np.int64)
        if n == 0:
            return pa.array(out)
        encoded = parts.dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        values = offs.to_numpy(zero_copy_only=False)
        for code, key in enumerate(encoded.dictionary.to_pylist()):
            mask = codes == code
            bounds, times = self._lookup(key)
            mine = values[mask]
            idx = np.searchsorted(bounds, mine, side="right")
            uncovered = idx >= len(bounds)
            if uncovered.any():
                if beyond is None:
                    worst = int(mine[uncovered].max())
                    bound = int(bounds[-1]) if len(bounds) else 0
                    raise NotSealed(
                        self.upper,
                        self.upper,
                        location=self.location,
                        message=f"partition {key!r} offset {worst} is not covered by any "
                        f"binding (bound offset upper {bound}, remap upper {self.upper}); "
                        "mint a frontier that covers it first",
                    )
                result = np.full(len(mine), beyond, dtype=np.int64)
                result[~uncovered] = times[idx[~uncovered]]
            else:
                result = times[idx]
            out[mask] = result
        return pa.array(out)


def _check_records(
    partitions: pa.Array | pa.ChunkedArray,
    offsets: pa.Array | pa.ChunkedArray,
    location: str | None,
) -> tuple[pa.Array, pa.Array]:
    """Partition keys as strings and offsets as int64, both without nulls; offsets >= 0."""
    parts = partitions.combine_chunks() if isinstance(partitions, pa.ChunkedArray) else partitions
    offs = offsets.combine_chunks() if isinstance(offsets, pa.ChunkedArray) else offsets
    if not isinstance(parts, pa.Array):
        parts = pa.array(parts)
    if not isinstance(offs, pa.Array):
        offs = pa.array(offs)
    if len(parts) != len(offs):
        raise InvalidUpdates(f"{len(parts)} partitions but {len(offs)} offsets", location=location)
    if pa.types.is_dictionary(parts.type):
        parts = parts.dictionary_decode()
    if pa.types.is_integer(parts.type):
        parts = pc.cast(parts, pa.string())
    elif not pa.types.is_string(parts.type):
        try:
            parts = pc.cast(parts, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidUpdates(
                f"source partitions must be strings or integers, got {parts.type}",
                location=location,
            ) from e
    if not pa.types.is_integer(offs.type):
        raise InvalidUpdates(f"source offsets must be integers, got {offs.type}", location=location)
    offs = pc.cast(offs, pa.int64())
    if parts.null_count:
        i = int(pc.index(pc.is_null(parts), True).as_py())
        raise InvalidUpdates(
            f"{parts.null_count} records have a null partition (the first at offset "
            f"{offs[i].as_py()})",
            location=location,
        )
    if offs.null_count:
        i = int(pc.index(pc.is_null(offs), True).as_py())
        raise InvalidUpdates(
            f"partition {parts[i].as_py()!r} has {offs.null_count} records with a null offset",
            location=location,
        )
    negative = pc.less(offs, 0)
    if pc.any(negative).as_py():
        i = int(pc.index(negative, True).as_py())
        raise InvalidUpdates(
            f"partition {parts[i].as_py()!r} has negative offset {offs[i].as_py()}; offsets "
            "start at 0",
            location=location,
        )
    return parts, offs


class RemapShard:
    """The remap shard at ``location`` (see the module docstring). Built on the public
    `Shard` API only: ``compare_and_append``, ``updates``, ``state``."""

    def __init__(self, location: str, **options: Any) -> None:
        """``options``: `persistshard.core.shard.open_shard`'s."""
        self.shard: Shard = open_shard(location, **options)
        self.location = self.shard.location
        self._cache: tuple[int, Bindings] | None = None

    @property
    def upper(self) -> int:
        return self.shard.upper

    def pinned(self) -> Bindings:
        """The bindings of the newest state version (read once per version)."""
        state = self.shard.inspect.state()
        if self._cache is not None and self._cache[0] == state.version:
            return self._cache[1]
        if state.schema is None or state.upper == 0:
            pinned = Bindings(self.location, state.upper, state.since)
        else:
            if state.schema != REMAP_SCHEMA:
                raise InvalidOption(
                    f"the shard at {self.location} is not a remap shard: its columns are "
                    f"{state.schema}, a remap shard has (partition string, offset int64)"
                )
            changes = self.shard.updates(0, state.upper)
            pinned = Bindings(
                self.location, state.upper, state.since, tuple(_fold_bindings(changes))
            )
        self._cache = (state.version, pinned)
        return pinned

    def bindings(self) -> list[tuple[int, Frontier]]:
        """``[(into_time, {partition: offset_upper}), ...]``, oldest first."""
        return [(t, dict(f)) for t, f in self.pinned().bindings]

    def source_upper_at(self, into_upper: int) -> Frontier:
        """The frontier bound at ``into_upper - 1``: what is complete before ``into_upper``."""
        return self.pinned().frontier_at(into_upper)

    def reclock(
        self, partitions: pa.Array | pa.ChunkedArray, offsets: pa.Array | pa.ChunkedArray
    ) -> pa.Array:
        """See `Bindings.reclock` (against the newest bindings)."""
        return self.pinned().reclock(partitions, offsets)

    def follow_since(self, outputs: Sequence[str | Shard], **storage_options: Any) -> int:
        """Advance the remap shard's since with its outputs' (so its bindings can be
        compacted, and its history does not grow without bound); the since reached.

        ``outputs`` must be every output shard this remap shard serves. The since moves to
        the smallest, over them, of the output's since and the output's upper minus one:
        never past an output's since (reads of an output at or after its since never look at
        older bindings) nor to the upper of any output (a restart resumes at the frontier
        bound at ``min(upper) - 1``, `resume_frontier`, which must stay exact). Reader holds
        on the remap shard hold it back as on any shard.
        """
        if not outputs:
            raise InvalidOption("follow_since needs every output shard the remap shard serves")
        states = [
            (o if isinstance(o, Shard) else open_shard(o, **storage_options)).inspect.state()
            for o in outputs
        ]
        target = min(min(s.since, max(0, s.upper - 1)) for s in states)
        target = min(target, max(0, self.shard.upper - 1))
        return self.shard.advance_since(target)

    def mint(self, frontier: Mapping[str, int]) -> int:
        """Bind ``frontier`` at the next into-time with one compare-and-append; return it.

        A partition below its bound offset is `InvalidUpdates` (nothing minted); a partition
        missing from ``frontier`` keeps its bound offset; a frontier that binds nothing new
        returns the newest into-time. A racing minter that took the into-time first makes this
        raise `UpperMismatch`.
        """
        return self.mint_at(frontier, expected_upper=None, join_current=False)

    def mint_at(
        self,
        frontier: Mapping[str, int],
        *,
        expected_upper: int | None,
        join_current: bool,
    ) -> int:
        """`mint`, against ``expected_upper`` (default: the upper read now); with
        ``join_current`` a partition below its bound offset keeps the bound offset instead of
        being an error (the sink's replay of an older stretch of the source)."""
        wanted = check_frontier(frontier, self.location)
        pinned = self.pinned()
        upper = pinned.upper if expected_upper is None else expected_upper
        if pinned.upper != upper:
            raise UpperMismatch(upper, pinned.upper, location=self.location)
        current = pinned.frontier
        if not join_current:
            for key, offset in sorted(wanted.items()):
                if offset < current.get(key, 0):
                    raise InvalidUpdates(
                        f"partition {key!r} would go back from offset {current[key]} to "
                        f"{offset}: a source frontier never goes backwards; nothing was minted",
                        location=self.location,
                    )
        merged = join(current, wanted)
        if merged == current:
            last = pinned.last_time
            if last is not None:
                return last
            if not merged:
                raise InvalidUpdates(
                    "nothing to bind: the frontier is empty and the remap shard has no binding",
                    location=self.location,
                )
        moved = sorted(k for k in merged if merged[k] != current.get(k))
        old = [k for k in moved if k in current]
        rows = {
            PARTITION: [*old, *moved],
            OFFSET: [*(current[k] for k in old), *(merged[k] for k in moved)],
            TIME: [upper] * (len(old) + len(moved)),
            DIFF: [-1] * len(old) + [1] * len(moved),
        }
        table = pa.table(
            rows,
            schema=pa.schema(
                [
                    *REMAP_SCHEMA,
                    pa.field(TIME, pa.int64(), False),
                    pa.field(DIFF, pa.int64(), False),
                ]
            ),
        )
        self.shard.compare_and_append(table, upper, upper + 1)
        log.debug(
            "%s: bound %s at into-time %d", self.location, {k: merged[k] for k in moved}, upper
        )
        self.shard._maybe_compact()
        return upper


def _fold_bindings(changes: pa.Table) -> list[tuple[int, Frontier]]:
    """Bindings from the remap shard's consolidated updates (sorted by row, then time)."""
    if changes.num_rows == 0:
        return []
    order = pc.sort_indices(changes, [(TIME, "ascending"), (DIFF, "ascending")])
    changes = changes.take(order)
    times = changes.column(TIME).to_pylist()
    keys = changes.column(PARTITION).to_pylist()
    offsets = changes.column(OFFSET).to_pylist()
    diffs = changes.column(DIFF).to_pylist()
    out: list[tuple[int, Frontier]] = []
    current: Frontier = {}
    for i, t in enumerate(times):
        if diffs[i] < 0:
            if current.get(keys[i]) == offsets[i]:
                del current[keys[i]]
        else:
            current[keys[i]] = offsets[i]
        if i + 1 == len(times) or times[i + 1] != t:
            out.append((t, dict(current)))
    return out


def open_remap(location: str, address: ShardAddress | None = None, **options: Any) -> RemapShard:
    """Open (or create on the first mint) the remap shard at ``location``; with ``address``
    (the data shard's), with its storage options, consensus and configuration."""
    if address is not None:
        options = {
            "consensus": address.consensus,
            "config": address.config,
            **address.storage_options,
            **options,
        }
    return RemapShard(location, **options)


def resume_frontier(
    remap_location: str | RemapShard, outputs: Sequence[str | Shard], **storage_options: Any
) -> Frontier:
    """The source frontier at the smallest upper over ``outputs``: where a restart resumes.

    Every output holds every record below this frontier (its upper covers the into-time it is
    bound at), so a source restarted here misses nothing, and the records it re-reads reclock
    below each output's upper and are dropped there.
    """
    if not outputs:
        raise InvalidOption("resume_frontier needs at least one output shard")
    remap = (
        remap_location
        if isinstance(remap_location, RemapShard)
        else open_remap(remap_location, **storage_options)
    )
    uppers = [
        (o if isinstance(o, Shard) else open_shard(o, **storage_options)).upper for o in outputs
    ]
    return remap.source_upper_at(min(uppers))


_KAFKA_KEY = re.compile(r"^(.+):(\d+)$")


def offsets_json(frontier: Mapping[str, int]) -> str:
    """A frontier as Kafka's ``startingOffsets`` JSON (``{"topic": {"0": 120}}``) when every
    key is ``topic:partition``, else as ``{partition: offset}``; ``"earliest"`` when empty."""
    if not frontier:
        return "earliest"
    matches = {key: _KAFKA_KEY.match(key) for key in frontier}
    if all(matches.values()):
        topics: dict[str, dict[str, int]] = {}
        for key, offset in sorted(frontier.items()):
            m = matches[key]
            assert m is not None
            topics.setdefault(m.group(1), {})[str(int(m.group(2)))] = int(offset)
        return json.dumps(topics, sort_keys=True)
    return json.dumps({k: int(v) for k, v in sorted(frontier.items())}, sort_keys=True)


def resume_offsets(output: str, *, remap: str, **storage_options: Any) -> str:
    """Where a stream into ``output`` restarts, as ``startingOffsets`` JSON (`offsets_json`)."""
    return offsets_json(resume_frontier(remap, [output], **storage_options))


__all__ = [
    "OFFSET",
    "PARTITION",
    "REMAP_SCHEMA",
    "Bindings",
    "Frontier",
    "RemapShard",
    "check_frontier",
    "covers",
    "join",
    "offsets_json",
    "open_remap",
    "resume_frontier",
    "resume_offsets",
]
