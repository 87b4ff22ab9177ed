"""SQL table functions over a shard: ``persistshard_history(location)``, its log as rows.

``SELECT * FROM persistshard_history('/data/orders')`` returns one row per state version still
in the shard's log, oldest first, with the columns of `HISTORY_SCHEMA`: what
``persistshard history LOCATION`` prints and `persistshard.Shard.history` returns, with each
commit's operation metrics as a map (``metrics['rows_added']``, ``metrics['store_requests']``,
...; NULL for entries written before metrics existed). It plays the part of Delta's
``DESCRIBE HISTORY``, as a Python UDTF (PySpark 4's ``@udtf`` API).

Registration: Spark 4.3 discovers Python *data sources* by itself (the ``pyspark_persistshard``
module) but no Python *functions*; `register` registers the function (and the data source) in a
session: ``persistshard.register(spark)``. A SQL-only deployment runs that once per session,
e.g. in its startup script.

Invariants and what they rely on:
- The function reads the log; it never writes to the shard, so read access suffices.
- It takes a shard *location*, not a table name: a UDTF runs in a Python worker that cannot
  see Spark's catalog (``SHOW TABLE EXTENDED LIKE 't'`` shows a table's location). Storage
  options reach it only through fsspec's own configuration (environment variables, config
  files), never through the SQL text, which Spark logs.
- A location that holds no shard is `NoShard`; storage failures are `StorageError`; a NULL or
  empty location is `InvalidOption`. The message starts with the class name (Spark keeps only
  the text).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

from persistshard.core.shard import Shard
from persistshard.datasource.options import check_shared, storage_errors
from persistshard.errors import InvalidOption, NoShard

log = logging.getLogger("persistshard.datasource.udtf")

#: The name the history function is registered under.
HISTORY_FUNCTION = "persistshard_history"

#: The rows of `PersistShardHistory`, in Spark DDL.
HISTORY_SCHEMA = (
    "version BIGINT, committed_at TIMESTAMP, kind STRING, commit STRING, "
    "commit_id STRING, summary STRING, metrics MAP<STRING, BIGINT>"
)


class PersistShardHistory:
    """``persistshard_history(location)``: the shard's log, one row per state version."""

    def eval(self, location: Any) -> Iterator[tuple[Any, ...]]:
        if location is None or not str(location).strip():
            raise InvalidOption(
                f"{HISTORY_FUNCTION} takes the shard's location, got {location!r}: "
                f"SELECT * FROM {HISTORY_FUNCTION}('/data/t') (SHOW TABLE EXTENDED LIKE 't' "
                "shows a table's location)"
            )
        location = str(location)
        check_shared(location)
        with storage_errors(location, "read the shard's log"):
            shard = Shard(location)
            if shard.inspect.head_version() is None:
                raise NoShard(
                    f"no shard at {shard.location}: no state was ever committed there (a "
                    f"mistyped path? {HISTORY_FUNCTION} takes a location, not a table name)"
                )
            history = shard.inspect.history()
        log.debug("%s: %d history entries", shard.location, len(history))
        for h in history:
            at = h.get("at_ms")
            yield (
                int(h["version"]),
                dt.datetime.fromtimestamp(at / 1000, dt.UTC) if at else None,
                str(h["kind"]),
                str(h["commit"]),
                str(h["id"]),
                str(h["summary"]),
                _numbers(h.get("metrics")),
            )


def _numbers(metrics: dict[str, Any] | None) -> dict[str, int] | None:
    """The figures of a history entry's ``metrics`` (rows/bytes/parts added and removed,
    duration_ms, retries, store_requests, ...), or None for an entry written before metrics
    existed. The operation's name is a string and is left out of the map."""
    if metrics is None:
        return None
    return {k: int(v) for k, v in metrics.items() if isinstance(v, int) and not isinstance(v, bool)}


def history_udtf() -> Any:
    """`PersistShardHistory` as a PySpark UDTF (imports pyspark)."""
    from pyspark.sql.functions import udtf

    return udtf(PersistShardHistory, returnType=HISTORY_SCHEMA)


def register(spark: Any) -> None:
    """Make persistshard's SQL table functions (``persistshard_history``) and the data source
    ``persistshard`` known to ``spark``'s session. Idempotent."""
    from persistshard.datasource.source import PersistShardDataSource

    spark.dataSource.register(PersistShardDataSource)
    spark.udtf.register(HISTORY_FUNCTION, history_udtf())


__all__ = ["HISTORY_FUNCTION", "HISTORY_SCHEMA", "PersistShardHistory", "history_udtf", "register"]
