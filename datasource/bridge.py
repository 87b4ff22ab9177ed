"""The JVM companion's way into the Python source: ``python -m persistshard.datasource.bridge
serve|reads|writes``, JSON requests on stdin (docs/design.md, "JVM companion").

The companion's columnar scans (``jvm/src/persistshard/companion``) keep one implementation
of the state machine and of read planning, this one:

- A plan (``serve``'s request of no other ``kind``): the request holds the read's options, the
  relation's schema and the columns the scan needs (``required``, Spark's JSON schemas). The
  answer is what
  `PersistShardReader.partitions` plans for those columns, one entry per Spark partition:
  ``{"native": [slice, ...], "columns": [...]}`` when every slice of it may be decoded by the
  JVM as stored (`persistshard.core.read.plan.direct_slices`: a local part file, inline
  bytes, or a part at a Hadoop URL whose scheme the request's ``hadoop_schemes`` lists (the
  schemes the driver's JVM found a Hadoop file system for); diffs proven 1, no time filter,
  every column stored with the Arrow type Spark reads; a slice is ``{"key", "path" | "url" |
  "inline" (base64), "chunks"}``, a URL never with credentials), else ``{"python": ...}``, the
  Python source's own partition, pickled (base64). Also ``size_bytes`` and ``num_rows``, the
  relevant parts' sizes and update counts (each part once, however many partitions read
  it), for Spark's optimizer (the JVM scales the size to the scan's columns).
- ``serve``: requests one per line on stdin, answers one per line on stdout (``{"error":
  text}`` for a failed one), until stdin ends: the JVM keeps one such process per
  interpreter, so planning a scan starts no interpreter. A request is a ``plan`` unless its
  ``kind`` is ``schema`` (`schema`: the Python source's ``schema()``, the companion's
  ``inferSchema``), ``time_at`` (`time_at`: the session catalog's ``TIMESTAMP AS OF``),
  ``table_options`` (`table_options`: the session catalog's check, before it stores a
  table, that its OPTIONS hold no secret) or names
  one of `persistshard.datasource.rowlevel`'s driver steps of a row-level operation
  (``delta_begin``, ``delta_commit``, ``delta_abort``).
- ``reads``: partitions read one after another by one long-lived process (the JVM keeps a
  pool of them per executor, so a partition read by Python starts no interpreter). A
  request holds the options, ``required`` and one ``python`` partition, framed on stdin as
  a 4-byte big-endian length and that many bytes of JSON (a zero length or the end of stdin
  ends the process). Its answer on stdout is a sequence of frames, each a tag byte and a
  4-byte big-endian length (`FRAME`): ``D`` frames carry, concatenated, an Arrow IPC stream
  of exactly what the Python source's read of that partition yields (`read`:
  `PersistShardReader.read`'s consolidation, time rewriting, repetition; a read of no
  columns, ``count(*)``, streams one column of nulls, `ROWS`, for the counts); then one
  ``E`` frame (empty: the read ended well) or ``X`` frame (JSON string: the error's text),
  after which the process takes the next request.
- ``writes``: tasks of row-level operations written one after another by one long-lived
  process (the JVM keeps a pool of them per interpreter, as of ``reads``, so a task starts
  no interpreter). A request is framed as a ``reads`` request, its JSON naming the pickled
  writer and the rows' schema, followed by a body: ``D`` frames carrying, concatenated, an
  Arrow IPC stream of the task's rows with their diffs, then one ``E`` frame (`FramedBody`).
  The task's parts are written as the task's (`persistshard.datasource.rowlevel.write`); the
  answer is framed as a ``reads`` answer: ``D`` frames carrying the JSON ``{"message":
  pickled commit message}``, then ``E``, or one ``X`` frame. A request whose input ends
  before its ``E`` frame (the JVM ended the worker: Spark aborted the task) ends the
  process; what it wrote carries the write's id and is swept by the driver.

Invariants: an error of a ``serve`` request is its answer ``{"error": text}``, the error's
text (which starts with its class name), so the JVM raises it with the same class name as the
Python source would show, and the process goes on; nothing else is written to stdout on
failure than what a consumer of a partial answer must discard anyway. An error of one
``reads`` or ``writes`` request is its ``X`` frame, with the same text, and the process goes
on (a ``writes`` request's body read to its ``E`` frame
first); a request's answer always ends with exactly one ``E`` or ``X``
frame, so a reader that consumed it may send the next request. Option
checks and errors are the Python source's, for the relation's whole schema (pruning changes
no error). Logging goes to stderr.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import struct
import sys
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO

import pyarrow as pa
from pyspark.sql.types import StructType

from persistshard.core.read.instant import time_at_instant
from persistshard.core.shard import direct_read_slices
from persistshard.datasource.options import (
    find_location,
    refuse_catalog_secrets,
    require_location,
    shard_address,
    storage_errors,
)
from persistshard.datasource.reader import BATCH_ROWS, PersistShardReader, ShardPartition
from persistshard.datasource.types import arrow_schema_of

log = logging.getLogger("persistshard.datasource.bridge")

#: The one column (of nulls) of a read that needs no column: its batches carry row counts.
ROWS = "_rows"


def _schema(value: Any) -> StructType:
    parsed = StructType.fromJson(value)
    assert isinstance(parsed, StructType)
    return parsed


def handed_over(stored: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column stored as ``stored`` decodes in the JVM to what Spark reads as
    ``wanted`` (the Arrow type of its Spark type): the same type, a large string for a
    string (Spark's vectors read both), or a decimal of the same precision and scale (the
    JVM decoder widens every decimal to 128 bits, Spark's width)."""
    if stored == wanted:
        return True
    if pa.types.is_large_string(stored) and pa.types.is_string(wanted):
        return True
    return (
        pa.types.is_decimal(stored)
        and pa.types.is_decimal(wanted)
        and (stored.precision, stored.scale) == (wanted.precision, wanted.scale)
    )


