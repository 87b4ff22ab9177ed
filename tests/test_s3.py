"""S3 for real: a local S3-compatible server (moto's standalone server, a subprocess on
127.0.0.1 and a free port) under the conformance suite, the Python API, the command line and
Spark, every location given as ``s3://`` plus storage options (``storage.*`` in Spark,
``--storage-option`` on the command line). These tests never skip: the server and its client
libraries are in the ``test`` extra.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import hadoop_session
import pyarrow as pa
import pytest
from conformance_helpers import examples, rows_of
from pyspark.sql.types import LongType, StringType, StructField, StructType
from test_jvm_companion import companion_results, run_session

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.conformance.model import make_shard_machine
from persistshard.conformance.s3server import moto_server
from persistshard.conformance.storage import BlobContract, ConsensusContract, Store
from persistshard.core.storage.blob import BlobWrapper, open_blob
from persistshard.datasource import bridge, companion

BUCKET = "persistshard-test"
#: The secret key the tests use: it must never appear in a stored object or a message.
SECRET = "SECRET-" + uuid.uuid4().hex


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 (stopped after the session), with one bucket."""
    with moto_server(BUCKET, "testing", SECRET) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3_options(s3_endpoint) -> dict[str, Any]:
    return {
        "key": "testing",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }


@pytest.fixture
def s3_location() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}"


def all_objects(location: str, options: dict[str, Any]) -> dict[str, bytes]:
    blob = open_blob(location, **options)
    out = {m.key: blob.get(m.key) or b"" for m in blob.list("")}
    out.update({m.key: blob.get(m.key) or b"" for m in blob.list_temporary()})
    return out


# --- the storage contract --------------------------------------------------------------------


@pytest.fixture
def store(s3_location, s3_options) -> Store:
    return Store(s3_location, s3_options, shared=True)


class TestS3Blob(BlobContract):
    pass


class TestS3Consensus(ConsensusContract):
    pass


