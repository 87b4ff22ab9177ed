"""Upserts by key: each incoming row replaces the current row with the same key.

An *upsert* is a set of incoming rows, each either an upsert (diff ``+1``: "the row with this
key is now this one") or a delete (diff ``-1``: "no row has this key any more"), written at
one new time ``t`` (the shard's upper, which moves to ``t + 1``). What is committed at ``t``
is the difference between the desired rows and the current ones, and nothing else:

    delta(t) = desired - current
    desired  = the upserted rows (diff +1 each)
    current  = the snapshot at t - 1, restricted to the incoming keys (with its diffs)

so an unchanged row costs nothing, a changed row is a retraction and an insertion, and a
deleted key is a retraction. The two are consolidated in a `Correction` buffer (seed 000:
desired minus what persist already holds).

Invariants kept:
- *Key uniqueness*: after an upsert, no snapshot row shares a touched key with another row,
  and every touched key has a net count of 0 (deleted) or 1 (upserted). A shard written only
  by upserts therefore never holds two rows with one key. (Plain appends can still add rows
  with any key; the next upsert of that key retracts them all.)
- *Incoming keys are unique*: two incoming rows with one key in one upsert are refused with
  `InvalidUpdates` naming a duplicated key; nothing is written.
- *Key columns exist, are non-null and keep their name*: they must be columns of the shard of
  a type with exact equality (integers, strings, binary, booleans, dates, timestamps,
  decimals); a null key is refused. The first upsert records the key columns in the shard's
  schema metadata (`KEY_COLUMNS_METADATA`), committed with the upsert itself; later upserts
  naming other key columns are refused.
- An upsert is a read-modify-write of the state it read: it commits with ``expected_upper``
  equal to that state's upper, so a concurrent commit makes it fail with `UpperMismatch`
  (nothing written) and it is recomputed against the newer state (`Shard.upsert` retries).

Lookup without full scans. The current rows of the incoming keys are read only from chunks
whose per-column statistics (min/max in every v2 part footer, `persistshard.format.stats`)
admit at least one incoming key in every key column (`KeyProbe`); the rows of those chunks
are semi-joined with the incoming keys before they are consolidated. Chunks are about 8 MiB
of uncompressed rows sorted by the shard's first column, so keys that are close together in
that order (recent ids, one customer's rows) touch few chunks; keys spread uniformly over the
whole key space touch every chunk, and then the lookup reads the table once (still without
writing it).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.config import ShardConfig
from persistshard.core.read.filters import chunk_stats
from persistshard.core.read.plan import (
    PartSlice,
    Query,
    ReadTask,
    load_updates,
    relevant_parts,
)
from persistshard.core.rows import DIFF, TIME, consolidate, snapshot_of
from persistshard.core.statemachine.state import PartRef, ShardState
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.metrics import run_in_context
from persistshard.core.storage.parts import conform_columns, open_part, write_parts
from persistshard.core.write.correction import Correction
from persistshard.core.write.validate import (
    match_columns,
    stored_columns,
    update_schema,
    user_schema,
)
from persistshard.errors import InvalidOption, InvalidUpdates

log = logging.getLogger("persistshard.core.upsert")

__all__ = [
    "KEY_COLUMNS_METADATA",
    "KeyProbe",
    "LookupStats",
    "check_keys",
    "check_unique_keys",
    "current_rows",
    "delta_parts",
    "parse_key_columns",
    "prepare",
    "recorded_key_columns",
    "resolve_key_columns",
    "upsert_delta",
    "upsert_input",
    "with_key_columns",
]

#: Schema metadata key under which a shard records the key columns of its upserts
#: (comma-separated names).
KEY_COLUMNS_METADATA = b"persistshard.key_columns"

#: Types whose values compare exactly (no NaN, no -0.0), so a key of them is well defined.
_KEY_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_fixed_size_binary,
    pa.types.is_boolean,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_decimal,
)


def parse_key_columns(value: str | Sequence[str], location: str | None = None) -> tuple[str, ...]:
    """Key column names from ``"a, b"`` or a sequence; refuses empty and repeated names."""
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
    if not names or any(not n for n in names):
        raise InvalidOption(
            f"key_columns must name at least one column, comma-separated (got {value!r})",
            location=location,
        )
    folded = [n.lower() for n in names]
    repeated = sorted({n for n in names if folded.count(n.lower()) > 1})
    if repeated:
        raise InvalidOption(
            f"key_columns names {', '.join(repeated)} more than once", location=location
        )
    return tuple(names)


def recorded_key_columns(schema: pa.Schema | None) -> tuple[str, ...] | None:
    """The key columns recorded by earlier upserts in ``schema``'s metadata, if any."""
    if schema is None or not schema.metadata:
        return None
    raw = schema.metadata.get(KEY_COLUMNS_METADATA)
    return tuple(raw.decode().split(",")) if raw else None


