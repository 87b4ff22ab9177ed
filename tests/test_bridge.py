"""The JVM companion's planner in Python (`persistshard.datasource.bridge`): which partitions
the JVM may decode as stored, which Python must read, what an error looks like to the JVM,
and that a Python-read partition streams exactly the Python source's rows. No Spark session:
the bridge is plain Python (the JVM runs it as ``python -m``).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.core.storage.blob import FsspecBlob, hadoop_url_of
from persistshard.datasource import bridge
from persistshard.format import PartReader

ID = StructField("id", LongType())
V = StructField("v", StringType())


def request(path: str, schema: StructType, required: StructType | None = None, **options: str):
    return {
        "options": {"path": path, **options},
        "schema": json.loads(schema.json()),
        "required": json.loads((schema if required is None else required).json()),
    }


def rows(n: int, time: int = 0, diff: int = 1, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {"id": ids, "v": [f"v{i}" for i in ids], "_time": [time] * n, "_diff": [diff] * n}
    )


def test_unit_diffs_at_or_before_the_snapshot_are_decoded_by_the_jvm(tmp_path):
    files, inline = str(tmp_path / "files"), str(tmp_path / "inline")
    ps.open_shard(files, inline_bytes=0).append(rows(50), new_upper=1)
    ps.open_shard(inline, inline_bytes=1 << 20).append(rows(50), new_upper=1)
    schema = StructType([ID, V])
    for path in (files, inline):
        plan = bridge.plan(request(path, schema, StructType([V])))
        (partition,) = plan["partitions"]
        (piece,) = partition["native"]
        assert partition["columns"] == ["v"]
        assert plan["num_rows"] == 50 and plan["size_bytes"] > 0
        if path == files:
            assert piece["inline"] is None
            data = open(piece["path"], "rb").read()
        else:
            assert piece["path"] is None
            data = base64.b64decode(piece["inline"])
        part = PartReader.from_bytes(piece["key"], data)
        assert piece["chunks"] == list(range(len(part.chunks)))
        assert part.read(["v"]).column("v").to_pylist() == [f"v{i}" for i in range(50)]


@pytest.mark.parametrize(
    ("location", "url"),
    [
        ("s3://bucket/a/b/", "s3a://bucket/a/b/parts/p-1.part"),
        ("S3A://bucket", "s3a://bucket/parts/p-1.part"),
        ("gcs://bucket/x", "gs://bucket/x/parts/p-1.part"),
        ("gs://bucket/x", "gs://bucket/x/parts/p-1.part"),
        ("hdfs://namenode:8020/data/t", "hdfs://namenode:8020/data/t/parts/p-1.part"),
        # Not for Hadoop: no twin (memory, Azure: adlfs names the account elsewhere), user
        # info (credentials never go into a plan), a query, a chained URL, escapes.
        ("memory://bucket/x", None),
        ("abfs://container/x", None),
        ("az://container/x", None),
        ("s3://KEY:SECRET@bucket/x", None),
        ("s3://bucket/x?versionId=1", None),
        ("simplecache::s3://bucket/x", None),
        ("s3://bucket/a b", None),
        ("s3://bucket/a%20b", None),
        ("/local/path", None),
    ],
)
def test_a_part_s_hadoop_url_names_the_same_object_without_credentials(location, url):
    assert hadoop_url_of(location, "parts/p-1.part") == url


def test_local_and_memory_stores_have_no_hadoop_url(tmp_path):
    assert ps.open_shard(str(tmp_path / "s"))._blob.hadoop_url("parts/x") is None  # type: ignore[attr-defined]
    assert FsspecBlob("memory://hadoop-url-test").hadoop_url("parts/x") is None


def test_a_part_split_over_partitions_counts_once_in_the_size_and_rows(tmp_path):
    """Spark's optimizer sees the stored bytes and updates of the read's parts, each part
    once even when its chunks are spread over several partitions (broadcast joins follow)."""
    path = str(tmp_path / "shard")
    ps.open_shard(path, inline_bytes=0, chunk_bytes=256).append(rows(2000), new_upper=1)
    (ref,) = ps.open_shard(path).inspect.state().parts()
    schema = StructType([ID, V])
    plan = bridge.plan(request(path, schema, partition_bytes="1024"))
    assert len(plan["partitions"]) > 1
    assert plan["size_bytes"] == ref.size and plan["num_rows"] == 2000


@pytest.mark.parametrize(
    "case",
    ["retraction", "multiplicity", "time after the snapshot"],
)
def test_what_needs_more_than_the_stored_rows_is_read_by_python(tmp_path, case):
    path = str(tmp_path / "shard")
    shard = ps.open_shard(path, inline_bytes=0)
    shard.append(rows(20, diff=2 if case == "multiplicity" else 1), new_upper=1)
    schema = StructType([ID, V])
    options: dict[str, str] = {}
    if case == "retraction":
        shard.append(rows(5, time=1, diff=-1), new_upper=2)
    elif case == "time after the snapshot":  # one part holding times 1 and 2
        shard.append(pa.concat_tables([rows(5, time=1), rows(5, time=2, start=100)]))
        options = {"as_of": "1"}
    plan = bridge.plan(request(path, schema, **options))
    assert plan["partitions"] and all("python" in p for p in plan["partitions"])


def stream_of(request_: dict[str, Any]) -> pa.Table:
    sink = io.BytesIO()
    bridge.read(request_, sink)
    return ipc.open_stream(sink.getvalue()).read_all()


def test_a_python_partition_streams_the_python_sources_rows(tmp_path):
    path = str(tmp_path / "shard")
    shard = ps.open_shard(path, inline_bytes=0)
    shard.append(rows(20, diff=2), new_upper=1)
    shard.append(rows(5, time=1, diff=-1), new_upper=2)
    schema = StructType([ID, V])
    got = []
    for p in bridge.plan(request(path, schema, StructType([V])))["partitions"]:
        table = stream_of({**request(path, schema, StructType([V])), "partition": p["python"]})
        assert table.schema == pa.schema([pa.field("v", pa.string())])
        got += table.column("v").to_pylist()
    want = sorted([f"v{i}" for i in range(5)] + [f"v{i}" for i in range(5, 20)] * 2)
    assert sorted(got) == want


@pytest.mark.parametrize("argv", [["plan"], ["write"], [], ["serve", "extra"]])
def test_an_unknown_command_is_a_usage_error(argv, capsys):
    # The companion runs serve, reads and writes only: a plan is a serve request, and its
    # error the answer's text naming the class (test_serve_answers_each_plan_...).
    assert bridge.main(argv) == 2
    assert "usage: python -m persistshard.datasource.bridge serve|reads|writes" in (
        capsys.readouterr().err
    )


def test_pruning_changes_no_error_of_the_relations_schema(tmp_path):
    path = str(tmp_path / "shard")
    ps.open_shard(path).append(rows(3), new_upper=1)
    schema = StructType([ID, StructField("nope", StringType())])
    from persistshard.errors import InvalidOption

    with pytest.raises(InvalidOption, match="names column nope"):
        bridge.plan(request(path, schema, StructType([ID])))


def test_a_pickled_partition_is_the_python_sources_own(tmp_path):
    path = str(tmp_path / "shard")
    shard = ps.open_shard(path, inline_bytes=0)
    shard.append(rows(4, diff=3), new_upper=1)
    (p,) = bridge.plan(request(path, StructType([ID, V])))["partitions"]
    partition = pickle.loads(base64.b64decode(p["python"]))
    assert type(partition).__name__ == "ShardPartition" and partition.location.endswith("shard")


def test_serve_answers_each_plan_on_its_line_and_goes_on_after_an_error(tmp_path):
    path = str(tmp_path / "shard")
    ps.open_shard(path, inline_bytes=0).append(rows(10), new_upper=1)
    schema = StructType([ID, V])
    lines = [request(path, schema, as_of="3"), request(path, schema)]
    source = io.StringIO("".join(json.dumps(x) + "\n" for x in lines))
    sink = io.StringIO()
    bridge.serve(source, sink)
    failed, planned = (json.loads(x) for x in sink.getvalue().splitlines())
    assert failed["error"].startswith("NotSealed: as_of 3")
    assert [p.keys() for p in planned["partitions"]] == [{"native", "columns"}]


def test_schema_is_the_python_sources_read_fresh_with_options_in_any_case(tmp_path):
    """``schema``, the companion's ``inferSchema``: the Python source's ``schema()`` for the
    options (keys in any case, as Spark hands them), asked anew each time (a shard written
    between two asks is in the second answer), a missing shard being the source's own
    error text."""
    from persistshard.datasource.source import PersistShardDataSource

    path = str(tmp_path / "shard")
    asked = {"kind": "schema", "options": {"PATH": path, "With_Diff": "true"}}
    sink = io.StringIO()
    bridge.serve(io.StringIO(json.dumps(asked) + "\n"), sink)
    assert json.loads(sink.getvalue())["error"].startswith("NoShard: no shard at")
    ps.open_shard(path, inline_bytes=0).append(rows(3), new_upper=1)
    answered = StructType.fromJson(json.loads(bridge.answer(asked)["schema"]))
    assert answered.names == ["id", "v", "_diff"]
    assert answered == PersistShardDataSource({"path": path, "with_diff": "true"}).schema()


def test_a_read_of_no_columns_streams_the_row_count(tmp_path):
    """``count(*)`` through the companion: Spark asks for no column; a partition read by
    Python (here: counts of 2 and retractions) still hands over every row's existence."""
    path = str(tmp_path / "shard")
    shard = ps.open_shard(path, inline_bytes=0)
    shard.append(rows(20, diff=2), new_upper=1)
    shard.append(rows(5, time=1, diff=-1), new_upper=2)
    schema = StructType([ID, V])
    req = request(path, schema, StructType([]))
    total = 0
    for p in bridge.plan(req)["partitions"]:
        table = stream_of({**req, "partition": p["python"]})
        assert table.schema.names == [bridge.ROWS]
        total += table.num_rows
    assert total == 35