def test_s3_shard_model(s3_options):
    """The shard against the reference model, on S3 (few examples: every step is requests)."""
    from hypothesis import HealthCheck, settings

    machine = make_shard_machine(lambda: f"s3://{BUCKET}/model-{uuid.uuid4().hex}", s3_options)
    case = machine.TestCase
    case.settings = settings(
        max_examples=examples(4),
        stateful_step_count=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    case("runTest").runTest()


class IgnoresIfNoneMatch(BlobWrapper):
    """A server that ignores If-None-Match: every exclusive create succeeds and overwrites."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.inner.put(key, data)
        return True


def test_probe_reports_a_server_that_ignores_exclusive_create(s3_location, s3_options):
    from persistshard.conformance.storage import probe_atomic_create

    blob = open_blob(s3_location, **s3_options)
    probe_atomic_create(blob)  # the real server honours it
    with pytest.raises(ps.StorageUnsupported, match=r"^StorageUnsupported: .*second exclusive"):
        probe_atomic_create(IgnoresIfNoneMatch(blob))


def test_old_s3fs_is_refused_not_trusted(s3_location, s3_options, monkeypatch):
    """An s3fs older than the pinned minimum wrote small exclusive creates unconditionally:
    the blob must not claim an atomic create, and the default consensus refuses it."""
    import s3fs

    monkeypatch.setattr(s3fs, "__version__", "2025.5.1")
    blob = open_blob(s3_location, **s3_options)
    assert not blob.capabilities.atomic_create
    with pytest.raises(ps.StorageUnsupported, match=r"^StorageUnsupported: .*s3fs 2025\.7\.0"):
        blob.put_if_absent("k", b"x")
    with pytest.raises(ps.StorageUnsupported):
        ps.open_shard(s3_location, **s3_options)


# --- Python API and command line -------------------------------------------------------------


def test_python_api_on_s3_keeps_secrets_out(s3_location, s3_options, capsys):
    shard = ps.open_shard(s3_location, **s3_options)
    shard.append(pa.table({"id": [1, 2], "_time": [0, 0], "_diff": [1, 1]}))
    shard.append(pa.table({"id": [1], "_time": [1], "_diff": [-1]}))
    assert rows_of(shard.snapshot()) == {(2,): 1}
    with pytest.raises(ps.UpperMismatch) as info:
        shard.compare_and_append(pa.table({"id": [3], "_time": [0], "_diff": [1]}), 0, 1)
    assert SECRET not in str(info.value)

    options = [f"--storage-option={k}={json.dumps(v)}" for k, v in s3_options.items()]
    options[1] = f"--storage-option=secret={SECRET}"  # a plain (non-JSON) value
    for command in (["inspect"], ["history"], ["verify"], ["compact"], ["gc", "--apply"]):
        assert cli([command[0], s3_location, *command[1:], *options, "--json"]) == 0, command
        out, err = capsys.readouterr()
        json.loads(out)
        assert SECRET not in out + err
    assert rows_of(ps.open_shard(s3_location, **s3_options).snapshot()) == {(2,): 1}
    assert cli(["verify", s3_location + "-typo", *options]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("NoShard: no shard at") and SECRET not in out + err
    for key, data in all_objects(s3_location, s3_options).items():
        assert SECRET.encode() not in data, key


def test_cli_conformance_probe_on_s3(s3_location, s3_options, capsys, monkeypatch):
    """`persistshard conformance` probes the S3 location with the given storage options
    before it runs the suite (the suite itself runs above, as `TestS3Blob`/`TestS3Consensus`,
    and on local files in tests/test_cli.py)."""
    import pytest as real_pytest

    from persistshard.conformance.target import ConformanceTarget

    seen: dict[str, Any] = {}

    def fake_main(args, plugins=()):
        (target,) = [p for p in plugins if isinstance(p, ConformanceTarget)]
        seen["location"] = target.location
        seen["options"] = target.storage_options
        seen["environment"] = [k for k in os.environ if k.startswith("PERSISTSHARD_CONFORMANCE")]
        return 0

    monkeypatch.setattr(real_pytest, "main", fake_main)
    options = [f"--storage-option={k}={json.dumps(v)}" for k, v in s3_options.items()]
    assert cli(["conformance", s3_location, *options]) == 0
    # The target reaches the suite as a plugin object: no credential in the environment.
    assert seen == {"location": s3_location, "options": s3_options, "environment": []}
    assert all_objects(s3_location, s3_options) == {}  # the probe cleans up after itself
    monkeypatch.setattr(
        "persistshard.cli.open_blob", lambda url, **kw: IgnoresIfNoneMatch(open_blob(url, **kw))
    )
    assert cli(["conformance", s3_location, *options]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("StorageUnsupported:") and SECRET not in out + err


# --- Spark -----------------------------------------------------------------------------------


def spark_options(s3_options: dict[str, Any]) -> dict[str, str]:
    return {
        f"storage.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in s3_options.items()
    }


def counts(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


@pytest.mark.spark
def test_spark_end_to_end_on_s3(spark, s3_location, s3_options, tmp_path):
    """Append, snapshot, change read, overwrite, streaming write, distributed compaction and
    gc, all on s3:// through storage.* options; no secret in any object or message."""
    opts = spark_options(s3_options)

    def write(df, mode: str = "append", **extra: Any) -> None:
        df.write.format("persistshard").mode(mode).options(**opts, **extra).save(s3_location)

    def read(**extra: Any):
        return spark.read.format("persistshard").options(**opts, **extra).load(s3_location)

    write(spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, item STRING"))
    write(spark.createDataFrame([(3, "c")], "id BIGINT, item STRING"))
    assert counts(read()) == Counter({(1, "a"): 1, (2, "b"): 1, (3, "c"): 1})
    assert counts(read(as_of=0)) == Counter({(1, "a"): 1, (2, "b"): 1})
    assert counts(read(updates_from=1, updates_to=2)) == Counter({(3, "c", 1, 1): 1})
    plans = read()._jdf.queryExecution().toString()  # what explain() and the UI show
    assert "persistshard" in plans and SECRET not in plans

    write(spark.createDataFrame([(2, "b"), (4, "d")], "id BIGINT, item STRING"), "overwrite")
    assert counts(read()) == Counter({(2, "b"): 1, (4, "d"): 1})
    assert counts(read(updates_from=2, updates_to=3)) == Counter(
        {(1, "a", 2, -1): 1, (3, "c", 2, -1): 1, (4, "d", 2, 1): 1}
    )

    # A wrong expected upper: the error names the shard and the uppers, never the secret.
    with pytest.raises(Exception, match="UpperMismatch") as info:
        write(spark.createDataFrame([(9, "z")], "id BIGINT, item STRING"), expected_upper=0)
    assert SECRET not in str(info.value)

    # Streaming write: the changes of a local shard, exactly once, into the S3 shard's
    # successor location.
    source = str(tmp_path / "source")
    ps.open_shard(source).append(
        pa.table({"id": [7, 8], "item": ["x", "y"], "_time": [0, 0], "_diff": [1, 1]})
    )
    target = s3_location + "-stream"
    q = (
        spark.readStream.format("persistshard")
        .option("changes", True)
        .load(source)
        .writeStream.format("persistshard")
        .options(**opts)
        .option("writer_id", "s3-stream")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(target)
    )
    q.awaitTermination(180)
    assert q.exception() is None
    streamed = ps.open_shard(target, **s3_options)
    assert rows_of(streamed.snapshot()) == {(7, "x"): 1, (8, "y"): 1}
    assert streamed.inspect.state().writers == {"s3-stream": 0}

    # Distributed compaction on the executors, then gc: the answers do not change.
    write(spark.createDataFrame([(5, "e")], "id BIGINT, item STRING"))
    before = {t: counts(read(as_of=t)) for t in (2, 3)}
    shard = ps.open_shard(s3_location, **s3_options)
    shard.advance_since(2)
    report = ps.compact(spark, s3_location, **s3_options)
    assert report.merges and report.committed
    gc = shard.gc(dry_run=False, retention_seconds=0)
    assert gc.parts
    assert {t: counts(read(as_of=t)) for t in (2, 3)} == before
    assert shard.verify().ok

    for location in (s3_location, target):
        for key, data in all_objects(location, s3_options).items():
            assert SECRET.encode() not in data, key


@pytest.mark.spark
def test_spark_storage_options_stay_out_of_the_catalog(spark, s3_location, s3_options):
    """A table's OPTIONS are kept in Spark's catalog, so storage options are refused there
    (with the way to configure fsspec instead); the secret is in no message."""
    opts = spark_options(s3_options)
    listed = ", ".join(f"'{k}' '{v}'" for k, v in opts.items())
    with pytest.raises(Exception, match="storage options") as info:
        spark.sql(
            f"CREATE TABLE s3_secret_table USING persistshard LOCATION '{s3_location}' "
            f"OPTIONS (columns 'id BIGINT', {listed})"
        )
    assert "FSSPEC_" in str(info.value) and SECRET not in str(info.value)
    assert "s3_secret_table" not in [t.name for t in spark.catalog.listTables()]


def test_fsspec_configuration_applies_without_options(s3_location, s3_options, monkeypatch):
    """fsspec's own configuration (what FSSPEC_S3_* variables and config files fill in) is
    the way for SQL tables and clusters: with it, a location needs no storage options."""
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3_options))
    shard = ps.open_shard(s3_location)
    shard.append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    monkeypatch.delitem(fsspec.config.conf, "s3")
    assert ps.open_shard(s3_location, **s3_options).upper == 1