def with_key_columns(schema: pa.Schema, keys: Sequence[str]) -> pa.Schema:
    """``schema`` recording ``keys`` as its upsert key columns."""
    meta = dict(schema.metadata or {})
    meta[KEY_COLUMNS_METADATA] = ",".join(keys).encode()
    return schema.with_metadata(meta)


def resolve_key_columns(
    schema: pa.Schema, keys: Sequence[str], location: str | None = None
) -> tuple[str, ...]:
    """``keys`` as the shard's column names (matched case-insensitively), checked: each
    exists, has a type with exact equality, and they agree with the recorded key columns."""
    names = schema.names
    resolved = []
    for key in keys:
        if key in names:
            resolved.append(key)
            continue
        folded = [n for n in names if n.lower() == key.lower()]
        if len(folded) != 1:
            raise InvalidOption(
                f"key column {key!r} is not a column of the table (columns: {', '.join(names)})",
                location=location,
            )
        resolved.append(folded[0])
    for key in resolved:
        t = schema.field(key).type
        if not any(test(t) for test in _KEY_TYPES):
            raise InvalidUpdates(
                f"key column {key} has type {t}; keys must be integers, strings, binary, "
                "booleans, dates, timestamps or decimals (exact equality; no floats or nested "
                "types)",
                location=location,
            )
    recorded = recorded_key_columns(schema)
    if recorded is not None and tuple(resolved) != recorded:
        raise InvalidOption(
            f"the shard's upserts use key_columns {','.join(recorded)}; this upsert names "
            f"{','.join(resolved)}. Upsert with the recorded keys (or write to a new shard)",
            location=location,
        )
    return tuple(resolved)


def upsert_input(
    table: pa.Table,
    *,
    delete_column: str | None = None,
    location: str | None = None,
) -> pa.Table:
    """Incoming rows in normal form: the user columns and ``_diff`` (``+1`` upsert, ``-1``
    delete). ``_diff`` defaults to ``+1``; a true ``delete_column`` makes the row a delete
    (the column is dropped). Refuses other diffs, null markers and a ``_time`` column."""
    n = table.num_rows
    if DIFF in table.column_names:
        diff = table.column(DIFF)
        if not pa.types.is_integer(diff.type):
            raise InvalidUpdates(
                f"{DIFF} must hold integers (+1 upsert, -1 delete), got {diff.type}",
                location=location,
            )
        diff = diff.cast(pa.int64())
        if diff.null_count:
            raise InvalidUpdates(f"{DIFF} has {diff.null_count} null values", location=location)
        bad = pc.and_(pc.not_equal(diff, 1), pc.not_equal(diff, -1))
        if pc.any(bad).as_py():
            first = pc.filter(diff, bad)[0].as_py()
            raise InvalidUpdates(
                f"an upsert's {DIFF} is +1 (upsert the row) or -1 (delete its key), got {first}",
                location=location,
            )
        table = table.drop_columns([DIFF])
    else:
        diff = pa.chunked_array([pa.array(np.ones(n, dtype=np.int64))])
    if delete_column is not None:
        if delete_column not in table.column_names:
            raise InvalidOption(
                f"delete_column {delete_column!r} is not a column of the incoming rows "
                f"(columns: {', '.join(table.column_names)})",
                location=location,
            )
        marker = table.column(delete_column)
        if not pa.types.is_boolean(marker.type):
            raise InvalidUpdates(
                f"delete_column {delete_column} must be boolean, got {marker.type}",
                location=location,
            )
        if marker.null_count:
            raise InvalidUpdates(
                f"delete_column {delete_column} has {marker.null_count} null values; "
                "say true (delete) or false (upsert)",
                location=location,
            )
        diff = pc.if_else(marker, pa.scalar(-1, pa.int64()), diff)
        table = table.drop_columns([delete_column])
    if TIME in table.column_names:
        raise InvalidUpdates(
            f"an upsert writes every row at one new time; drop the {TIME} column",
            location=location,
        )
    return table.append_column(pa.field(DIFF, pa.int64(), nullable=False), diff)


def check_keys(table: pa.Table, keys: Sequence[str], location: str | None = None) -> None:
    """Refuse incoming rows without a key column or with a null key."""
    for key in keys:
        if key not in table.column_names:
            raise InvalidUpdates(
                f"key column {key!r} is missing from the incoming rows "
                f"(columns: {', '.join(table.column_names)})",
                location=location,
            )
        nulls = table.column(key).null_count
        if nulls:
            raise InvalidUpdates(
                f"key column {key} has {nulls} null values; every upserted or deleted row "
                "needs its key",
                location=location,
            )


