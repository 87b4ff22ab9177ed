"""Row-level operations through the JVM companion: ``DELETE FROM``, ``UPDATE`` and ``MERGE
INTO`` as one compare-and-append of retractions and insertions (docs/design.md, "Row-level
operations").

Spark runs these as a *delta-based* row-level operation of the companion's table
(``jvm/src/persistshard/companion/DeltaOperation.java``): it reads the target with a row id
(the whole row, as one non-null struct), decides per row what to do, and hands a writer
``delete(row id)``, ``update(row id, new row)`` and ``insert(new row)``. A row with
multiplicity ``k`` is read as ``k`` rows, so it is deleted (or updated) ``k`` times. The
companion turns these into rows with a diff (``-1`` for the old row, ``+1`` for the new) and
hands them to Python, which writes and commits them with the one write protocol every Spark
write uses (`persistshard.datasource.writer`: mint, write parts, compare-and-append, sweep):

- `begin` (driver, when Spark builds the operation, before the target is read): the shard's
  upper ``U`` now, and a batch writer minted with ``expected_upper = U``. The companion reads
  the target at ``as_of U - 1`` (the snapshot the statement decides on) and the commit
  expects ``U``: another writer committing in between makes the commit `UpperMismatch`,
  never a retraction of rows that are no longer there (a plain append would rebase; this
  never does).
- `write` (every task, a request to a pooled ``bridge writes`` worker): the task's rows with
  their ``_diff`` as Arrow, written as the task's parts under the write id; the answer is the
  pickled commit message.
- `commit` (driver): every task's parts in one compare-and-append at time ``U`` (new upper
  ``U + 1``); a refusal sweeps the write's parts, as does `abort`.

Invariant: the shard changes only in `commit`, atomically; a failed or refused statement
leaves it as it was, with no part of the write left behind.
"""

from __future__ import annotations

import base64
import logging
import pickle
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from persistshard.core.rows import DIFF, TIME
from persistshard.datasource.options import WriteOptions, find_location, storage_errors
from persistshard.datasource.sinks import PersistShardWriter
from persistshard.datasource.types import arrow_schema_of
from persistshard.errors import InvalidOption

log = logging.getLogger("persistshard.datasource.rowlevel")

#: Table options that would change what the operation's rows mean (their times, their diffs,
#: the new upper, an upsert or a reclocking): the operation writes its rows as they are.
ROW_MEANING_OPTIONS = (
    "time_column",
    "diff_column",
    "upper",
    "expected_upper",
    "key_columns",
    "delete_column",
    "remap",
    "writer_id",
    "batch_id",
)


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


def _schema(value: Any) -> StructType:
    parsed = StructType.fromJson(value)
    assert isinstance(parsed, StructType)
    return parsed


def write_schema(table: StructType) -> StructType:
    """The rows the companion hands over: the table's columns, then ``_diff`` (non-null)."""
    return StructType([*table.fields, StructField(DIFF, LongType(), False)])


def begin(options: dict[str, str], table: StructType) -> dict[str, Any]:
    """The driver's first step (module docstring): ``{"writer": pickled writer (base64),
    "lower": U}``. A table that shows ``_time`` or ``_diff`` (a change table) has no rows to
    delete or update: `InvalidOption`."""
    location = find_location(options, table)
    shown = [f.name for f in table.fields if f.name in (TIME, DIFF)]
    if shown:
        raise InvalidOption(
            f"DELETE, UPDATE and MERGE change a table's rows; this table shows the change "
            f"columns {', '.join(shown)} (a change table): run them on a table of the shard's "
            "rows (without the changes option)",
            location=location,
        )
    schema = write_schema(table)
    kept = {k: v for k, v in options.items() if k.lower() not in ROW_MEANING_OPTIONS}
    with storage_errors(location, "begin the row-level operation"):
        opts = WriteOptions.parse(kept, schema)
        lower = opts.address.open().upper
        writer = PersistShardWriter({**kept, "expected_upper": str(lower)}, schema, False)
    log.debug(
        "%s: row-level write %s begins at upper %d", location, writer.description.write_id, lower
    )
    return {"writer": _encode(writer), "lower": lower}


def _messages(request: dict[str, Any]) -> list[Any]:
    return [None if m is None else _decode(m) for m in request["messages"]]


def driver_step(kind: str, request: dict[str, Any]) -> dict[str, Any]:
    """One driver step asked through ``bridge serve``: ``delta_begin`` (`begin`),
    ``delta_commit`` (every task's parts in one compare-and-append) or ``delta_abort`` (the
    write's parts swept)."""
    if kind == "delta_begin":
        return begin(dict(request["options"]), _schema(request["schema"]))
    if kind not in ("delta_commit", "delta_abort"):
        raise ValueError(f"unknown bridge request kind {kind!r}")
    writer = _decode(request["writer"])
    assert isinstance(writer, PersistShardWriter)
    if kind == "delta_commit":
        writer.commit(_messages(request))
    else:
        writer.abort(_messages(request))
    return {"done": kind}


class ByteSource(Protocol):
    """What `write` reads its task's Arrow stream from (a ``bridge writes`` request's body)."""

    def read(self, n: int = -1, /) -> bytes: ...


def write(header: dict[str, Any], source: ByteSource) -> dict[str, str]:
    """One task (a ``bridge writes`` request): ``header`` is ``{"writer", "schema"}``,
    ``source`` an Arrow IPC stream of the task's rows in `write_schema` order; the task's parts
    are written under the write's id and the answer is ``{"message": pickled commit
    message}``. Batches are cast to the Arrow types Spark's Python writers see
    (`arrow_schema_of`)."""
    writer = _decode(header["writer"])
    assert isinstance(writer, PersistShardWriter)
    target = arrow_schema_of(_schema(header["schema"]))

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in pa.ipc.open_stream(source):
            yield batch if batch.schema.equals(target) else batch.cast(target)

    message = writer.write(batches())
    return {"message": _encode(message)}
