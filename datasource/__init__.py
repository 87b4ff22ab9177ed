"""persistshard.datasource: the Spark side (PySpark's Python Data Source API) over `core`.

- `source`: `PersistShardDataSource`, the format `persistshard` (schema, reader, writer).
- `options`: parsing and checking the read and write options.
- `reader`: batch reads: partitions planned on the driver, Arrow batches in the tasks.
- `writer`: the write protocol: mint on the driver, write in tasks, append once.
- `sinks`: the Spark writer objects (batch and streaming) over `writer` and `reclock`.
- `reclock`: the reclocking streaming sink (a remap shard binds source offsets to times).
- `stream`: streaming reads of a shard's changes.
- `compact`: `persistshard.compact(spark, location)`, merges spread over Spark tasks.
- `ddl`: parsing the `columns` option of `CREATE TABLE`; `types`: Spark <-> Arrow types.
- `udtf`: SQL table functions (`persistshard_history(location)`), `register(spark)`.
"""