@pytest.mark.parametrize(
    "option, value",
    [
        ("consensus", "postgresql://user:hunter2pw@127.0.0.1:1/db"),
        ("consensus", "postgresql://user@127.0.0.1:1/db?sslpassword=hunter2pw"),
        ("storage.key", "hunter2pw"),
    ],
)
def test_table_options_refuses_what_would_keep_a_secret_in_the_catalog(tmp_path, option, value):
    """``table_options``, the session catalog's check before it stores a table: a consensus
    URL with a password or a storage option is refused as the Python source's CREATE refuses
    it, the message naming the cause and never the secret; other options pass, and nothing
    is written at the location."""
    loc = str(tmp_path / "t")
    asked = {"kind": "table_options", "options": {"path": loc, option: value}}
    with pytest.raises(Exception, match=r"InvalidOption: a table's OPTIONS are stored") as e:
        bridge.answer(asked)
    assert "hunter2pw" not in bridge.error_text(e.value)
    fine = {"path": loc, "consensus": f"sqlite:///{tmp_path}/log.db", "columns": "id BIGINT"}
    assert bridge.answer({"kind": "table_options", "options": fine}) == {}
    assert not (tmp_path / "t").exists() and not (tmp_path / "log.db").exists()


def frames_of(data: bytes) -> list[tuple[bytes, bytes]]:
    """A ``reads`` answer's frames: (tag, payload) pairs."""
    out, at = [], 0
    while at < len(data):
        tag, length = bridge.FRAME.unpack_from(data, at)
        at += bridge.FRAME.size
        out.append((tag, data[at : at + length]))
        at += length
    return out


