"""persistshard.datasource: the Spark side (PySpark's Python Data Source API) over `core`.

- `source`: `PersistShardDataSource`, the format `persistshard` (schema, reader, writer).
- `options`: parsing and checking the read and write options.
- `reader`: batch reads: partitions planned on the driver, Arrow batches in the tasks.
- `writer`: batch and streaming writes: mint on the driver, write in tasks, append once.
- `stream`: streaming reads of a shard's changes.
- `compact`: `persistshard.compact(spark, location)`, merges spread over Spark tasks.
- `ddl`: parsing the `columns` option of `CREATE TABLE`; `types`: Spark <-> Arrow types.
"""