def plan(request: dict[str, Any]) -> dict[str, Any]:
    """The answer of ``plan`` (module docstring)."""
    options: dict[str, str] = dict(request["options"])
    schema, required = _schema(request["schema"]), _schema(request["required"])
    with storage_errors(find_location(options, schema), "read the shard"):
        reader = PersistShardReader(options, required, table_schema=schema)
        partitions = reader.partitions()
        shard = reader.opts.address.open() if partitions else None
    target = arrow_schema_of(required)
    hadoop = frozenset(request.get("hadoop_schemes", ()))

    def accepts(stored: pa.Schema) -> bool:
        return all(
            f.name in stored.names and handed_over(stored.field(f.name).type, f.type)
            for f in target
        )

    out: list[dict[str, Any]] = []
    size = rows = 0
    counted: set[str] = set()  # a part split over several partitions counts once
    for p in partitions:
        for s in p.task.slices:
            if s.ref.key not in counted:
                counted.add(s.ref.key)
                size += s.ref.size
                rows += s.ref.num_rows
        direct = None
        if p.result_filter is None and shard is not None:
            direct = direct_read_slices(shard, p.task, accepts, hadoop)
        if direct is None:
            payload = base64.b64encode(pickle.dumps(p)).decode("ascii")
            out.append({"python": payload})
            continue
        slices = [
            {
                "key": d.key,
                "path": d.path,
                "url": d.url,
                "inline": None if d.inline is None else base64.b64encode(d.inline).decode(),
                "chunks": list(d.chunks),
            }
            for d in direct
        ]
        out.append({"native": slices, "columns": target.names})
    native = sum("native" in p for p in out)
    log.debug("plan: %d partitions, %d read in the JVM", len(out), native)
    return {"partitions": out, "size_bytes": size, "num_rows": rows}


def schema(request: dict[str, Any]) -> dict[str, Any]:
    """``{"schema": json}``: what the Python source's ``schema()`` answers for the request's
    ``options`` (`PersistShardDataSource.schema`, given the options as Spark's Python
    worker gives them, case-insensitive), as Spark's JSON. The companion's ``inferSchema``
    asks this instead of running the source in one of Spark's Python workers: the same
    method and checks, one round trip to this long-lived process."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    from persistshard.datasource.source import PersistShardDataSource

    options = CaseInsensitiveDict(dict(request["options"]))
    return {"schema": PersistShardDataSource(options).schema().json()}


def time_at(request: dict[str, Any]) -> dict[str, Any]:
    """``{"as_of": t}``: the shard time of the instant ``micros`` (microseconds since the
    epoch) in the shard the table's ``options`` name (`time_at_instant`)."""
    options: dict[str, str] = dict(request["options"])
    location = require_location(options)
    with storage_errors(location, "read the shard"):
        shard = shard_address(options, None, location).open()
        return {"as_of": time_at_instant(shard, int(request["micros"]))}