def test_one_reads_worker_answers_request_after_request(tmp_path):
    """``bridge reads`` (the JVM's pooled workers): each framed request gets its Arrow stream
    in ``D`` frames and one ``E``; a request that fails gets one ``X`` frame with the error
    named as the Python source names it, and the worker goes on to the next; a zero length
    ends it."""
    path = str(tmp_path / "shard")
    shard = ps.open_shard(path, inline_bytes=0)
    shard.append(rows(20, diff=2), new_upper=1)
    shard.append(rows(5, time=1, diff=-1), new_upper=2)
    negative = str(tmp_path / "negative")
    ps.open_shard(negative).append(rows(1, diff=-1), new_upper=1)
    schema = StructType([ID, V])
    good = request(path, schema, StructType([V]))
    (partition,) = [p["python"] for p in bridge.plan(good)["partitions"]]
    bad = request(negative, schema)
    (bad_partition,) = [p["python"] for p in bridge.plan(bad)["partitions"]]
    stdin = b""
    for body in ({**good, "partition": partition}, {**bad, "partition": bad_partition}):
        data = json.dumps(body).encode()
        stdin += bridge.REQUEST.pack(len(data)) + data
    stdin *= 2  # both again: the worker goes on after a failure
    stdin += bridge.REQUEST.pack(0) + b"never read"
    sink = io.BytesIO()
    bridge.serve_reads(io.BytesIO(stdin), sink)
    frames = frames_of(sink.getvalue())
    answers: list[list[tuple[bytes, bytes]]] = [[]]
    for tag, payload in frames:
        answers[-1].append((tag, payload))
        if tag in (bridge.END, bridge.FAILED):
            answers.append([])
    assert answers.pop() == []
    assert len(answers) == 4
    want = sorted([f"v{i}" for i in range(5)] + [f"v{i}" for i in range(5, 20)] * 2)
    for good_answer in (answers[0], answers[2]):
        *data, last = good_answer
        assert last == (bridge.END, b"") and all(tag == bridge.DATA for tag, _ in data)
        table = ipc.open_stream(b"".join(payload for _, payload in data)).read_all()
        assert sorted(table.column("v").to_pylist()) == want
    for bad_answer in (answers[1], answers[3]):
        tag, payload = bad_answer[-1]
        assert tag == bridge.FAILED
        assert json.loads(payload).startswith("NegativeDiff: "), payload


