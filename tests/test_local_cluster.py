"""Spark on ``local-cluster[2,1,1024]``: two executor JVMs, each with its own Python workers,
in processes apart from the driver, write and read a shard whose data is on S3 (the moto
server) and whose log is in PostgreSQL (the session's real server). Nothing is shared between
the processes but the two services: this is the deployment shape of issue 26 in miniature.

It needs its own SparkSession (a master is fixed per JVM), so the job runs in a subprocess,
like the Hive test in tests/test_spark.py. Never skipped: CI installs PostgreSQL (.ci/run)
and the test extra brings moto's server.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

import persistshard as ps
from persistshard.conformance.s3server import moto_server

pytestmark = pytest.mark.spark

BUCKET = "persistshard-cluster"
SECRET = "CLUSTER-SECRET-" + uuid.uuid4().hex

JOB = """
import json, os, sys, time
started = time.monotonic()
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark import TaskContext
from pyspark.sql import SparkSession

location, consensus, storage = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
         .config("spark.ui.enabled", "false")
         .config("spark.executor.memory", "512m")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
session_s = time.monotonic() - started
opts = {"consensus": consensus, **storage}

def write(df, mode="append"):
    df.write.format("persistshard").mode(mode).options(**opts).save(location)

def read():
    rows = spark.read.format("persistshard").options(**opts).load(location).collect()
    return sorted(tuple(r) for r in rows)

def where(_):
    ctx = TaskContext.get()
    yield (os.getpid(), ctx.partitionId())

write(spark.range(0, 400, 1, 4).selectExpr("id", "cast(id % 7 as string) as item"))
first = read()
write(spark.range(0, 5, 1, 2).selectExpr("id", "cast(id % 7 as string) as item"), "overwrite")
executors = spark.sparkContext._jsc.sc().getExecutorIds().size()
workers = spark.sparkContext.parallelize(range(8), 8).mapPartitions(where).collect()
print("RESULT " + json.dumps({
    "first": len(first),
    "first_ids": len({r[0] for r in first}),
    "after_overwrite": read(),
    "executors": executors,
    "worker_pids": sorted({pid for pid, _ in workers}),
    "driver_pid": os.getpid(),
    "session_s": round(session_s, 1),
    "total_s": round(time.monotonic() - started, 1),
}))
"""


def spark_home_of_links(home: pathlib.Path) -> str:
    """A Spark home whose entries link to the installed pyspark's: the standalone workers of
    ``local-cluster`` keep their executors' ``work/`` directory in the Spark home, which must
    not be the shared installation."""
    import pyspark

    installed = pathlib.Path(pyspark.__file__).parent
    home.mkdir()
    for entry in installed.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return str(home)


@pytest.fixture(scope="module")
def s3_options():
    with moto_server(BUCKET, "testing", SECRET) as endpoint:
        yield {
            "key": "testing",
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }


def test_local_cluster_writes_and_reads_s3_data_with_postgres_consensus(
    tmp_path, s3_options, postgres_url
):
    """An append from four tasks, a read, an overwrite and a read again, run by two
    executors in their own JVMs and Python workers: every row is there once, the overwrite
    leaves exactly its rows, the log is in PostgreSQL (no entry beside the data), and the
    Python API of this process reads the same shard."""
    location = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    storage = {
        f"storage.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in s3_options.items()
    }
    script = tmp_path / "cluster_job.py"
    script.write_text(JOB)
    env = {**os.environ, "SPARK_HOME": spark_home_of_links(tmp_path / "spark-home")}
    out = subprocess.run(
        [sys.executable, str(script), location, postgres_url, json.dumps(storage)],
        cwd=tmp_path,
        env=env,  # PYTHONPATH names this tree (tests/conftest.py)
        capture_output=True,
        text=True,
        timeout=900,  # about a minute on an idle machine; far more beside busy neighbours
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    print(f"local-cluster job: session {result['session_s']} s, total {result['total_s']} s")
    assert result["executors"] == 2
    assert result["driver_pid"] not in result["worker_pids"]
    assert result["first"] == result["first_ids"] == 400
    assert result["after_overwrite"] == [[i, str(i % 7)] for i in range(5)]
    shard = ps.open_shard(location, consensus=postgres_url, **s3_options)
    assert shard.upper == 2
    assert sorted((r["id"], r["item"]) for r in shard.snapshot().to_pylist()) == [
        (i, str(i % 7)) for i in range(5)
    ]
    assert not [m.key for m in shard._blob.list("consensus/") if m.key.startswith("consensus/v")]
    assert shard.verify().ok