def table_options(request: dict[str, Any]) -> dict[str, Any]:
    """``{}`` when a table created with ``options`` keeps no secret in Spark's catalog, else
    the Python source's refusal (`refuse_catalog_secrets`): the session catalog asks before
    it stores a persistshard table, whatever columns the CREATE declares."""
    options: dict[str, str] = dict(request["options"])
    location = require_location(options)
    refuse_catalog_secrets(shard_address(options, None, location), location)
    return {}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """One ``serve`` request's answer, by its ``kind`` (module docstring)."""
    kind = request.get("kind", "plan")
    if kind == "plan":
        return plan(request)
    if kind == "schema":
        return schema(request)
    if kind == "time_at":
        return time_at(request)
    if kind == "table_options":
        return table_options(request)
    from persistshard.datasource import rowlevel

    return rowlevel.driver_step(kind, request)


def read(request: dict[str, Any], sink: BinaryIO | FramedAnswer) -> None:
    """The Python source's rows of one partition as an Arrow IPC stream on ``sink``, in the
    Arrow schema of ``required``: one ``reads`` request's answer (module docstring)."""
    options: dict[str, str] = dict(request["options"])
    required = _schema(request["required"])
    partition = pickle.loads(base64.b64decode(request["partition"]))
    assert isinstance(partition, ShardPartition)
    target = arrow_schema_of(required)
    counting = len(target) == 0  # e.g. count(*): only the row counts matter
    streamed = pa.schema([pa.field(ROWS, pa.null())]) if counting else target
    with storage_errors(partition.location, "read the shard"):
        reader = PersistShardReader(options, required)
        with pa.ipc.new_stream(sink, streamed) as stream:
            for table in reader.read_tables(partition):
                if counting:
                    table = pa.table({ROWS: pa.nulls(table.num_rows)})
                for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                    stream.write_batch(batch)


#: An answer frame's header (and a ``writes`` request body's): its tag (`DATA`, `END`,
#: `FAILED`), its payload's length.
FRAME = struct.Struct(">cI")
DATA, END, FAILED = b"D", b"E", b"X"
#: A ``reads`` or ``writes`` request's header: the JSON's length.
REQUEST = struct.Struct(">I")


class FramedAnswer:
    """The stdout of one ``reads`` or ``writes`` answer, as the file Arrow's stream writer
    writes: its bytes go out as `DATA` frames of up to `FRAME_BYTES` (small writes buffered
    together). `end` and `fail` write the answer's last frame and flush."""

    FRAME_BYTES = 1 << 20

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._pending = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._pending += data
        if len(self._pending) >= self.FRAME_BYTES:
            self._send_pending()
        return len(data)

    def flush(self) -> None:
        """Arrow's writer may flush; frames go out by size and at the end."""

    def close(self) -> None:
        """Arrow's writer may close its file; the answer ends with `end` or `fail`."""

    def _send_pending(self) -> None:
        if self._pending:
            self._out.write(FRAME.pack(DATA, len(self._pending)))
            self._out.write(self._pending)
            self._pending = bytearray()

    def end(self) -> None:
        self._send_pending()
        self._out.write(FRAME.pack(END, 0))
        self._out.flush()

    def fail(self, text: str) -> None:
        """The request failed: what was written of its stream is dropped by the reader."""
        payload = json.dumps(text).encode()
        self._pending = bytearray()
        self._out.write(FRAME.pack(FAILED, len(payload)))
        self._out.write(payload)
        self._out.flush()


class Abandoned(Exception):
    """The JVM's end of the pipe closed in the middle of a request: nobody reads an answer
    (the JVM ended this worker, say for a task Spark aborted), so the worker ends."""


class FramedBody:
    """The body of one ``writes`` request, as the file Arrow's stream reader reads: the
    payloads of its `DATA` frames, concatenated, ending at its `END` frame. `drain` reads to
    that frame (what Arrow's reader left, or all of it after a failure), so the next request
    starts where it should. The input ending before the `END` frame is `Abandoned`."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        self._left = 0
        self.ended = False
        self.abandoned = False
        self.closed = False

    def readable(self) -> bool:
        return True

    def _take(self, n: int) -> bytes:
        data = self._source.read(n)
        if len(data) < n:
            self.abandoned = True
            raise Abandoned(f"the request's body ended after {len(data)} of {n} bytes")
        return data

    def _more(self) -> bool:
        """Positions at data (True) or the body's end (False)."""
        while self._left == 0 and not self.ended:
            tag, length = FRAME.unpack(self._take(FRAME.size))
            if tag == END:
                self.ended = True
            elif tag == DATA:
                self._left = length
            else:
                self.abandoned = True
                raise Abandoned(f"frame tag {tag!r} in a request's body")
        return not self.ended

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while (n < 0 or len(out) < n) and self._more():
            want = self._left if n < 0 else min(self._left, n - len(out))
            out += self._take(want)
            self._left -= want
        return bytes(out)

    def drain(self) -> None:
        while self._more():
            self._take(self._left)
            self._left = 0

    def close(self) -> None:
        """Arrow's reader may close its file; the body is read to its end by `drain`."""


