"""The Python side of the companion's DELETE, UPDATE and MERGE (`persistshard.datasource.
rowlevel`), driven as the JVM drives it but without Spark: ``delta_begin`` pins the upper,
each task's rows with diffs go through a ``bridge writes`` worker as an Arrow stream, and
``delta_commit`` lands every task's parts in one compare-and-append at the pinned time; a
writer committing in between makes it `UpperMismatch` with nothing applied and no part left.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.datasource import bridge, rowlevel
from persistshard.errors import InvalidOption, UpperMismatch

SCHEMA = StructType([StructField("id", LongType()), StructField("s", StringType())])


def seed(path: str) -> Any:
    shard = ps.open_shard(path, inline_bytes=0)
    shard.append(
        pa.table(
            {
                "id": pa.array([1, 2, 3, None], pa.int64()),
                "s": pa.array(["a", None, "c", "n"], pa.string()),
                "_time": pa.array([0, 0, 0, 0], pa.int64()),
                "_diff": pa.array([3, 1, 1, 2], pa.int64()),
            }
        ),
        new_upper=1,
    )
    return shard


def stream(rows: list[tuple[int | None, str | None, int]]) -> bytes:
    """The Arrow IPC stream of a task's rows as `DeltaTaskWriter` sends them."""
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "s": pa.array([r[1] for r in rows], pa.large_string()),  # cast back by write
            "_diff": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as out:
        for batch in table.to_batches(max_chunksize=2):
            out.write_batch(batch)
    return sink.getvalue()


def request(writer: str, body: bytes, *, frame_bytes: int = 64, end: bool = True) -> bytes:
    """One ``bridge writes`` request as `DeltaTaskWriter` frames it: the JSON header, the
    body in ``D`` frames of ``frame_bytes``, then (unless not ``end``) the ``E`` frame."""
    header = json.dumps(
        {"writer": writer, "schema": json.loads(rowlevel.write_schema(SCHEMA).json())}
    ).encode()
    out = bridge.REQUEST.pack(len(header)) + header
    for at in range(0, len(body), frame_bytes):
        piece = body[at : at + frame_bytes]
        out += bridge.FRAME.pack(bridge.DATA, len(piece)) + piece
    return out + (bridge.FRAME.pack(bridge.END, 0) if end else b"")


def answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """A ``writes`` worker's answers: (last frame's tag, the data frames' payload or the
    error's text)."""
    out, payload, at = [], b"", 0
    while at < len(data):
        tag, length = bridge.FRAME.unpack_from(data, at)
        at += bridge.FRAME.size
        if tag == bridge.DATA:
            payload += data[at : at + length]
        else:
            out.append((tag, payload if tag == bridge.END else data[at : at + length]))
            payload = b""
        at += length
    assert payload == b"", "an answer without its last frame"
    return out


def task(writer: str, rows: list[tuple[int | None, str | None, int]]) -> str:
    """One task as `DeltaTaskWriter` sends it to a ``bridge writes`` worker; its message."""
    sink = io.BytesIO()
    bridge.serve_writes(io.BytesIO(request(writer, stream(rows))), sink)
    ((tag, payload),) = answers(sink.getvalue())
    assert tag == bridge.END, payload
    message: str = json.loads(payload)["message"]
    return message


def contents(path: str) -> Counter[tuple[Any, Any]]:
    snap = ps.open_shard(path).snapshot().to_pylist()
    return Counter({(r["id"], r["s"]): r["_diff"] for r in snap})


def begin(path: str, **options: str) -> dict[str, Any]:
    request = {"kind": "delta_begin", "options": {"path": path, **options}}
    return rowlevel.driver_step(request["kind"], {**request, "schema": json.loads(SCHEMA.json())})


def test_tasks_rows_commit_at_the_pinned_time_in_one_append(tmp_path):
    path = str(tmp_path / "t")
    seed(path)
    begun = begin(path)
    assert begun["lower"] == 1
    # A row of multiplicity 3 deleted three times (in two tasks), a null column, an insert.
    one = task(begun["writer"], [(1, "a", -1), (1, "a", -1), (2, None, -1)])
    two = task(begun["writer"], [(1, "a", -1), (9, "new", 1)])
    rowlevel.driver_step("delta_commit", {"writer": begun["writer"], "messages": [one, None, two]})
    shard = ps.open_shard(path)
    assert shard.upper == 2
    assert contents(path) == Counter({(3, "c"): 1, (None, "n"): 2, (9, "new"): 1})
    committed = Counter()
    for r in shard.updates(1, 2).to_pylist():
        committed[(r["id"], r["s"])] += r["_diff"]
    assert committed == Counter({(1, "a"): -3, (2, None): -1, (9, "new"): 1})