def test_a_reads_worker_ends_with_its_input(tmp_path):
    """The JVM's end (its pipe closed, even mid-request) ends the worker quietly."""
    for stdin in (b"", bridge.REQUEST.pack(100) + b"{", b"\x00\x00"):
        sink = io.BytesIO()
        bridge.serve_reads(io.BytesIO(stdin), sink)
        assert sink.getvalue() == b""


def test_one_writes_worker_writes_task_after_task(tmp_path):
    """``bridge writes`` (the JVM's pooled workers for DELETE, UPDATE and MERGE): each framed
    request (its header, then its body of Arrow frames up to an ``E`` frame) is answered
    with its commit message; a task whose write fails in Python (a zero diff, refused after
    its first batch) is answered with one ``X`` frame naming the error as the Python source
    does, its body read to the end, and the worker goes on with the next task. The messages
    of the tasks that ended well commit exactly their rows; a zero length ends the worker."""
    from test_rowlevel_bridge import answers, begin, contents, seed, stream
    from test_rowlevel_bridge import request as write_request

    path = str(tmp_path / "t")
    seed(path)
    writer = begin(path)["writer"]
    stdin = write_request(writer, stream([(1, "a", -1), (9, "new", 1)]))
    stdin += write_request(writer, stream([(2, None, 0)] + [(7, "x", 1)] * 50))
    stdin += write_request(writer, stream([(3, "c", -1), (None, "n", -1)]))
    stdin += bridge.REQUEST.pack(0) + b"never read"
    sink = io.BytesIO()
    bridge.serve_writes(io.BytesIO(stdin), sink)
    first, failed, third = answers(sink.getvalue())
    assert first[0] == third[0] == bridge.END
    assert failed[0] == bridge.FAILED
    assert json.loads(failed[1]).startswith("InvalidUpdates: _diff has 1 zero values"), failed
    messages = [json.loads(first[1])["message"], json.loads(third[1])["message"]]
    from persistshard.datasource import rowlevel

    rowlevel.driver_step("delta_commit", {"writer": writer, "messages": messages})
    assert contents(path) == {(1, "a"): 2, (2, None): 1, (None, "n"): 1, (9, "new"): 1}
    report = ps.open_shard(path).gc(dry_run=True, retention_seconds=0)
    assert not report.orphaned_parts and report.leased_parts == 0


def test_a_writes_worker_ends_when_its_task_is_abandoned(tmp_path):
    """A task the JVM abandons (Spark aborted it: the JVM ends the worker, so its input ends
    before the body's ``E`` frame, after a request or in the middle of a frame) is never
    answered and ends the worker; the requests before it were answered."""
    from test_rowlevel_bridge import answers, begin, seed, stream
    from test_rowlevel_bridge import request as write_request

    path = str(tmp_path / "t")
    seed(path)
    writer = begin(path)["writer"]
    good = write_request(writer, stream([(1, "a", -1)]))
    cut = write_request(writer, stream([(2, None, -1)] * 40), end=False)
    for stdin in (good + cut, good + cut[:-3], good + cut + bridge.FRAME.pack(b"?", 0) + good):
        sink = io.BytesIO()
        bridge.serve_writes(io.BytesIO(stdin), sink)
        ((tag, _),) = answers(sink.getvalue())
        assert tag == bridge.END