def check_unique_keys(
    table: pa.Table, keys: Sequence[str], location: str | None = None, diffs: bool = False
) -> None:
    """Refuse two rows of ``table`` with one key (`InvalidUpdates` naming one such key).

    With ``diffs``, ``table`` is consolidated staged input whose ``_diff`` must be ``+-1``:
    a larger magnitude means equal rows arrived more than once (also a duplicate key)."""
    if table.num_rows == 0:
        return
    counts = table.select(list(keys)).group_by(list(keys)).aggregate([([], "count_all")])
    dupes = counts.filter(pc.greater(counts.column("count_all"), 1))
    if dupes.num_rows == 0 and diffs:
        magnitude = pc.abs(table.column(DIFF))
        dupes = table.filter(pc.greater(magnitude, 1)).select(list(keys))
    if dupes.num_rows:
        first = dupes.slice(0, 1).to_pylist()[0]
        key = ", ".join(f"{k}={first[k]!r}" for k in keys)
        raise InvalidUpdates(
            f"duplicate key in one upsert: ({key}) appears more than once "
            f"({dupes.num_rows} duplicated keys); each key may be upserted or deleted once "
            "per write or micro-batch",
            location=location,
        )


class KeyProbe:
    """Decides from a chunk's statistics whether it may hold one of a set of keys.

    For each key column it keeps the sorted distinct incoming values; a chunk may match when
    every key column has an incoming value within the chunk's [min, max] (a necessary
    condition for holding a row of an incoming key, so skipping the others is exact).
    Unknown statistics, or ones that do not compare with the values, mean "may match".
    """

    def __init__(self, keys: pa.Table) -> None:
        self.columns = keys.column_names
        self.values: dict[str, list[Any]] = {}
        for name in self.columns:
            distinct = pc.unique(keys.column(name).combine_chunks())
            self.values[name] = sorted(distinct.to_pylist())

    def column_may_match(self, name: str, lo: Any, hi: Any) -> bool:
        values = self.values[name]
        try:
            i = bisect.bisect_left(values, lo)
            return i < len(values) and values[i] <= hi
        except TypeError:
            return True

    def may_match(self, reader: Any, chunk: int) -> bool:
        for name in self.columns:
            stats = chunk_stats(reader, chunk, name)
            if stats is None:
                continue
            lo, hi, nulls = stats
            if nulls >= reader.chunks[chunk].num_rows:
                return False  # only null keys there; incoming keys are never null
            if lo is None or hi is None:
                continue
            if not self.column_may_match(name, lo, hi):
                return False
        return True


@dataclass
class LookupStats:
    """What one lookup read: parts and chunks considered, chunks read, rows found."""

    parts: int = 0
    chunks: int = 0
    chunks_read: int = 0
    rows_read: int = 0
    rows_found: int = 0


