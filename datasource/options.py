"""Options of the `persistshard` Spark format: parsing, validation, and finding the location.

Spark hands options over as lower-cased keys with string values. Every option is parsed here,
once, into typed values; an unknown or malformed option is refused with `InvalidUpdates`
naming it and listing the known ones, before anything is read or written.

Where the shard is (in order): the ``path`` option (``.load(path)`` / ``.save(path)`` /
``WITH ('path' = ...)``), the ``location`` option (a ``CREATE TABLE`` passes it to
``schema()``), or the location stored in the table's field metadata. Spark 4.3 drops a
table's LOCATION and OPTIONS before a Python source sees them, except in ``schema()`` during
a ``CREATE TABLE`` without a column list; what ``schema()`` returns there is kept in the
catalog with its field metadata and handed to every later ``reader(schema)`` and
``writer(schema)``. So the location travels in the metadata of the table's fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from persistshard.errors import InvalidUpdates

#: Field metadata key holding the shard location of a SQL table.
LOCATION_KEY = "persistshard.location"

WRITE_OPTIONS = frozenset(
    {
        "time_column",
        "diff_column",
        "upper",
        "expected_upper",
        "writer_id",
        "compact",
        "memory_budget",
        "remap",
        "source_partition_column",
        "source_offset_column",
        "source_frontier",
    }
)
READ_OPTIONS = frozenset(
    {
        "as_of",
        "with_diff",
        "changes",
        "updates_from",
        "updates_to",
        "partition_bytes",
        "max_partitions",
    }
)
TABLE_OPTIONS = frozenset({"columns", "provider"})
COMMON_OPTIONS = frozenset({"path", "location", "paths", "checkpointlocation", "queryname"})
ALL_OPTIONS = WRITE_OPTIONS | READ_OPTIONS | TABLE_OPTIONS | COMMON_OPTIONS


def check_known(options: Mapping[str, str], allowed: frozenset[str], what: str) -> None:
    """Refuse options this operation does not know (Spark's own ``__``-keys pass)."""
    unknown = sorted(k for k in options if k.lower() not in allowed and not k.startswith("__"))
    if unknown:
        raise InvalidUpdates(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for a "
            f"persistshard {what}; known options: {', '.join(sorted(allowed))}"
        )


def _int(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key)
    if value is None or str(value).strip() == "":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidUpdates(f"option {key} must be an integer, got {value!r}") from None
    if number < 0:
        raise InvalidUpdates(f"option {key} must not be negative, got {number}")
    return number


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidUpdates(f"option {key} must be true or false, got {value!r}")


def find_location(options: Mapping[str, str], schema: Any = None) -> str | None:
    """The shard location from the options or the schema's field metadata, if any."""
    for key in ("path", "location"):
        value = options.get(key)
        if value:
            return str(value)
    if schema is not None:
        for field in getattr(schema, "fields", []):
            meta = field.metadata or {}
            if LOCATION_KEY in meta:
                return str(meta[LOCATION_KEY])
    return None


def require_location(options: Mapping[str, str], schema: Any = None) -> str:
    """`find_location`, or an error that says how to name the shard."""
    location = find_location(options, schema)
    if location is None:
        raise InvalidUpdates(
            "no shard location: use .load(path) / .save(path) or option('path', ...); for SQL, "
            "create the table without a column list so it can remember its location: "
            "CREATE TABLE t USING persistshard LOCATION '/data/t' OPTIONS (columns 'id BIGINT, "
            "name STRING'), or name it per statement with WITH ('path' = '/data/t')"
        )
    return location


@dataclass(frozen=True)
class WriteOptions:
    """Parsed options of a batch or streaming write."""

    location: str
    time_column: str | None
    diff_column: str | None
    upper: int | None
    expected_upper: int | None
    writer_id: str | None
    compact: bool
    memory_budget: int
    #: Reclocking (`persistshard.datasource.reclock`): the remap shard, the source columns,
    #: and the frontier of the whole micro-batch when the DataFrame is a filtered part of it.
    remap: str | None = None
    source_partition_column: str = "partition"
    source_offset_column: str = "offset"
    source_frontier: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def parse(options: Mapping[str, str], schema: Any = None) -> WriteOptions:
        check_known(options, WRITE_OPTIONS | COMMON_OPTIONS | TABLE_OPTIONS, "write")
        remap = options.get("remap") or None
        reclock_only = ("source_partition_column", "source_offset_column", "source_frontier")
        if remap is None and any(options.get(k) for k in reclock_only):
            given = ", ".join(k for k in reclock_only if options.get(k))
            raise InvalidUpdates(f"option {given} needs option remap (the remap shard)")
        frontier: tuple[tuple[str, int], ...] = ()
        if options.get("source_frontier"):
            frontier = _frontier(str(options["source_frontier"]))
        return WriteOptions(
            location=require_location(options, schema),
            time_column=options.get("time_column") or None,
            diff_column=options.get("diff_column") or None,
            upper=_int(options, "upper"),
            expected_upper=_int(options, "expected_upper"),
            writer_id=options.get("writer_id") or None,
            compact=_bool(options, "compact", True),
            memory_budget=_int(options, "memory_budget") or (256 << 20),
            remap=remap,
            source_partition_column=options.get("source_partition_column") or "partition",
            source_offset_column=options.get("source_offset_column") or "offset",
            source_frontier=frontier,
        )


def _frontier(text: str) -> tuple[tuple[str, int], ...]:
    """Option ``source_frontier``: JSON ``{partition: offset upper}``."""
    import json

    from persistshard.core.remap import check_frontier

    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidUpdates(f"option source_frontier is not JSON: {e}") from None
    return tuple(sorted(check_frontier(parsed).items()))


@dataclass(frozen=True)
class ReadOptions:
    """Parsed options of a batch or streaming read."""

    location: str
    as_of: int | None
    with_diff: bool
    changes: bool
    updates_from: int | None
    updates_to: int | None
    partition_bytes: int
    max_partitions: int

    @property
    def reads_updates(self) -> bool:
        return self.updates_from is not None or self.updates_to is not None

    @staticmethod
    def parse(options: Mapping[str, str], schema: Any = None) -> ReadOptions:
        check_known(options, READ_OPTIONS | COMMON_OPTIONS | TABLE_OPTIONS, "read")
        parsed = ReadOptions(
            location=require_location(options, schema),
            as_of=_int(options, "as_of"),
            with_diff=_bool(options, "with_diff", False),
            changes=_bool(options, "changes", False),
            updates_from=_int(options, "updates_from"),
            updates_to=_int(options, "updates_to"),
            partition_bytes=_int(options, "partition_bytes") or (24 << 20),
            max_partitions=_int(options, "max_partitions") or 64,
        )
        if parsed.reads_updates and parsed.as_of is not None:
            raise InvalidUpdates("as_of cannot be combined with updates_from / updates_to")
        if parsed.changes and parsed.with_diff:
            raise InvalidUpdates("with_diff is implied by changes")
        if parsed.reads_updates and parsed.with_diff:
            raise InvalidUpdates("with_diff is implied by updates_from / updates_to")
        return parsed
