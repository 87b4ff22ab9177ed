"""A partitioned, offset-based streaming source with Kafka's columns, reading local files.

It stands in for a Kafka topic in tests and in the demo: a directory holds one subdirectory
per source partition (``<topic>-<partition>``), and each subdirectory is that partition's
append-only log, made of immutable segment files ``<first offset>-<end offset>.arrow`` (Arrow
IPC; record ``i`` of a segment has offset ``first + i``). `append_records` adds a segment by
writing it under a temporary name and renaming it into place, so a reader never sees a
partial segment.

Rows have Kafka's columns: ``topic STRING, partition INT, offset BIGINT, key BINARY, value
BINARY, timestamp TIMESTAMP``. Spark offsets are ``{"<topic>:<partition>": offset upper}``;
option ``startingOffsets`` takes ``"earliest"`` (the default), ``"latest"``, Kafka's JSON
(``{"orders": {"0": 120}}``) or ``{"orders:0": 120}`` (what `persistshard.resume_offsets`
returns). ``maxRecordsPerPartition`` caps one micro-batch per partition.

Invariants: offsets of a partition are dense from 0; segments are never rewritten; a
micro-batch ``[start, end)`` always reads the same records (replays are exact).
Relies on: one appender per partition at a time (two appenders may race for a segment name;
the loser's rename fails and it raises).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from persistshard.errors import InvalidOption

log = logging.getLogger("persistshard.conformance.logsource")

SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, timestamp TIMESTAMP"
)
_SEGMENT = re.compile(r"^(\d{20})-(\d{20})\.arrow$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
#: What a segment file stores (offsets and topic/partition are implied by its place).
SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def _segments(directory: str) -> list[tuple[int, int, str]]:
    """``(first, end, path)`` of every segment of one partition directory, in offset order."""
    out = []
    for name in os.listdir(directory):
        m = _SEGMENT.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), os.path.join(directory, name)))
    out.sort()
    return out


def partitions_of(root: str) -> dict[str, str]:
    """``{"topic:partition": directory}`` for every partition under ``root``."""
    out: dict[str, str] = {}
    if not os.path.isdir(root):
        return out
    for name in os.listdir(root):
        m = _PARTITION_DIR.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            out[f"{m.group(1)}:{int(m.group(2))}"] = os.path.join(root, name)
    return out


def end_offsets(root: str) -> dict[str, int]:
    """The offset upper of every partition under ``root``."""
    return {
        key: (segs[-1][1] if (segs := _segments(path)) else 0)
        for key, path in partitions_of(root).items()
    }


def append_records(
    root: str,
    topic: str,
    partition: int,
    values: Sequence[bytes | str] | pa.Array,
    keys: Sequence[bytes | str | None] | pa.Array | None = None,
    timestamp_us: int | None = None,
) -> tuple[int, int]:
    """Append records to ``topic``'s ``partition``; returns their offsets ``[first, end)``."""
    if ":" in topic or not topic:
        raise InvalidOption(f"topic {topic!r} must be non-empty and have no ':'")
    directory = os.path.join(root, f"{topic}-{int(partition)}")
    os.makedirs(directory, exist_ok=True)
    segs = _segments(directory)
    first = segs[-1][1] if segs else 0
    value_array = (
        values
        if isinstance(values, pa.Array)
        else pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary())
    )
    n = len(value_array)
    if n == 0:
        return first, first
    if keys is None:
        key_array = pa.nulls(n, pa.binary())
    elif isinstance(keys, pa.Array):
        key_array = keys.cast(pa.binary())
    else:
        key_array = pa.array([k.encode() if isinstance(k, str) else k for k in keys], pa.binary())
    now = timestamp_us if timestamp_us is not None else int(time.time() * 1_000_000)
    table = pa.Table.from_arrays(
        [
            key_array,
            value_array.cast(pa.binary()),
            pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        ],
        schema=SEGMENT_SCHEMA,
    )
    final = os.path.join(directory, f"{first:020d}-{first + n:020d}.arrow")
    temp = os.path.join(directory, f".{uuid.uuid4().hex}.tmp")
    with pa.OSFile(temp, "wb") as sink, ipc.new_file(sink, SEGMENT_SCHEMA) as writer:
        writer.write_table(table)
    try:
        os.link(temp, final)  # fails if another appender took the name
    finally:
        os.unlink(temp)
    log.debug("appended offsets %d..%d to %s", first, first + n, directory)
    return first, first + n


