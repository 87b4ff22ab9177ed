"""The `persistshard` Spark data source: schema, readers and writers for batch, stream and SQL.

`PersistShardDataSource` is what Spark instantiates (as ``pyspark_persistshard.DefaultSource``)
for ``format("persistshard")`` and ``USING persistshard``. It only parses options and hands
off: reads to `persistshard.datasource.reader`, writes to `persistshard.datasource.writer`,
streams to `persistshard.datasource.stream`.

The schema it reports:
- a snapshot: the shard's columns (plus ``_diff`` with ``with_diff``);
- a change read (``updates_from`` / ``updates_to``, or ``changes``): columns + ``_time`` +
  ``_diff``. Spark calls ``schema()`` with the same options for a stream as for a batch read,
  so a stream asks for this schema with ``changes`` or ``updates_from``;
- in ``CREATE TABLE`` (options carry ``location``): the shard's columns, or those of the
  ``columns`` option for a new shard, each field carrying the location and the provenance
  marker in its metadata, which is how later SQL statements find the table's shard and how a
  write tells the target's columns from a source table's (`persistshard.datasource.options`).
  With ``OPTIONS (changes 'true')`` the table also has ``_time`` and ``_diff`` (a *change
  table*: its SELECTs return updates, so ``WITH ('updates_from' = ...)`` keeps them), with
  ``OPTIONS (with_diff 'true')`` it has ``_diff``.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import LongType, StructField, StructType

from persistshard.core.rows import DIFF, TIME
from persistshard.datasource.options import (
    LOCATION_KEY,
    ReadOptions,
    check_shared,
    find_location,
    refuse_catalog_secrets,
    require_location,
    shard_address,
    storage_errors,
    table_metadata,
)
from persistshard.datasource.types import spark_schema_of
from persistshard.errors import InvalidOption, NoShard

log = logging.getLogger("persistshard.datasource.source")

STREAM_MARK = "persistshard.stream"


def _with_system(schema: StructType, *names: str) -> StructType:
    fields = [f for f in schema.fields if f.name not in (TIME, DIFF)]
    for name in names:
        fields.append(StructField(name, LongType(), nullable=False))
    return StructType(fields)


class PersistShardDataSource(DataSource):
    """``format("persistshard")``: versioned, compacting (row, time, diff) storage."""

    @classmethod
    def name(cls) -> str:
        return "persistshard"

    def schema(self) -> StructType:
        options = dict(self.options)
        location = require_location(options)
        check_shared(location)
        creating = "location" in options or "provider" in options
        address = shard_address(options, None, location)
        consensus = address.consensus
        if creating:
            refuse_catalog_secrets(address, location)
        with storage_errors(location, "read the shard"):
            shard = address.open()
            stored = shard.schema
        if stored is None:
            columns = options.get("columns")
            if columns is None:
                if creating:
                    raise InvalidOption(
                        f"no shard at {shard.location} yet: give the new table its columns, "
                        "e.g. OPTIONS (columns 'id BIGINT, name STRING'), or write to the "
                        "location first",
                    )
                raise NoShard(
                    f"no shard at {shard.location}: nothing was ever written there (a "
                    "mistyped path, or the wrong storage options?); write to it first "
                    "(df.write.format('persistshard').save(path))",
                )
            from persistshard.core.write.validate import user_schema
            from persistshard.datasource.ddl import parse_columns
            from persistshard.datasource.types import arrow_schema_of

            stored = user_schema(arrow_schema_of(parse_columns(columns)))
        elif options.get("columns"):
            raise InvalidOption(
                f"the shard at {shard.location} already has columns ({stored}); drop the "
                "columns option to use them",
            )
        if creating and "retention" in options:
            # CREATE TABLE ... OPTIONS (retention '7d'): stored in the shard's state, where
            # every writer (Python, Spark, CLI) follows it, not in the catalog.
            from persistshard.datasource.options import parse_retention
            from persistshard.datasource.writer import apply_retention

            wanted = parse_retention(options)
            with storage_errors(location, "set the shard's retention"):
                apply_retention(shard, wanted)
            options = {k: v for k, v in options.items() if k.lower() != "retention"}
        opts = ReadOptions.parse(options)
        if opts.reads_updates or opts.changes:
            names: tuple[str, ...] = (TIME, DIFF)
        elif opts.with_diff:
            names = (DIFF,)
        else:
            names = ()
        if creating:
            # The location rides in every field's metadata with the provenance marker
            # (datasource/options.py); a change table (OPTIONS (changes 'true')) also carries
            # _time and _diff, so SELECT keeps them.
            base = spark_schema_of(stored)
            return table_metadata(
                _with_system(base, *names) if names else base, shard.location, consensus
            )
        base = spark_schema_of(stored)
        return _with_system(base, *names) if names else base

    def reader(self, schema: StructType) -> DataSourceReader:
        from persistshard.datasource.reader import (
            PersistShardReader,
            ScopedPushdownReader,
            planning_with_pushdown,
            spark_scopes_read_info,
        )

        options = dict(self.options)
        with storage_errors(find_location(options, schema), "read the shard"):
            # pushFilters only where Spark keeps pushed reads per scan, and only inside its
            # pushdown planning worker (reader.py); otherwise Spark evaluates every filter.
            if spark_scopes_read_info() and planning_with_pushdown():
                log.debug("reader with scoped filter pushdown")
                return ScopedPushdownReader(options, schema)
            return PersistShardReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from persistshard.datasource.sinks import PersistShardWriter

        options = dict(self.options)
        # Only an explicit path names the location here: the metadata's may be another
        # table's (write_location decides, in the writer).
        with storage_errors(find_location(options), "write the shard"):
            if options.get("key_columns"):  # an upsert write (datasource/upsert.py)
                from persistshard.datasource.upsert import UpsertWriter

                return UpsertWriter(options, schema, overwrite)
            return PersistShardWriter(options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from persistshard.datasource.sinks import PersistShardStreamWriter

        if self.options.get("key_columns"):  # an upsert stream (datasource/upsert.py)
            from persistshard.datasource.upsert import UpsertStreamWriter

            return UpsertStreamWriter(dict(self.options), schema, overwrite)
        return PersistShardStreamWriter(dict(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from persistshard.datasource.stream import PersistShardStreamReader

        if self.options.get("where") is not None:
            raise InvalidOption(
                f"option where {self.options['where']!r} applies to batch reads only; filter "
                "a stream in Spark (df.where(...))"
            )
        return PersistShardStreamReader(dict(self.options), schema)


__all__ = ["LOCATION_KEY", "PersistShardDataSource", "find_location", "pa"]