def write_task(request: dict[str, Any], source: BinaryIO, answer_: FramedAnswer) -> None:
    """One ``writes`` request: the task's rows, the Arrow stream in the request's body, written
    by the request's writer (`persistshard.datasource.rowlevel.write`); the answer's one data
    frame is the JSON ``{"message": pickled commit message}``. The body is read to its end
    whether or not the write failed, so a failure is answered and the worker goes on."""
    from persistshard.datasource import rowlevel

    body = FramedBody(source)
    try:
        written = rowlevel.write(request, body)
    except Exception:
        if body.abandoned:
            raise Abandoned("the JVM ended the request") from None
        body.drain()
        raise
    body.drain()
    answer_.write(json.dumps(written).encode())


def read_task(request: dict[str, Any], source: BinaryIO, answer_: FramedAnswer) -> None:
    """One ``reads`` request (`read`): the request has no body."""
    read(request, answer_)


def serve_framed(
    source: BinaryIO,
    sink: BinaryIO,
    task: Callable[[dict[str, Any], BinaryIO, FramedAnswer], None],
) -> None:
    """``reads`` and ``writes``: one ``task`` per framed request of ``source``, each answered
    on ``sink`` as `FramedAnswer` frames (an error: one `FAILED` frame with its text, and the
    next request is served), until ``source`` ends, a request of length 0, or a request whose
    input ends in the middle (`Abandoned`)."""
    while True:
        header = source.read(REQUEST.size)
        if len(header) < REQUEST.size:
            return
        (length,) = REQUEST.unpack(header)
        if length == 0:
            return
        body = source.read(length)
        if len(body) < length:
            return  # the JVM went away mid-request: nobody reads an answer
        answer_ = FramedAnswer(sink)
        try:
            task(json.loads(body), source, answer_)
        except Abandoned:
            log.debug("bridge request abandoned by the JVM", exc_info=True)
            return
        except Exception as e:
            log.debug("bridge request failed", exc_info=True)
            answer_.fail(error_text(e))
        else:
            answer_.end()


def serve_reads(source: BinaryIO, sink: BinaryIO) -> None:
    """``reads``: one partition read per framed request (`serve_framed`, `read_task`)."""
    serve_framed(source, sink, read_task)


def serve_writes(source: BinaryIO, sink: BinaryIO) -> None:
    """``writes``: one row-level task per framed request (`serve_framed`, `write_task`)."""
    serve_framed(source, sink, write_task)


def error_text(e: Exception) -> str:
    """What the JVM raises for ``e``: its text, which starts with its class name."""
    text, name = str(e), type(e).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def serve(source: TextIO, sink: TextIO) -> None:
    """``serve``: one request per line of ``source`` (`answer`), one answer per line of
    ``sink`` (or ``{"error": text}``), until ``source`` ends. The JVM keeps one
    such process per interpreter, so a scan's plan costs no interpreter start."""
    for line in source:
        if not line.strip():
            continue
        try:
            answered = answer(json.loads(line))
        except Exception as e:
            log.debug("bridge request failed", exc_info=True)
            answered = {"error": error_text(e)}
        sink.write(json.dumps(answered) + "\n")
        sink.flush()


def main(argv: list[str] | None = None) -> int:
    """Runs one command (module docstring) until its input ends; status 0, or 2 after a usage
    line for an unknown command."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args == ["serve"]:
        serve(sys.stdin, sys.stdout)
    elif args == ["reads"]:
        serve_reads(sys.stdin.buffer, sys.stdout.buffer)
    elif args == ["writes"]:
        serve_writes(sys.stdin.buffer, sys.stdout.buffer)
    else:
        sys.stderr.write(f"usage: python -m {__name__} serve|reads|writes (requests on stdin)\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