# --- the JVM companion: parts on S3 ------------------------------------------------------------

HADOOP_SESSION = Path(__file__).resolve().parent / "hadoop_session.py"
#: The test-only Hadoop file system for ``s3a://`` (plain HTTP range GETs against moto).
TEST_FS = Path(__file__).resolve().parent / "hadoop_fs" / "HttpRangeFileSystem.java"
JVM_PARTITIONS = re.compile(r"\((\d+) of (\d+) partitions decoded in the JVM\)")


def two_part_shard(location: str, options: dict[str, Any]) -> ps.Shard:
    """A shard of two part files (no inline parts) on S3: 80 rows at times 0 and 1."""
    shard = ps.open_shard(location, inline_bytes=0, **options)
    for t in (0, 1):
        ids = list(range(40 * t, 40 * t + 40))
        batch = {"id": ids, "item": [f"i{i}" for i in ids], "_time": [t] * 40, "_diff": [1] * 40}
        shard.append(pa.table(batch), new_upper=t + 1)
    return shard


def read_request(location: str, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    schema = StructType([StructField("id", LongType()), StructField("item", StringType())])
    return {
        "options": {"path": location, **spark_options(options)},
        "schema": json.loads(schema.json()),
        "required": json.loads(schema.json()),
        **extra,
    }


def test_the_jvm_is_planned_to_read_s3_parts_at_s3a_urls_only_where_it_opens_s3a(
    s3_location, s3_options
):
    """A part on S3 is named to the JVM by its ``s3a://`` URL when the driver's JVM has a
    file system for s3a, never with a credential; without one, the partition is Python's."""
    shard = two_part_shard(s3_location, s3_options)
    keys = {p.key for p in shard.inspect.state().parts()}
    assert len(keys) == 2
    without = bridge.plan(read_request(s3_location, s3_options))
    assert without["partitions"] and all("python" in p for p in without["partitions"])
    planned = bridge.plan(read_request(s3_location, s3_options, hadoop_schemes=["s3a", "gs"]))
    slices = [s for p in planned["partitions"] for s in p["native"]]
    prefix = s3_location.removeprefix("s3://")
    assert {s["url"] for s in slices} == {f"s3a://{prefix}/{k}" for k in keys}
    assert all(s["path"] is None and s["inline"] is None for s in slices)
    assert SECRET not in json.dumps(planned)
    other = bridge.plan(read_request(s3_location, s3_options, hadoop_schemes=["gs", "hdfs"]))
    assert all("python" in p for p in other["partitions"])


def write_read_request(work: Path, location: str, options: dict[str, Any], **conf: str) -> None:
    request = {"location": location, "options": spark_options(options), "conf": conf}
    (work / hadoop_session.REQUEST).write_text(json.dumps(request))


def jvm_partitions(plan: str) -> tuple[int, int]:
    found = JVM_PARTITIONS.search(plan)
    assert found is not None, f"no companion scan in the plan: {plan}"
    return int(found.group(1)), int(found.group(2))


@pytest.mark.spark
def test_the_companion_reads_s3_parts_through_python_without_s3a(
    request, spark, s3_location, s3_options, tmp_path
):
    """pyspark ships no S3A (hadoop-aws): the companion's scan of a shard on S3 hands every
    partition to Python, no error, and reads what the Python source reads."""
    two_part_shard(s3_location, s3_options)
    write_read_request(tmp_path, s3_location, s3_options)
    result = companion_results(request, spark, hadoop_session.collect, HADOOP_SESSION, tmp_path)
    assert result["companion"] == result["python"]
    assert sum(n for _, n in result["python"]) == 80
    jvm, partitions = jvm_partitions(result["plan"])
    assert jvm == 0 and partitions > 0, result["plan"]
    assert SECRET not in result["plan"]


def file_system_jar(javac: str, out: Path) -> Path:
    """`TEST_FS` compiled against pyspark's jars into ``out``/testfs.jar."""
    classes = out / "classes"
    jars = companion.pyspark_jars()
    assert jars is not None
    subprocess.run(
        [javac, "--release", "17", "-cp", f"{jars}/*", "-d", str(classes), str(TEST_FS)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    jar = out / "testfs.jar"
    with zipfile.ZipFile(jar, "w") as z:
        for f in sorted(classes.rglob("*.class")):
            z.write(f, f.relative_to(classes).as_posix())
    return jar


def test_the_companion_decodes_s3_parts_through_a_hadoop_file_system(
    jdk, jar_cache, s3_endpoint, s3_location, s3_options, tmp_path
):
    """With a file system for s3a in the session (a test one standing in for hadoop-aws,
    `TEST_FS`, configured by ``spark.hadoop.fs.s3a.*`` as S3A is), every partition of the
    scan is decoded in the JVM from the parts' bytes read through Hadoop's API on the
    executors, and the answer is the Python source's."""
    shard = two_part_shard(s3_location, s3_options)
    # The test file system sends unsigned requests: moto serves them for public objects.
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=s3_options["key"],
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    prefix = s3_location.removeprefix(f"s3://{BUCKET}/")
    for ref in shard.inspect.state().parts():
        client.put_object_acl(Bucket=BUCKET, Key=f"{prefix}/{ref.key}", ACL="public-read")
    jar = file_system_jar(jdk, tmp_path)
    write_read_request(
        tmp_path,
        s3_location,
        s3_options,
        **{
            "spark.jars": str(jar),
            "spark.hadoop.fs.s3a.impl": "persistshard.testfs.HttpRangeFileSystem",
            "spark.hadoop.fs.s3a.endpoint": s3_endpoint,
        },
    )
    result = run_session(HADOOP_SESSION, tmp_path, jar_cache)
    assert result["companion"] == result["python"]
    assert sum(n for _, n in result["python"]) == 80
    jvm, partitions = jvm_partitions(result["plan"])
    assert jvm == partitions > 0, result["plan"]
    assert SECRET not in result["plan"]
