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
``writer(schema)``. So the location travels in the metadata of the table's fields
(`table_metadata`).

A read trusts it: ``reader(schema)`` always gets the table's own catalog schema. A write may
not: its schema is the *query's*, and when the query's columns already have the target's names
and types Spark passes them through unconverted, with the metadata of whatever table they were
read from (``INSERT INTO t SELECT * FROM u`` arrives with ``u``'s location). Only Spark's
output resolution puts the *target's* columns in front of the query, and it copies their
metadata through ``CharVarcharUtils.cleanMetadata``, which strips exactly one key,
`RAW_TYPE_KEY`. So ``schema()`` puts that key (with the field's own type, which Spark parses
back to the same type) on every field, and `write_location` trusts a metadata location only
when it provably came from the resolver (the *provenance rule*):

- every field that carries a location carries the same one, and at least one does (columns
  added later by ``ALTER TABLE ... ADD COLUMNS`` carry none);
- every such field carries ``persistshard.catalog = "2"`` (tables created before the rule,
  and tables whose types the DDL string cannot state exactly, are never trusted);
- no field carries `RAW_TYPE_KEY` (its presence means a scan, not the resolver, made it);
- no ``path``/``location`` option was given (an explicit one always wins).

Anything else is refused with `WRITE_FORMS`, the statement forms that name the shard. The
Spark behaviour the rule relies on is pinned by canary tests (``tests/test_sql_provenance.py``).

Storage options: every option named ``storage.<name>`` is handed to fsspec as the storage
option ``<name>`` (Spark lower-cases option keys, so names are lower case); a value that
parses as JSON is passed decoded (``storage.client_kwargs`` = ``{"endpoint_url": ...}``), any
other value as the string it is. They travel to the tasks inside the pickled reader/writer and
partitions, never into the shard, the catalog or a message: `StorageOptions` hides its values
from ``repr``. Spark refuses storage that is not shared between processes (`check_shared`):
each Python worker has its own ``memory://``, so a write there would vanish.

The ``consensus`` option (a database consensus URL, `persistshard.core.storage.sqlconsensus`) joins
the storage options under the key ``consensus`` and travels with them to every ``open_shard``; a
SQL table created with it keeps it in its field metadata (`CONSENSUS_KEY`), never with a
password.

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
from typing import TYPE_CHECKING, Any

from persistshard.core.config import KNOBS, MEMORY_BUDGET, ShardConfig
from persistshard.core.shard import ShardAddress
from persistshard.core.storage.blob import as_storage_error
from persistshard.core.storage.layout import canonical_location
from persistshard.core.storage.sqlconsensus import redact_url, url_has_password
from persistshard.errors import (
    InvalidOption,
    InvalidUpdates,
    StorageUnsupported,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

#: Field metadata key holding the shard location of a SQL table.
LOCATION_KEY = "persistshard.location"
#: Field metadata key holding a SQL table's consensus URL (option ``consensus``; never one
#: with a password), next to its location.
CONSENSUS_KEY = "persistshard.consensus"
#: Field metadata key saying which provenance rule the table's metadata was made for
#: (`CATALOG_VERSION`, or `CATALOG_PARTIAL` when a type's DDL string is not exact).
CATALOG_KEY = "persistshard.catalog"
CATALOG_VERSION = "2"
CATALOG_PARTIAL = "partial"
#: Spark's key for a column's declared CHAR/VARCHAR type; its output resolver strips it (and
#: only it) when it copies the target table's column metadata, a scan keeps it.
RAW_TYPE_KEY = "__CHAR_VARCHAR_TYPE_STRING"
#: Set by the JVM companion's session catalog on a statement of one of its tables whose
#: statement names no ``path``/``location`` of its own: the table's name. The statement then
#: reads or writes the table's location with the table's catalog columns, as a Python source's
#: table whose location comes from its field metadata does: a write follows ``ALTER TABLE ...
#: ADD COLUMNS`` and refuses dropped or renamed columns, a read is of a declared table.
TABLE_KEY = "__persistshard_table"
#: Set with it: the comma-separated keys of the statement's options that came from the
#: table's OPTIONS in the catalog (not given by the statement). Each is an option of some
#: persistshard operation; one this operation does not take is not refused (`check_known`): a
#: change table's ``changes`` does not make its INSERTs fail, its ``retention`` its SELECTs.
TABLE_OPTIONS_KEY = "__persistshard_table_options"

WRITE_OPTIONS = frozenset(
    {
        "time_column",
        "diff_column",
        "upper",
        "expected_upper",
        "writer_id",
        "compact",
        "maintenance",  # bounded compaction and gc after the commit (core/maintenance/auto.py)
        "retention",  # the shard's history retention (`parse_retention`)
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
        "where",  # explicit pruning (datasource/reader.py, core/read/filters.py parse_where)
        "hold",  # streaming reads: false reads without a hold (datasource/stream.py)
        "consumer",  # a durable consumer's changes (core/statemachine/consumers.py)
    }
)
#: What CREATE TABLE hands ``schema()`` besides the user's OPTIONS (Spark's table properties;
#: it also repeats each OPTION as ``option.<name>``, which `check_known` skips).
TABLE_OPTIONS = frozenset(
    {"columns", "provider", "owner", "external", "is_managed_location", "comment"}
)
#: The knobs of a shard's configuration (`persistshard.core.config.ShardConfig`: inline_bytes,
#: chunk_bytes, ...): options of every read and write, parsed by `shard_config`.
CONFIG_OPTIONS = frozenset(KNOBS)
COMMON_OPTIONS = (
    frozenset({"path", "location", "paths", "checkpointlocation", "queryname", "consensus"})
    | CONFIG_OPTIONS
)
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
    """The ``storage.<name>`` options as fsspec storage options (JSON values decoded): the
    blob store's options only (the consensus URL is `consensus_url`, the knobs
    `shard_config`)."""
    out = StorageOptions()
    for key, value in options.items():
        if key.lower().startswith(STORAGE_PREFIX):
            name = key[len(STORAGE_PREFIX) :]
            if not name:
                raise InvalidOption("option 'storage.' names no storage option")
            if name == "consensus":
                raise InvalidOption(
                    "option storage.consensus: the consensus is no storage option; pass it as "
                    "option consensus (a sqlite:/// or postgresql:// URL)"
                )
            out[name] = _decode(value)
    return out


def shard_config(options: Mapping[str, Any], location: str | None = None) -> ShardConfig:
    """The shard configuration the options give (`CONFIG_OPTIONS`, names case-insensitive;
    `ShardConfig.from_options`, the one parser of Python arguments, Spark and SQL options and
    CLI flags): knobs left out keep their defaults."""
    knobs = {k: v for k, v in options.items() if k.lower() in CONFIG_OPTIONS}
    return ShardConfig.from_options(knobs, location=location, prefix="option ")


def shard_address(options: Mapping[str, Any], schema: Any, location: str) -> ShardAddress:
    """What opens the shard the options name, in the driver and in every task: the location,
    the storage options, the consensus URL (`consensus_url`) and the configuration."""
    return ShardAddress(
        location,
        storage_options(options),
        consensus_url(options, schema, location),
        shard_config(options, location),
    )


def refuse_catalog_secrets(address: ShardAddress, location: str) -> None:
    """Raise `InvalidOption` when a table created with ``address``'s options would keep a
    secret in Spark's catalog, which stores a table's OPTIONS as given and shows them
    (``SHOW CREATE TABLE``, ``DESCRIBE``): a consensus URL with a password, or any storage
    option (credentials). The message never holds the secret (the URL redacted, only the
    storage options' names). Checked before anything is stored, by the Python source's
    ``schema`` of a CREATE and by the JVM companion's session catalog for every CREATE of a
    persistshard table (`persistshard.datasource.bridge`, ``table_options``)."""
    consensus = address.consensus
    if consensus and url_has_password(consensus):
        raise InvalidOption(
            "a table's OPTIONS are stored in Spark's catalog, so a consensus URL with a "
            f"password ({redact_url(consensus)}) is refused there; give the password "
            "through the database's own configuration (PGPASSWORD, ~/.pgpass), or pass "
            "consensus per statement: WITH ('consensus' = '...')",
            location=location,
        )
    fsspec_names = sorted(address.storage_options)
    if fsspec_names:
        # fsspec's own configuration reaches every statement instead.
        raise InvalidOption(
            f"a table's OPTIONS are stored in Spark's catalog, so storage options "
            f"({', '.join(fsspec_names)}) are refused there; configure the storage "
            "through fsspec instead (FSSPEC_<PROTOCOL>_<NAME> environment variables or an "
            "fsspec config file), or pass storage.<name> options per statement",
            location=location,
        )


def consensus_url(
    options: Mapping[str, Any], schema: Any = None, location: str | None = None
) -> str | None:
    """The shard's consensus URL: the ``consensus`` option, else the one a SQL table keeps in
    its field metadata (`CONSENSUS_KEY`) when that metadata names the same ``location`` (a
    table's columns passed to a write of another shard never lend it their consensus)."""
    value = options.get("consensus")
    if value:
        return str(value)
    if schema is None or location is None:
        return None
    for f in getattr(schema, "fields", None) or []:
        meta = f.metadata or {}
        if CONSENSUS_KEY in meta and canonical_location(
            str(meta.get(LOCATION_KEY))
        ) == canonical_location(location):
            return str(meta[CONSENSUS_KEY])
    return None


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
            continue  # fails where the blob store opens it: unknown, or not installed
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
    value never means "the default": leave the option out for that). A known option that a
    catalog table's OPTIONS gave the statement (`TABLE_OPTIONS_KEY`) passes too: a table
    keeps the options of all its statements, each takes its own."""
    from_table = set(str(options.get(TABLE_OPTIONS_KEY) or "").lower().split(","))
    unknown = sorted(
        k
        for k in options
        if k.lower() not in allowed
        and not k.startswith(("__", "option."))
        and not k.lower().startswith(STORAGE_PREFIX)
        and not (k.lower() in from_table and k.lower() in ALL_OPTIONS)
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
    except Exception as e:
        translated = as_storage_error(e, location, doing)
        if translated is None:
            raise
        raise translated from translated.cause


#: Options whose value is a persistshard value: refused when given empty (`check_known`).
VALUED_OPTIONS = WRITE_OPTIONS | READ_OPTIONS | CONFIG_OPTIONS

#: Option ``retention``'s syntax (`parse_retention`).
RETENTION_SYNTAX = (
    "a window such as '7d', '12h', '30m' or '3600s', a number of versions such as "
    "'100 versions', both joined by ' and ' ('7d and 100 versions'), or 'none' to clear it"
)
_WINDOW = re.compile(r"([0-9]+)\s*([dhms])")
_VERSIONS = re.compile(r"([0-9]+)\s*versions?")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_retention(
    options: Mapping[str, str], key: str = "retention"
) -> tuple[int | None, int | None] | None:
    """Option ``retention`` as ``(seconds, versions)`` for `Shard.set_retention` (``(None,
    None)`` for ``none``: clear it); None when absent. Syntax: `RETENTION_SYNTAX`; anything
    else, a zero, or more versions than a shard keeps is `InvalidOption` naming the option."""
    from persistshard.core.statemachine.retention import MAX_VERSIONS

    value = options.get(key)
    if value is None:
        return None
    text = str(value).strip().lower()
    if text == "none":
        return (None, None)
    seconds: int | None = None
    versions: int | None = None
    for piece in re.split(r"\s*(?:,|\band\b)\s*", text):
        window = _WINDOW.fullmatch(piece)
        count = _VERSIONS.fullmatch(piece)
        if window is not None and seconds is None:
            seconds = int(window.group(1)) * _UNIT_SECONDS[window.group(2)]
            number = seconds
        elif count is not None and versions is None:
            versions = int(count.group(1))
            number = versions
        else:
            raise InvalidOption(f"option {key} must be {RETENTION_SYNTAX}; got {value!r}")
        if number <= 0:
            raise InvalidOption(f"option {key} must keep a positive amount, got {value!r}")
    if versions is not None and versions > MAX_VERSIONS:
        raise InvalidOption(
            f"option {key} keeps at most {MAX_VERSIONS} versions, got {value!r}; use a window "
            "('7d') for longer histories"
        )
    return (seconds, versions)


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
    """The shard location from the options or the schema's field metadata, if any.

    For reads (the reader's schema is the table's own); writes use `write_location`."""
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


def ddl_type(data_type: Any) -> tuple[str, bool]:
    """The Spark DDL string of a type, and whether parsing it gives exactly this type.

    DDL cannot say ``containsNull = false`` (arrays), ``valueContainsNull = false`` (maps),
    so such types are not exact; struct fields keep ``NOT NULL``."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, ArrayType):
        inner, exact = ddl_type(data_type.elementType)
        return f"array<{inner}>", exact and data_type.containsNull
    if isinstance(data_type, MapType):
        key, key_exact = ddl_type(data_type.keyType)
        value, value_exact = ddl_type(data_type.valueType)
        return f"map<{key},{value}>", key_exact and value_exact and data_type.valueContainsNull
    if isinstance(data_type, StructType):
        parts = []
        exact = True
        for f in data_type.fields:
            inner, inner_exact = ddl_type(f.dataType)
            exact = exact and inner_exact
            name = f.name.replace("`", "``")
            parts.append(f"`{name}`:{inner}{'' if f.nullable else ' NOT NULL'}")
        return f"struct<{','.join(parts)}>", exact
    return data_type.simpleString(), True


def table_metadata(schema: StructType, location: str, consensus: str | None = None) -> StructType:
    """``schema`` as a catalog table's schema: every field carries the location, the
    provenance marker and its own type under `RAW_TYPE_KEY` (module docstring), and the
    consensus URL when the table has one."""
    from pyspark.sql.types import StructField, StructType

    typed = [(f, *ddl_type(f.dataType)) for f in schema.fields]
    version = CATALOG_VERSION if all(exact for _, _, exact in typed) else CATALOG_PARTIAL
    fields = []
    for f, ddl, exact in typed:
        meta = {**(f.metadata or {}), LOCATION_KEY: location, CATALOG_KEY: version}
        if consensus:
            meta[CONSENSUS_KEY] = consensus
        if exact:
            meta[RAW_TYPE_KEY] = ddl
        fields.append(StructField(f.name, f.dataType, f.nullable, meta))
    return StructType(fields)


#: What a write that reached the source without a location should be written as instead.
WRITE_FORMS = (
    "name the shard in the statement: INSERT INTO t WITH ('path' = '/data/t') SELECT ... "
    "(also INSERT OVERWRITE t WITH (...) SELECT ... and ... TABLE s), "
    "df.writeTo('t').option('path', '/data/t').append(), or "
    "df.write.format('persistshard').mode('append').save('/data/t')"
)


NO_LOCATION = (
    "no shard location reached this write: Spark 4.3 passes none for INSERT ... "
    "SELECT and INSERT ... TABLE whose columns need no conversion, df.write.insertInto, "
    "df.writeTo(t).append(), saveAsTable, CREATE TABLE ... AS SELECT, and tables "
    "created with a column list (create those with CREATE TABLE t USING persistshard "
    "LOCATION '/data/t' OPTIONS (columns '...'))"
)


def write_location(options: Mapping[str, str], schema: Any = None) -> str:
    """Where a write goes: the ``path``/``location`` option, else the location in the
    schema's field metadata if the provenance rule (module docstring) proves it is the
    target's own; otherwise `InvalidOption` naming the statement forms that work."""
    for key in ("path", "location"):
        value = options.get(key)
        if value:
            return str(value)
    fields = list(getattr(schema, "fields", None) or [])
    located = [f for f in fields if LOCATION_KEY in (f.metadata or {})]
    if not located:
        raise InvalidOption(f"{NO_LOCATION}; {WRITE_FORMS}")
    locations = sorted({str(f.metadata[LOCATION_KEY]) for f in located})
    scanned = [f.name for f in fields if RAW_TYPE_KEY in (f.metadata or {})]
    versions = {str(f.metadata.get(CATALOG_KEY)) for f in located}
    if len(locations) == 1 and not scanned and versions == {CATALOG_VERSION}:
        return locations[0]
    if len(locations) > 1 or scanned:
        where = " and ".join(locations)
        raise InvalidOption(
            f"refused to write: this write's columns carry the shard location {where} of a "
            "table they were read from, which need not be the table the statement names "
            "(Spark 4.3 passes a query's columns to the writer unconverted, metadata "
            "included, when their names and types already match the target: INSERT ... "
            "SELECT/TABLE, insertInto, writeTo); nothing was written; " + WRITE_FORMS
        )
    if CATALOG_PARTIAL in versions:
        reason = (
            "the table has a column type whose DDL string is not exact (an array or map "
            "whose elements are declared non-null), so its catalog columns cannot prove "
            "where a write comes from"
        )
    else:
        reason = (
            "the table was created before persistshard marked its catalog columns, so they "
            "cannot prove where a write comes from; re-create it to write with plain "
            f"INSERT again (DROP TABLE t, then CREATE TABLE t USING persistshard LOCATION "
            f"'{locations[0]}': an external table's data stays)"
        )
    raise InvalidOption(f"refused to write to {locations[0]}: {reason}; {WRITE_FORMS}")


def require_location(options: Mapping[str, str], schema: Any = None) -> str:
    """`find_location` for a read, or an error that says how to name the shard."""
    location = find_location(options, schema)
    if location is not None:
        return location
    raise InvalidOption(
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
    #: Option ``maintenance``: the driver's bounded compaction and gc after its commit.
    maintenance: bool = True
    #: Option ``retention`` (`parse_retention`): set on the shard by the write's own commit,
    #: with its data (`persistshard.datasource.writer.BatchDescription.retention`).
    retention: tuple[int | None, int | None] | None = None
    #: What opens the shard (storage options, consensus URL, configuration).
    address: ShardAddress = field(default_factory=lambda: ShardAddress(""))
    merge_schema: bool = False

    @property
    def storage_options(self) -> StorageOptions:
        """The blob store's options (``storage.<name>``)."""
        return StorageOptions(self.address.storage_options)

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
        # One canonical spelling (`canonical_location`): every task, message and consensus
        # lookup of this write names the shard the way the Python API does.
        location = canonical_location(write_location(options, schema))
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
            maintenance=_bool(options, "maintenance", True),
            retention=parse_retention(options),
            memory_budget=memory_budget if memory_budget is not None else MEMORY_BUDGET,
            address=shard_address(options, schema, location),
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
    #: What opens the shard (storage options, consensus URL, configuration).
    address: ShardAddress = field(default_factory=lambda: ShardAddress(""))
    #: The ``where`` option's text (checked by the reader: `persistshard.core.read.filters`).
    where: str | None = None
    #: A streaming read holds the shard's since (a commit: needs write access) unless false.
    hold: bool = True
    #: A batch read of this durable consumer's changes: from its position to ``updates_to``
    #: (default: the upper seen at planning).
    consumer: str | None = None

    @property
    def storage_options(self) -> StorageOptions:
        """The blob store's options (``storage.<name>``)."""
        return StorageOptions(self.address.storage_options)

    @property
    def reads_updates(self) -> bool:
        return (
            self.updates_from is not None
            or self.updates_to is not None
            or self.consumer is not None
        )

    @staticmethod
    def parse(options: Mapping[str, str], schema: Any = None) -> ReadOptions:
        check_known(options, READ_OPTIONS | COMMON_OPTIONS | TABLE_OPTIONS, "read")
        location = canonical_location(require_location(options, schema))
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
            address=shard_address(options, schema, location),
            where=options.get("where"),
            hold=_bool(options, "hold", True),
            consumer=_name(options, "consumer"),
        )
        if parsed.consumer is not None and (
            parsed.updates_from is not None or parsed.as_of is not None or parsed.changes
        ):
            raise InvalidOption(
                "option consumer reads the changes from the consumer's position: it cannot be "
                "combined with updates_from, as_of or changes (updates_to bounds it)"
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
