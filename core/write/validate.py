"""Input checks for updates: what a shard accepts, and the normal form it stores.

Every write path (Python API, Spark tasks) passes its input through `normalize_updates`, so
a write is refused with `InvalidUpdates` *before* anything is written, and the refusal names
the problem. The normal form:
- ``_time`` and ``_diff`` are non-null int64; times are ``>= lower``, and ``>= 0``; diffs are
  non-zero.
- User columns keep their order; types are normalised (large and view string/binary/list
  types to their plain forms, dictionaries decoded, zoned timestamps to UTC), fields are
  nullable and carry no metadata. The shard's schema is the normal form of the user columns
  of its first write, extended only by appending nullable columns (schema evolution).
- Columns are matched to the shard's by name, in any order, case-insensitively by default
  (`match_columns`); a mismatch names every missing, extra, retyped and ambiguous column.
- A written column whose (normal) type converts to the stored one without loss for every
  value of its type (`widens`: a wider integer, float or decimal precision, date32 into
  date64, a finer timestamp unit in the same zone) is cast to the stored type by
  `stored_columns`, the one place every write path casts; any other type difference is
  "retyped". Stored data always has the shard's types: parts never carry a written type.
  A timestamp outside the finer unit's range (nanoseconds: years 1677 to 2262) is
  `InvalidUpdates` naming the column and the first such value: the write is refused and
  nothing of it is committed (the parts its other tasks wrote are swept).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from persistshard.core.rows import DIFF, SYSTEM_COLUMNS, TIME
from persistshard.errors import InvalidUpdates


def normalize_type(t: pa.DataType) -> pa.DataType:
    """The stored form of an Arrow type (see the module docstring)."""
    if pa.types.is_dictionary(t):
        return normalize_type(t.value_type)
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
        return pa.timestamp(t.unit, tz="UTC")  # an instant: the zone is only a display hint
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t) or pa.types.is_list_view(t):
        return pa.list_(normalize_field(t.value_field))
    if pa.types.is_large_list_view(t):
        return pa.list_(normalize_field(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(normalize_field(t.value_field), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([normalize_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(
            normalize_type(t.key_type), normalize_field(t.item_field), keys_sorted=t.keys_sorted
        )
    return t


#: Timestamp units from the coarsest to the finest.
_UNITS = ("s", "ms", "us", "ns")


def widens(written: pa.DataType, stored: pa.DataType) -> bool:
    """Whether every value of type ``written`` converts to ``stored`` without loss (types in
    their normal form or not: both are normalised first), so a write of it is cast rather than
    refused. Only conversions within one kind count: integers to wider integers of a sign
    that holds them all, floats to wider floats, decimals to a larger precision at the same
    scale, date32 to date64, timestamps to a finer unit with the same zone (naive stays
    naive). A finer unit spans fewer years (nanoseconds: 1677 to 2262): `stored_columns`
    refuses a value beyond them. Nested types (lists, structs, maps) widen only when equal."""
    written, stored = normalize_type(written), normalize_type(stored)
    if written == stored:
        return True
    if pa.types.is_integer(written) and pa.types.is_integer(stored):
        if pa.types.is_signed_integer(written):
            return bool(pa.types.is_signed_integer(stored) and written.bit_width < stored.bit_width)
        return bool(written.bit_width < stored.bit_width)  # unsigned: either sign holds it
    if pa.types.is_floating(written) and pa.types.is_floating(stored):
        return bool(written.bit_width < stored.bit_width)
    if pa.types.is_decimal(written) and pa.types.is_decimal(stored):
        return bool(written.scale == stored.scale and written.precision <= stored.precision)
    if pa.types.is_date32(written) and pa.types.is_date64(stored):
        return True
    if pa.types.is_timestamp(written) and pa.types.is_timestamp(stored):
        return bool(
            written.tz == stored.tz and _UNITS.index(written.unit) < _UNITS.index(stored.unit)
        )
    return False


def normalize_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, normalize_type(f.type), nullable=True)


def user_schema(schema: pa.Schema) -> pa.Schema:
    """The normal form of the user columns of ``schema``."""
    return pa.schema([normalize_field(f) for f in schema if f.name not in SYSTEM_COLUMNS])


def update_schema(user: pa.Schema) -> pa.Schema:
    """The full schema of updates with user columns ``user``: ``user + _time + _diff``."""
    return pa.schema(
        [*user, pa.field(TIME, pa.int64(), nullable=False), pa.field(DIFF, pa.int64(), False)]
    )


def _check_int_column(table: pa.Table, name: str, location: str | None) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise InvalidUpdates(f"updates have no {name} column", location=location)
    col = table.column(name)
    if not pa.types.is_integer(col.type):
        raise InvalidUpdates(f"{name} must be an integer column, got {col.type}", location=location)
    if col.null_count:
        raise InvalidUpdates(f"{name} has {col.null_count} null values", location=location)
    if col.type != pa.int64():
        try:
            col = pc.cast(col, pa.int64())
        except pa.ArrowInvalid as e:
            raise InvalidUpdates(f"{name} does not fit in int64: {e}", location=location) from e
    return col


def normalize_updates(
    table: pa.Table,
    *,
    lower: int,
    schema: pa.Schema | None,
    location: str | None = None,
) -> pa.Table:
    """``table`` in the normal form, or `InvalidUpdates` naming what is wrong.

    ``schema`` is the shard's user schema (None for a shard never written); ``lower`` is the
    smallest time this write may contain (the expected upper).
    """
    names = table.column_names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidUpdates(f"duplicate column names {dupes}", location=location)
    time = _check_int_column(table, TIME, location)
    diff = _check_int_column(table, DIFF, location)
    if len(time):
        min_time = pc.min(time).as_py()
        if min_time < 0:
            raise InvalidUpdates(f"{TIME} has negative time {min_time}", location=location)
        if min_time < lower:
            raise InvalidUpdates(
                f"{TIME} {min_time} is below the write's lower {lower} (the shard's upper): "
                "times before the upper are final",
                location=location,
            )
        zeros = pc.sum(pc.equal(diff, 0)).as_py()
        if zeros:
            raise InvalidUpdates(f"{DIFF} has {zeros} zero values", location=location)
    incoming = user_schema(table.schema)
    sources = [f.name for f in incoming]
    if schema is not None:
        sources = match_columns(incoming, schema, location)
        incoming = schema
    if not len(incoming):
        raise InvalidUpdates(
            "updates have no row columns besides _time and _diff", location=location
        )
    columns = stored_columns(table, sources, incoming, location)
    columns += [time, diff]
    return pa.Table.from_arrays(columns, schema=update_schema(incoming))


def match_columns(
    incoming: pa.Schema,
    schema: pa.Schema,
    location: str | None,
    *,
    case_sensitive: bool = False,
    allow_new: bool = False,
) -> list[str]:
    """For every column of ``schema`` (the shard's), the name of the ``incoming`` column that
    feeds it, matched by name in any order: case-insensitively unless ``case_sensitive`` (an
    exact match wins over a match that differs in case).

    `InvalidUpdates` lists every missing, extra (unless ``allow_new``), retyped and ambiguous
    column at once. Types are compared in their normal form (`normalize_type`); a column whose
    type `widens` to the shard's is not retyped (`stored_columns` casts it).
    """
    exact = {f.name: f for f in incoming}
    folded: dict[str, list[pa.Field]] = {}
    for f in incoming:
        folded.setdefault(f.name.lower(), []).append(f)
    sources: list[str] = []
    used: set[str] = set()
    missing: list[str] = []
    retyped: list[str] = []
    ambiguous: list[str] = []
    for f in schema:
        found = exact.get(f.name)
        if found is None and not case_sensitive:
            candidates = folded.get(f.name.lower(), [])
            if len(candidates) > 1:
                ambiguous.append(f"{f.name} ({', '.join(c.name for c in candidates)})")
                continue
            found = candidates[0] if candidates else None
        if found is None:
            missing.append(f"{f.name} {f.type}")
            continue
        used.add(found.name)
        sources.append(found.name)
        if not widens(found.type, f.type):
            retyped.append(f"{f.name} is {normalize_type(found.type)}, the shard has {f.type}")
    extra = [f"{f.name} {f.type}" for f in incoming if f.name not in used]
    if allow_new:
        extra = []
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)}")
    if extra:
        problems.append(f"extra: {', '.join(extra)}")
    if retyped:
        problems.append(f"retyped: {'; '.join(retyped)}")
    if ambiguous:
        problems.append(f"ambiguous (equal but for case): {', '.join(ambiguous)}")
    if problems:
        hint = ""
        if extra and not (missing or retyped or ambiguous):
            hint = "; to add the extra columns to the shard, write with option merge_schema"
        if retyped:
            hint += (
                " (a column is cast to the shard's type only when every value of its type "
                "converts without loss: a wider integer, float or decimal, a finer timestamp "
                "unit in the same time zone)"
            )
        raise InvalidUpdates(
            f"columns {_describe(incoming)} do not match the shard's columns "
            f"{_describe(schema)}: {'; '.join(problems)}{hint}",
            location=location,
        )
    return sources


def check_columns(incoming: pa.Schema, schema: pa.Schema, location: str | None) -> None:
    """`InvalidUpdates` unless ``incoming`` (normalised user columns) has the shard's columns
    by name, in any order (`match_columns`)."""
    match_columns(incoming, schema, location)


def evolve_schema(current: pa.Schema, incoming: pa.Schema, location: str | None) -> pa.Schema:
    """The shard schema after adding the columns of ``incoming`` that ``current`` lacks: the
    current columns, then the new ones (nullable) in their incoming order.

    Only additions are schema evolution; ``incoming`` must still have every current column
    with its type (`match_columns` refuses anything else: dropping, renaming, retyping).
    """
    match_columns(incoming, current, location, allow_new=True)
    known = {f.name.lower() for f in current}
    added = [normalize_field(f) for f in incoming if f.name.lower() not in known]
    return pa.schema([*current, *added])


def _describe(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"


def stored_columns(
    table: pa.Table, sources: Sequence[str], schema: pa.Schema, location: str | None
) -> list[pa.ChunkedArray]:
    """The columns of ``table`` named by ``sources`` (one per field of ``schema``, as
    `match_columns` pairs them), each cast to its field's type: the one place a write's
    columns become the stored types (normal forms and `widens`). A value the type cannot hold
    is `InvalidUpdates` naming the column (a timestamp beyond the stored unit's range: the
    column and the first such value)."""
    columns = []
    for f, source in zip(schema, sources, strict=True):
        col = table.column(source)
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                if pa.types.is_timestamp(col.type) and pa.types.is_timestamp(f.type):
                    _refuse_out_of_range(col, f, location)
                raise InvalidUpdates(
                    f"column {f.name} of type {col.type} cannot be stored as {f.type}: {e}",
                    location=location,
                ) from e
        columns.append(col)
    return columns


def _refuse_out_of_range(col: pa.ChunkedArray, f: pa.Field, location: str | None) -> None:
    """`InvalidUpdates` naming the first value of ``col`` (timestamps) that ``f``'s finer unit
    cannot hold (int64 overflow: nanoseconds reach only the years 1677 to 2262); returns if
    every value fits (the cast failed for another reason)."""
    factor = 10 ** (3 * (_UNITS.index(f.type.unit) - _UNITS.index(col.type.unit)))
    if factor <= 1:
        return
    counts = pc.cast(col, pa.int64())
    limit = (2**63 - 1) // factor
    outside = pc.or_(pc.greater(counts, limit), pc.less(counts, -limit))
    first = pc.index(outside, True).as_py()
    if first < 0:
        return
    value = col[first]
    try:
        shown = str(value.as_py())
    except (ValueError, OverflowError):  # beyond what Python's datetime shows
        shown = f"{counts[first].as_py()} {col.type.unit} since the epoch"
    raise InvalidUpdates(
        f"column {f.name} holds {shown}, which the shard's type {f.type} cannot hold "
        f"(timestamp[{f.type.unit}] reaches {_reach(f.type)})",
        location=location,
    )


def _reach(t: pa.TimestampType) -> str:
    """The range of instants a timestamp type holds, as text."""
    bound = pa.scalar(2**63 - 1, pa.int64()).cast(pa.timestamp(t.unit))
    low = pa.scalar(-(2**63) + 1, pa.int64()).cast(pa.timestamp(t.unit))
    try:
        return f"from {low.as_py()} to {bound.as_py()}"
    except (ValueError, OverflowError):
        return "beyond the years Python's datetime shows"