def test_a_commit_after_another_writer_is_upper_mismatch_and_sweeps_its_parts(tmp_path):
    path = str(tmp_path / "t")
    seed(path)
    parts = tmp_path / "t" / "parts"
    seeded = set(parts.rglob("*.part"))
    begun = begin(path, inline_bytes="0")
    message = task(begun["writer"], [(3, "c", -1)])
    written = set(parts.rglob("*.part")) - seeded
    assert written  # the task's parts, not yet committed
    other = ps.open_shard(path, inline_bytes=0)
    other.append(
        pa.table(
            {
                "id": pa.array([7], pa.int64()),
                "s": pa.array(["raced"], pa.string()),
                "_time": pa.array([1], pa.int64()),
                "_diff": pa.array([1], pa.int64()),
            }
        )
    )
    with pytest.raises(UpperMismatch, match="expected upper 1"):
        rowlevel.driver_step("delta_commit", {"writer": begun["writer"], "messages": [message]})
    assert ps.open_shard(path).upper == 2
    assert contents(path)[(3, "c")] == 1 and contents(path)[(7, "raced")] == 1
    assert not any(p.exists() for p in written)
    report = ps.open_shard(path).gc(dry_run=True, retention_seconds=0)
    assert not report.orphaned_parts and report.leased_parts == 0


def test_abort_sweeps_every_part_of_the_write(tmp_path):
    path = str(tmp_path / "t")
    seed(path)
    begun = begin(path, inline_bytes="0")
    seeded = set((tmp_path / "t" / "parts").rglob("*.part"))
    message = task(begun["writer"], [(3, "c", -1)])
    written = set((tmp_path / "t" / "parts").rglob("*.part")) - seeded
    assert written
    rowlevel.driver_step("delta_abort", {"writer": begun["writer"], "messages": [message]})
    assert ps.open_shard(path).upper == 1
    assert not any(p.exists() for p in written)


def test_a_change_table_is_refused_and_row_meaning_options_are_dropped(tmp_path):
    path = str(tmp_path / "t")
    seed(path)
    changes = StructType([*SCHEMA.fields, StructField("_diff", LongType())])
    with pytest.raises(InvalidOption, match="change table"):
        rowlevel.begin({"path": path}, changes)
    # A table whose options name a time column or keys still writes its rows as they are.
    begun = begin(path, time_column="id", key_columns="id")
    message = task(begun["writer"], [(3, "c", -1)])
    rowlevel.driver_step("delta_commit", {"writer": begun["writer"], "messages": [message]})
    assert (3, "c") not in contents(path)


def test_serve_answers_driver_steps_and_reports_their_errors(tmp_path):
    path = str(tmp_path / "t")
    seed(path)
    line = {"kind": "delta_begin", "options": {"path": path}, "schema": json.loads(SCHEMA.json())}
    bad = {"kind": "delta_nonsense", "writer": "", "messages": []}
    out = io.StringIO()
    bridge.serve(io.StringIO(json.dumps(line) + "\n" + json.dumps(bad) + "\n"), out)
    first, second = (json.loads(x) for x in out.getvalue().splitlines())
    assert first["lower"] == 1 and first["writer"]
    assert "unknown bridge request kind" in second["error"]


def test_a_statement_matching_nothing_commits_one_empty_time(tmp_path):
    path = str(tmp_path / "t")
    seed(path)
    begun = begin(path)
    rowlevel.driver_step("delta_commit", {"writer": begun["writer"], "messages": [None, None]})
    shard = ps.open_shard(path)
    assert shard.upper == 2
    assert shard.updates(1, 2).num_rows == 0
    assert contents(path) == Counter({(1, "a"): 3, (2, None): 1, (3, "c"): 1, (None, "n"): 2})