def _semi_join(table: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of ``table`` whose key (``keys``' columns) is among ``keys``' rows."""
    if table.num_rows == 0:
        return table
    names = keys.column_names
    if len(names) == 1:
        col = table.column(names[0])
        wanted = keys.column(names[0]).combine_chunks().cast(col.type)
        return table.filter(pc.fill_null(pc.is_in(col, value_set=wanted), False))
    probe = keys.select(names)
    index = "__persistshard_row"
    numbered = table.append_column(index, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    hits = numbered.select([*names, index]).join(probe, keys=list(names), join_type="left semi")
    rows = np.sort(hits.column(index).to_numpy())
    return table.take(pa.array(rows))


def current_rows(
    blob: Blob,
    state: ShardState,
    keys: pa.Table,
    *,
    location: str | None = None,
    stats: LookupStats | None = None,
) -> pa.Table:
    """The snapshot rows (user columns + ``_diff``) at ``state.upper - 1`` whose key is one
    of ``keys``' rows, reading only the chunks `KeyProbe` admits."""
    assert state.schema is not None
    snapshot_schema = pa.schema([*state.schema, pa.field(DIFF, pa.int64(), nullable=False)])
    if state.upper == 0 or keys.num_rows == 0:
        return snapshot_schema.empty_table()
    # Every sealed update counts, whatever the since: an upsert reads the contents at the
    # upper (times below since are forwarded, never past upper - 1), so no since check.
    q = Query("snapshot", as_of=state.upper - 1, since=state.since)
    refs: list[PartRef] = relevant_parts(state, q)
    probe = KeyProbe(keys)
    stats = stats if stats is not None else LookupStats()
    stats.parts += len(refs)

    def chunks_of(ref: PartRef) -> PartSlice | None:
        reader = open_part(blob, ref)
        wanted = [c for c in range(len(reader.chunks)) if probe.may_match(reader, c)]
        stats.chunks += len(reader.chunks)
        stats.chunks_read += len(wanted)
        return PartSlice(ref, tuple(wanted)) if wanted else None

    if len(refs) > 1:
        with ThreadPoolExecutor(max_workers=min(8, len(refs))) as pool:
            found = list(pool.map(run_in_context(chunks_of), refs))
    else:
        found = [chunks_of(r) for r in refs]
    slices = tuple(s for s in found if s is not None)
    stored = update_schema(state.schema)
    if not slices:
        return snapshot_schema.empty_table()
    loaded = load_updates(blob, ReadTask(slices, None, q, stored))
    stats.rows_read += loaded.num_rows
    matched = _semi_join(loaded, keys)
    current = snapshot_of(matched)
    stats.rows_found += current.num_rows
    return current


def upsert_delta(
    incoming: pa.Table,
    current: pa.Table,
    schema: pa.Schema,
    time: int,
) -> pa.Table:
    """The updates at ``time`` that turn ``current`` into what ``incoming`` asks for.

    ``incoming``: user columns + ``_diff`` (+1 upsert, -1 delete; keys unique). ``current``:
    user columns + ``_diff``, the snapshot rows of the incoming keys. The desired rows (the
    upserts) and the negated current rows are consolidated in a `Correction` buffer; the
    result is sorted and consolidated, in ``update_schema(schema)``.
    """
    full = update_schema(schema)

    def at_time(table: pa.Table) -> pa.Table:
        times = pa.array(np.full(table.num_rows, time, dtype=np.int64))
        user = table.drop_columns([DIFF]).select(schema.names)
        return pa.Table.from_arrays([*user.columns, times, table.column(DIFF)], schema=full)

    desired = incoming.filter(pc.equal(incoming.column(DIFF), 1))
    negated = current.set_column(
        current.schema.get_field_index(DIFF),
        pa.field(DIFF, pa.int64(), nullable=False),
        pc.negate(current.column(DIFF)),
    )
    with Correction(full) as correction:
        if desired.num_rows:
            correction.insert(at_time(desired))
        if negated.num_rows:
            correction.insert(at_time(negated))
        out = list(correction.updates_before(time + 1))
    if not out:
        return full.empty_table()
    return consolidate(pa.Table.from_batches(out, schema=full), presorted=False)


def prepare(
    table: pa.Table,
    key_columns: str | Sequence[str],
    state: ShardState,
    location: str | None = None,
) -> tuple[pa.Table, tuple[str, ...], pa.Schema]:
    """Check incoming rows (from `upsert_input`) against ``state``: returns them as the
    shard's columns + ``_diff``, the resolved key columns, and the shard's schema after the
    upsert (the incoming columns for a new shard). Refuses bad keys and duplicate keys."""
    keys = parse_key_columns(key_columns, location)
    user = user_schema(table.drop_columns([DIFF]).schema)
    schema = state.schema if state.schema is not None else user
    resolved = resolve_key_columns(schema, keys, location)
    incoming = _conform(table, schema, location)
    check_keys(incoming, resolved, location)
    check_unique_keys(incoming, resolved, location)
    return incoming, resolved, schema


def delta_parts(
    blob: Blob,
    state: ShardState,
    incoming: pa.Table,
    keys: Sequence[str],
    schema: pa.Schema,
    write_id: str,
    *,
    config: ShardConfig,
    location: str | None = None,
    stats: LookupStats | None = None,
) -> list[PartRef]:
    """Write, as parts of ``write_id`` (sized as ``config`` says), the updates at
    ``state.upper`` that apply
    ``incoming`` (from `prepare`) to ``state``'s contents; commits nothing. The caller commits
    them with ``expected_upper = state.upper`` and ``new_upper = state.upper + 1``."""
    snapshot_schema = pa.schema([*schema, pa.field(DIFF, pa.int64(), nullable=False)])
    if state.schema is None:
        current = snapshot_schema.empty_table()
    else:
        current = current_rows(
            blob, state, incoming.select(list(keys)), location=location, stats=stats
        )
        if len(schema) > len(state.schema):
            current = conform_columns(current, snapshot_schema)
    delta = upsert_delta(incoming, current, schema, state.upper)
    log.debug(
        "upsert of %d rows at %d: %d current rows, %d updates",
        incoming.num_rows,
        state.upper,
        current.num_rows,
        delta.num_rows,
    )
    return write_parts(blob, write_id, delta, config=config)


def _conform(table: pa.Table, schema: pa.Schema, location: str | None) -> pa.Table:
    """``table`` (user columns by name + ``_diff``) as ``schema``'s columns + ``_diff``."""
    incoming = user_schema(table.drop_columns([DIFF]).schema)
    sources = match_columns(incoming, schema, location)
    columns = stored_columns(table, sources, schema, location)
    out_schema = pa.schema([*schema, pa.field(DIFF, pa.int64(), nullable=False)])
    return pa.Table.from_arrays([*columns, table.column(DIFF)], schema=out_schema)
