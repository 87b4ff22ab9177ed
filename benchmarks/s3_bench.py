"""Spark on object storage: append and snapshot read on a local S3 server vs local files.

Figures only (issue 12 sets no target). The S3 server is moto's standalone server, started as
a subprocess on 127.0.0.1 (a Python process answering HTTP, on the same loaded machine): it
measures the cost of the request path (s3fs, HTTP, one request per object and ranged read),
not the speed of a real S3 region. Both sides write the same cached DataFrame with
``mode("append")`` into a fresh shard per round and read it back with ``sum(value)``; the
sums are checked against the DataFrame's.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks import anchors as a
from benchmarks.harness import alternate, measurement, skipped
from benchmarks.spark_bench import human, make_frame
from persistshard.conformance.s3server import moto_server

S3 = "persistshard on local S3"
LOCAL = "persistshard on local files"
BUCKET = "persistshard-bench"


@contextmanager
def local_s3() -> Iterator[dict[str, Any]]:
    """A moto S3 server with one bucket (`persistshard.conformance.s3server`); yields the s3fs
    storage options that reach it."""
    with moto_server(BUCKET, "bench", "bench") as endpoint:
        yield {
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }


def _spark_options(options: dict[str, Any]) -> dict[str, str]:
    return {f"storage.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in options.items()}


def run(rows: int = 200_000, rounds: int = 3) -> dict[str, Any]:
    from pyspark.sql import functions as F

    spark = a.spark_session()
    missing = a.persistshard_available(spark)
    n = human(rows)
    what_w, what_r = f"append {n} rows", f"snapshot read {n} rows + sum(value)"
    if missing is not None:
        return {
            "title": "Spark on S3",
            "description": "",
            "params": {"rows": rows},
            "measurements": [skipped(w, S3, LOCAL, missing) for w in (what_w, what_r)],
        }
    try:
        import boto3  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the S3 benchmark needs the test extra ({e})") from e
    df = make_frame(spark, rows)
    expected = df.agg(F.sum("value")).collect()[0][0]
    counter = itertools.count()
    with local_s3() as options, tempfile.TemporaryDirectory(prefix="psbench-s3-") as tmp:
        opts = _spark_options(options)

        def s3_path() -> str:
            return f"s3://{BUCKET}/w{next(counter)}-{uuid.uuid4().hex[:8]}"

        def write_s3() -> float:
            path = s3_path()
            start = time.perf_counter()
            df.write.format("persistshard").mode("append").options(**opts).save(path)
            return time.perf_counter() - start

        def write_local() -> float:
            path = f"{tmp}/w{next(counter)}"
            start = time.perf_counter()
            df.write.format("persistshard").mode("append").save(path)
            elapsed = time.perf_counter() - start
            shutil.rmtree(path, True)
            return elapsed

        writes = alternate({S3: write_s3, LOCAL: write_local}, rounds)

        s3_table, local_table = s3_path(), f"{tmp}/read"
        df.write.format("persistshard").mode("append").options(**opts).save(s3_table)
        df.write.format("persistshard").mode("append").save(local_table)
        sums: dict[str, float] = {}

        def reader(name: str, path: str, extra: dict[str, str]) -> Callable[[], None]:
            def go() -> None:
                frame = spark.read.format("persistshard").options(**extra).load(path)
                sums[name] = frame.agg(F.sum("value")).collect()[0][0]

            return go

        reads = alternate(
            {S3: reader(S3, s3_table, opts), LOCAL: reader(LOCAL, local_table, {})}, rounds
        )
        for name, value in sums.items():
            if not math.isclose(value, expected, rel_tol=1e-9):
                raise AssertionError(f"{name} computed sum(value) = {value}, expected {expected}")
        stored = a.directory_bytes(local_table)
    df.unpersist()
    return {
        "title": "Spark on S3: append and snapshot read, local S3 server vs local files",
        "description": (
            f"{n} rows (id BIGINT, name STRING of 16 characters, value DOUBLE), cached, "
            "local[2]. The same append and snapshot read + sum(value) as the Spark benchmark, "
            "once on an `s3://` location given through `storage.*` options (moto's standalone "
            "S3 server on 127.0.0.1, a Python process on the same machine) and once on local "
            "files. Figures only, no target: it shows what the request path costs, not what a "
            "real S3 region would."
        ),
        "params": {"rows": rows, "master": "local[2]", "server": "moto_server, 127.0.0.1"},
        "measurements": [
            measurement(what_w, S3, LOCAL, writes[S3], writes[LOCAL]),
            measurement(what_r, S3, LOCAL, reads[S3], reads[LOCAL]),
        ],
        "notes": [f"bytes stored (local files): {stored / 2**20:.1f} MiB"],
    }