def read_range(directory: str, topic: str, partition: int, lo: int, hi: int) -> pa.Table:
    """The records of one partition with offsets in ``[lo, hi)``, with every Kafka column."""
    pieces = []
    for first, end, path in _segments(directory):
        if end <= lo or first >= hi:
            continue
        with pa.memory_map(path) as source:
            table = ipc.open_file(source).read_all()
        a, b = max(lo, first) - first, min(hi, end) - first
        table = table.slice(a, b - a)
        offsets = pa.array(range(first + a, first + b), pa.int64())
        n = table.num_rows
        pieces.append(
            pa.Table.from_arrays(
                [
                    pa.array([topic] * n, pa.string()),
                    pa.array([partition] * n, pa.int32()),
                    offsets,
                    table.column("key"),
                    table.column("value"),
                    table.column("timestamp"),
                ],
                names=["topic", "partition", "offset", "key", "value", "timestamp"],
            )
        )
    if not pieces:
        return pa.table(
            {
                "topic": pa.array([], pa.string()),
                "partition": pa.array([], pa.int32()),
                "offset": pa.array([], pa.int64()),
                "key": pa.array([], pa.binary()),
                "value": pa.array([], pa.binary()),
                "timestamp": pa.array([], pa.timestamp("us", tz="UTC")),
            }
        )
    return pa.concat_tables(pieces)


def parse_starting_offsets(text: str | None, root: str) -> dict[str, int]:
    """``startingOffsets`` (see the module docstring) as ``{"topic:partition": offset}``."""
    if text is None or text.strip() in ("", "earliest"):
        return {}
    if text.strip() == "latest":
        return end_offsets(root)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidOption(f"startingOffsets is not 'earliest', 'latest' or JSON: {e}") from e
    if not isinstance(parsed, dict):
        raise InvalidOption(f"startingOffsets must be a JSON object, got {text!r}")
    out: dict[str, int] = {}
    for key, value in parsed.items():
        if isinstance(value, dict):
            for part, offset in value.items():
                out[f"{key}:{int(part)}"] = int(offset)
        else:
            out[str(key)] = int(value)
    for key, offset in out.items():
        if offset < 0:
            raise InvalidOption(f"startingOffsets: partition {key!r} has offset {offset}")
    return out


@dataclass(frozen=True)
class LogPartition(InputPartition):
    """One source partition's records in ``[lo, hi)``."""

    directory: str
    topic: str
    partition: int
    lo: int
    hi: int


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the partition logs under ``path`` (see the module docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = options.get("path") or ""
        if not self.root:
            raise InvalidOption("the partitioned log source needs a directory: .load(path)")
        self.starting = options.get("startingoffsets")
        cap = options.get("maxrecordsperpartition")
        self.cap = int(cap) if cap else None
        self._target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return parse_starting_offsets(self.starting, self.root)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerPartition`` as a row limit (applied to each partition)."""
        return ReadAllAvailable() if self.cap is None else ReadMaxRows(self.cap)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = end_offsets(self.root)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, int]:
        ends = end_offsets(self.root)
        if self._target is not None:  # availableNow: nothing appended after the query started
            ends = {k: min(v, self._target.get(k, 0)) for k, v in ends.items()}
        begin = {k: int(v) for k, v in (start or {}).items()}
        if isinstance(limit, ReadMaxRows):
            ends = {k: min(v, begin.get(k, 0) + limit.max_rows) for k, v in ends.items()}
        for key, value in begin.items():  # never behind where the micro-batch starts
            ends[key] = max(ends.get(key, 0), value)
        return ends

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[LogPartition]:
        dirs = partitions_of(self.root)
        out = []
        for key, hi in sorted(end.items()):
            lo = int(start.get(key, 0))
            if int(hi) <= lo or key not in dirs:
                continue
            topic, part = key.rsplit(":", 1)
            out.append(LogPartition(dirs[key], topic, int(part), lo, int(hi)))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogPartition)
        p = partition
        table = read_range(p.directory, p.topic, p.partition, p.lo, p.hi)
        yield from table.to_batches(max_chunksize=65536)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the logs are never trimmed by the reader."""


class PartitionedLogSource(DataSource):
    """``spark.readStream.format("partitioned_log").load(directory)``; register it first with
    ``spark.dataSource.register(PartitionedLogSource)``."""

    @classmethod
    def name(cls) -> str:
        return "partitioned_log"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogStreamReader(dict(self.options))


__all__ = [
    "SCHEMA_DDL",
    "LogStreamReader",
    "PartitionedLogSource",
    "append_records",
    "end_offsets",
    "parse_starting_offsets",
    "partitions_of",
    "read_range",
]
