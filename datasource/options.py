"""Options of the `persistshard` Spark format: parsing, validation, and finding the location.

Spark hands options over as lower-cased keys with string values. Every option is parsed here,
once, into typed values; an unknown, empty, malformed or out-of-range option is refused with
`InvalidOption` naming it, the value given and what it accepts (and, for an unknown one, the
known ones), before anything is read or written. No value is silently replaced by a default:
an option that is given is either used as given or refused (``as_of = ''`` is not "latest",
``max_partitions = 0`` is not "64").

Where the shard is (in order): the ``path`` option (``.load(path)`` / ``.save(path)`` /
``WITH ('path' = ...)``), the ``location`` option (a ``CREATE TABLE`` passes it to
``schema()``), or the location stored in the table's field metadata. Spark 4.3 drops a
table's LOCATION and OPTIONS before a Python source sees them, except in ``schema()`` during
a ``CREATE TABLE`` without a column list; what ``schema()`` returns there is kept in the
catalog with its field metadata and handed to every later ``reader(schema)`` and
``writer(schema)``. So the location travels in the metadata of the table's fields. A write
whose schema Spark took from the query rather than the table arrives with no location; it is
refused with `WRITE_FORMS`, the statement forms that name the shard.

Storage options: every option named ``storage.<name>`` is handed to fsspec as the storage
option ``<name>`` (Spark lower-cases option keys, so names are lower case); a value that
parses as JSON is passed decoded (``storage.client_kwargs`` = ``{"endpoint_url": ...}``), any
other value as the string it is. They travel to the tasks inside the pickled reader/writer and
partitions, never into the shard, the catalog or a message: `StorageOptions` hides its values
from ``repr``. Spark refuses storage that is not shared between processes (`check_shared`):
each Python worker has its own ``memory://``, so a write there would vanish.

Raw storage errors on the driver (a location that is a file, a read-only directory, missing
credentials) become `StorageError` naming the location, the cause and the fix
(`storage_errors`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from persistshard.errors import (
    Indeterminate,
    InvalidOption,
    InvalidUpdates,
    StorageUnsupported,
    is_access_error,
    is_storage_error,
    storage_cause,
    storage_error,
)

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
        "merge_schema",
        "remap",
        "source_partition_column",
        "source_offset_column",
        "key_columns",  # upserts (datasource/upsert.py)
        "delete_column",
        "batch_id",
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
        "min_partitions",
        "reader_id",
        "reader_lease_seconds",
        "hold",  # streaming reads: false reads without a hold (datasource/stream.py)
    }
)
#: What CREATE TABLE hands ``schema()`` besides the user's OPTIONS (Spark's table properties;
#: it also repeats each OPTION as ``option.<name>``, which `check_known` skips).
TABLE_OPTIONS = frozenset(
    {"columns", "provider", "owner", "external", "is_managed_location", "comment"}
)
COMMON_OPTIONS = frozenset({"path", "location", "paths", "checkpointlocation", "queryname"})
ALL_OPTIONS = WRITE_OPTIONS | READ_OPTIONS | TABLE_OPTIONS | COMMON_OPTIONS


#: Prefix of the options passed to fsspec as storage options.
STORAGE_PREFIX = "storage."

#: fsspec protocols whose data lives inside one process: Spark's workers would each see their own.
PROCESS_LOCAL_PROTOCOLS = frozenset({"memory"})


class StorageOptions(dict[str, Any]):
    """fsspec storage options; ``repr`` shows the names only, so no secret reaches a log."""

    def __repr__(self) -> str:
        return f"StorageOptions({', '.join(sorted(self))})"

    __str__ = __repr__


def _decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def storage_options(options: Mapping[str, Any]) -> StorageOptions:
    """The ``storage.<name>`` options as fsspec storage options (JSON values decoded)."""
    out = StorageOptions()
    for key, value in options.items():
        if key.lower().startswith(STORAGE_PREFIX):
            name = key[len(STORAGE_PREFIX) :]
            if not name:
                raise InvalidOption("option 'storage.' names no storage option")
            out[name] = _decode(value)
    return out


def check_shared(location: str) -> None:
    """Refuse a location whose filesystem is not shared between processes (``memory://``):
    Spark runs Python in many worker processes, and each would see its own copy."""
    import fsspec

    for url in location.split("::"):
        protocol, _ = fsspec.core.split_protocol(url)
        if protocol is None:
            continue
        try:
            cls = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError):
            continue  # an unknown protocol fails later, with fsspec's own message
        from fsspec.implementations.memory import MemoryFileSystem

        if protocol in PROCESS_LOCAL_PROTOCOLS or issubclass(cls, MemoryFileSystem):
            raise StorageUnsupported(
                f"{protocol}:// lives inside one process, but Spark reads and writes in many "
                "Python worker processes, each with its own copy: a write would report success "
                "and vanish. Use storage every worker shares (a local path on a one-machine "
                "cluster, s3://, gs://, abfs://, ...); memory:// is for the Python API only",
                location=location,
            )


def check_known(options: Mapping[str, str], allowed: frozenset[str], what: str) -> None:
    """Refuse options this operation does not know (Spark's own ``__``-keys and
    ``storage.<name>`` options pass), and persistshard options given an empty value (an empty
    value never means "the default": leave the option out for that)."""
    unknown = sorted(
        k
        for k in options
        if k.lower() not in allowed
        and not k.startswith(("__", "option."))
        and not k.lower().startswith(STORAGE_PREFIX)
    )
    if unknown:
        raise InvalidOption(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for a "
            f"persistshard {what}; known options: {', '.join(sorted(allowed))}"
        )
    for key, value in options.items():
        if key.lower() in VALUED_OPTIONS and value is not None and str(value).strip() == "":
            raise InvalidOption(
                f"option {key} is empty ({value!r}); give it a value, or leave the option out "
                "for its default"
            )


@contextmanager
def storage_errors(location: str | None, doing: str) -> Iterator[None]:
    """Turn a raw storage error (an `OSError`: a location that is a file, a read-only
    directory; a storage library's own: missing credentials, access denied) into
    `StorageError` naming the location, what was being done, the cause and the fix
    (`persistshard.errors.storage_error`); nothing was changed. An `Indeterminate` commit
    whose cause is a refused access becomes one too: a refused write did not land."""
    try:
        yield
    except Indeterminate as e:
        # A commit the storage refused for lack of access did not land: say what to fix.
        cause = storage_cause(e)
        if cause is None or not is_access_error(cause):
            raise
        raise storage_error(cause, location, doing) from None
    except Exception as e:
        if not is_storage_error(e):
            raise
        raise storage_error(e, location, doing) from e


#: Options whose value is a persistshard value: refused when given empty (`check_known`).
VALUED_OPTIONS = WRITE_OPTIONS | READ_OPTIONS

#: The largest time or count an option may hold (times are signed 64-bit in Spark and Arrow).
MAX_INT64 = (1 << 63) - 1

_INTEGER = re.compile(r"[+-]?[0-9]+")


def _int(options: Mapping[str, str], key: str, minimum: int = 0) -> int | None:
    """Option ``key`` as an integer of at least ``minimum``; None when it is absent. An empty
    value, a non-integer (``1.5``, ``1e3``, ``10_000``, ``ten``) or a value out of range is
    refused with `InvalidOption`, never replaced by the default."""
    value = options.get(key)
    if value is None:
        return None
    text = str(value).strip()
    if text == "":
        raise InvalidOption(
            f"option {key} is empty ({value!r}); give an integer, or leave the option out for "
            "its default"
        )
    if not _INTEGER.fullmatch(text):
        raise InvalidOption(f"option {key} must be an integer, got {value!r}")
    number = int(text)
    if number < minimum:
        if minimum == 0:
            raise InvalidOption(f"option {key} must not be negative, got {number}")
        raise InvalidOption(f"option {key} must be at least {minimum}, got {number}")
    if number > MAX_INT64:
        raise InvalidOption(f"option {key} must be at most {MAX_INT64} (64-bit), got {number}")
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
    raise InvalidOption(f"option {key} must be true or false, got {value!r}")


def _name(options: Mapping[str, str], key: str) -> str | None:
    """A string option (a column name, an id, a location): None when absent, refused when
    given blank (`check_known` refuses it first for the parsers that call it)."""
    value = options.get(key)
    if value is None:
        return None
    if str(value).strip() == "":
        raise InvalidOption(
            f"option {key} is empty ({value!r}); give it a value, or leave the option out"
        )
    return str(value)


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


#: What a write that reached the source without a location should be written as instead.
WRITE_FORMS = (
    "name the shard in the statement: INSERT INTO t WITH ('path' = '/data/t') SELECT ... "
    "(also INSERT OVERWRITE t WITH (...) SELECT ... and ... TABLE s), "
    "df.writeTo('t').option('path', '/data/t').append(), or "
    "df.write.format('persistshard').mode('append').save('/data/t')"
)


def require_location(options: Mapping[str, str], schema: Any = None, what: str = "read") -> str:
    """`find_location`, or an error that says how to name the shard for this operation."""
    location = find_location(options, schema)
    if location is not None:
        return location
    if what == "write":
        raise InvalidUpdates(
            "no shard location reached this write: Spark 4.3 passes none for INSERT ... "
            "SELECT and INSERT ... TABLE whose columns need no conversion, df.write.insertInto, "
            "df.writeTo(t).append(), saveAsTable, CREATE TABLE ... AS SELECT, and tables "
            f"created with a column list (create those with CREATE TABLE t USING persistshard "
            f"LOCATION '/data/t' OPTIONS (columns '...')); {WRITE_FORMS}"
        )
    raise InvalidUpdates(
        "no shard location: use .load(path) or option('path', ...); for SQL, create the "
        "table without a column list so it remembers its location: CREATE TABLE t USING "
        "persistshard LOCATION '/data/t' OPTIONS (columns 'id BIGINT, name STRING'), or name "
        "it per statement with SELECT * FROM t WITH ('path' = '/data/t')"
    )


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
    storage_options: StorageOptions = field(default_factory=StorageOptions)
    merge_schema: bool = False

    @property
    def plain(self) -> bool:
        """No explicit times or frontiers: the write may land at whatever the upper is."""
        return (
            self.time_column is None
            and self.upper is None
            and self.expected_upper is None
            and self.remap is None
        )

    #: Reclocking (`persistshard.datasource.reclock`): the remap shard, the source columns,
    #: and the frontier of the whole micro-batch when the DataFrame is a filtered part of it.
    remap: str | None = None
    source_partition_column: str = "partition"
    source_offset_column: str = "offset"
    source_frontier: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def parse(options: Mapping[str, str], schema: Any = None) -> WriteOptions:
        check_known(options, WRITE_OPTIONS | COMMON_OPTIONS | TABLE_OPTIONS, "write")
        remap = _name(options, "remap")
        reclock_only = ("source_partition_column", "source_offset_column", "source_frontier")
        if remap is None and any(options.get(k) for k in reclock_only):
            given = ", ".join(k for k in reclock_only if options.get(k))
            raise InvalidOption(f"option {given} needs option remap (the remap shard)")
        frontier: tuple[tuple[str, int], ...] = ()
        if options.get("source_frontier"):
            frontier = _frontier(str(options["source_frontier"]))
        upper = _int(options, "upper", minimum=1)
        expected_upper = _int(options, "expected_upper")
        if upper is not None and expected_upper is not None and upper <= expected_upper:
            raise InvalidOption(
                f"option upper ({upper}) must be above option expected_upper "
                f"({expected_upper}): a write moves the upper forward"
            )
        location = require_location(options, schema, "write")
        check_shared(location)
        memory_budget = _int(options, "memory_budget", minimum=1)
        return WriteOptions(
            location=location,
            time_column=_name(options, "time_column"),
            diff_column=_name(options, "diff_column"),
            upper=upper,
            expected_upper=expected_upper,
            writer_id=_name(options, "writer_id"),
            compact=_bool(options, "compact", True),
            memory_budget=memory_budget if memory_budget is not None else (256 << 20),
            storage_options=storage_options(options),
            merge_schema=_bool(options, "merge_schema", False),
            remap=remap,
            source_partition_column=_name(options, "source_partition_column") or "partition",
            source_offset_column=_name(options, "source_offset_column") or "offset",
            source_frontier=frontier,
        )


def _frontier(text: str) -> tuple[tuple[str, int], ...]:
    """Option ``source_frontier``: JSON ``{partition: offset upper}``."""
    import json

    from persistshard.core.remap import check_frontier

    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidOption(f"option source_frontier is not JSON: {e}") from None
    try:
        return tuple(sorted(check_frontier(parsed).items()))
    except InvalidUpdates as e:
        raise InvalidOption(f"option source_frontier: {e.detail}") from None


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
    #: At least this many partitions when the read is big enough (`core.read.plan_read`):
    #: by default the cores of the host that plans the read.
    min_partitions: int = 1
    reader_id: str | None = None
    reader_lease_seconds: int | None = None
    storage_options: StorageOptions = field(default_factory=StorageOptions)
    #: A streaming read holds the shard's since (a commit: needs write access) unless false.
    hold: bool = True

    @property
    def reads_updates(self) -> bool:
        return self.updates_from is not None or self.updates_to is not None

    @staticmethod
    def parse(options: Mapping[str, str], schema: Any = None) -> ReadOptions:
        check_known(options, READ_OPTIONS | COMMON_OPTIONS | TABLE_OPTIONS, "read")
        location = require_location(options, schema)
        check_shared(location)
        partition_bytes = _int(options, "partition_bytes", minimum=1)
        max_partitions = _int(options, "max_partitions", minimum=1)
        min_partitions = _int(options, "min_partitions", minimum=1)
        if max_partitions is not None and min_partitions is not None:
            if min_partitions > max_partitions:
                raise InvalidOption(
                    f"option min_partitions ({min_partitions}) is above option max_partitions "
                    f"({max_partitions})"
                )
        parsed = ReadOptions(
            location=location,
            as_of=_int(options, "as_of"),
            with_diff=_bool(options, "with_diff", False),
            changes=_bool(options, "changes", False),
            updates_from=_int(options, "updates_from"),
            updates_to=_int(options, "updates_to"),
            partition_bytes=partition_bytes if partition_bytes is not None else (24 << 20),
            max_partitions=max_partitions if max_partitions is not None else 64,
            min_partitions=min_partitions if min_partitions is not None else (os.cpu_count() or 1),
            reader_id=_name(options, "reader_id"),
            reader_lease_seconds=_int(options, "reader_lease_seconds", minimum=1),
            storage_options=storage_options(options),
            hold=_bool(options, "hold", True),
        )
        if parsed.reads_updates and parsed.as_of is not None:
            raise InvalidOption("as_of cannot be combined with updates_from / updates_to")
        if parsed.changes and parsed.with_diff:
            raise InvalidOption("with_diff is implied by changes")
        if parsed.reads_updates and parsed.with_diff:
            raise InvalidOption("with_diff is implied by updates_from / updates_to")
        lo, hi = parsed.updates_from, parsed.updates_to
        if lo is not None and hi is not None and lo > hi:
            raise InvalidOption(
                f"option updates_from ({lo}) is above option updates_to ({hi}): the updates "
                "read are those at times in [updates_from, updates_to)"
            )
        return parsed
