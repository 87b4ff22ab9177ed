"""Conversions between Spark's and Arrow's schemas, in one place.

Spark hands the writer Arrow batches and expects the reader to yield Arrow batches that match
the read schema exactly (column order, plain ``string`` rather than ``large_string``,
nullability). `arrow_schema_of` is the Arrow form Spark uses for a StructType;
`spark_schema_of` the StructType of a shard's stored Arrow schema.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructField, StructType


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for ``schema`` (timestamps in UTC, no large types)."""
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def spark_schema_of(schema: pa.Schema, metadata: dict[str, str] | None = None) -> StructType:
    """The StructType of an Arrow schema; ``metadata`` is added to every field."""
    struct = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    if not metadata:
        return struct
    return StructType(
        [
            StructField(f.name, f.dataType, f.nullable, {**(f.metadata or {}), **metadata})
            for f in struct.fields
        ]
    )


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` with exactly the columns, order, types and nullability of ``target``;
    columns of ``target`` that ``table`` lacks are nulls."""
    have = set(table.column_names)
    if not all(name in have for name in target.names):
        # Columns the shard does not have yet (ALTER TABLE ... ADD COLUMNS) read as nulls.
        arrays = [
            table.column(f.name) if f.name in have else pa.nulls(table.num_rows, f.type)
            for f in target
        ]
        table = pa.Table.from_arrays(arrays, names=target.names)
    table = table.select(target.names)
    if table.schema.equals(target, check_metadata=False):
        return table
    arrays = [table.column(i).cast(target.field(i).type) for i in range(len(target))]
    return pa.Table.from_arrays(arrays, schema=target)
