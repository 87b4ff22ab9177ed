"""Anchors: what persistshard is measured against, outside persistshard.

- `PassThroughIPC` (format ``passthrough_ipc``): the smallest useful Python data source.
  Each write task writes the Arrow batches Spark hands it, as they come, to one Arrow IPC
  file (zstd) in the directory; a read has one partition per file and yields its
  RecordBatches as they are stored. No commit protocol (files appear as tasks finish, a
  failed job leaves them behind), no times or diffs, no consolidation: it is the ceiling of
  the Python data source path, and what persistshard does above it is ours to justify.
- Spark's native parquet (`parquet_write`, `parquet_sum`).
- delta-rs (the ``deltalake`` package, optional): the nearest peer outside Spark, writing
  and reading the same Arrow table in-process.

Spark pickles a data source class by reference, so Python workers must be able to import
this module: `spark_session` puts the repository root on the workers' ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = ".arrow"


# --- the pass-through Python source --------------------------------------------------------


@dataclass
class _Written(WriterCommitMessage):
    file: str | None
    rows: int


class _IPCWriter(DataSourceArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        file = None
        writer = None
        rows = 0
        try:
            for batch in iterator:
                if writer is None:
                    os.makedirs(self.path, exist_ok=True)
                    file = os.path.join(self.path, f"part-{uuid.uuid4().hex}{SUFFIX}")
                    options = ipc.IpcWriteOptions(compression="zstd")
                    writer = ipc.new_file(file, batch.schema, options=options)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        return _Written(file, rows)


@dataclass
class _File(InputPartition):
    file: str


class _IPCReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[_File]:
        return [_File(f) for f in _files(self.path)]

    def read(self, partition: _File) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        with pa.memory_map(partition.file) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _files(path: str) -> list[str]:
    if not os.path.isdir(path):
        return []
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(SUFFIX))


class PassThroughIPC(DataSource):
    """``passthrough_ipc``: Arrow IPC files, one per write task; no commit, no consolidation.

    The read schema is the schema of the first file (Spark's own nullability included, so
    stored batches can be yielded unchanged).
    """

    @classmethod
    def name(cls) -> str:
        return "passthrough_ipc"

    @property
    def path(self) -> str:
        return self.options["path"]

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        files = _files(self.path)
        if not files:
            raise FileNotFoundError(f"passthrough_ipc: no {SUFFIX} files under {self.path}")
        with pa.memory_map(files[0]) as source:
            return from_arrow_schema(ipc.open_file(source).schema)

    def writer(self, schema: StructType, overwrite: bool) -> _IPCWriter:
        if overwrite:
            shutil.rmtree(self.path, ignore_errors=True)
        return _IPCWriter(self.path)

    def reader(self, schema: StructType) -> _IPCReader:
        return _IPCReader(self.path)


# --- Spark ---------------------------------------------------------------------------------


def _entry_dir() -> list[str]:
    """The directory of ``pyspark_persistshard`` when it is not on ``sys.path`` itself (an
    editable install serves it through an import hook): Spark finds Python data sources by
    scanning the workers' path (README, "Spark finds the format"), so the benchmarks' workers
    get that directory, and the format ``persistshard`` resolves with or without the
    companion (whose writes go to the Python source of that name)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark_persistshard")
    if spec is None or spec.origin is None:
        return []
    where = os.path.dirname(os.path.abspath(spec.origin))
    on_path = {os.path.abspath(p or os.curdir) for p in sys.path}
    return [] if where in on_path else [where]


def spark_session(
    master: str = "local[2]", driver_memory: str = "4g", companion: bool = False
) -> SparkSession:
    """The benchmarks' one SparkSession: workers run this interpreter and can import
    ``benchmarks``; `PassThroughIPC` is registered. Set the environment before the JVM
    starts (the first session of the process); later calls return the same session.
    ``companion``: the builder goes through ``ps.configure_spark`` (the JVM companion's jar
    on the classpath, when a JDK is found), so the format ``persistshard`` is the companion."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [
        str(ROOT),
        *_entry_dir(),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("persistshard-benchmarks")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    )
    if companion:
        import persistshard as ps

        builder = ps.configure_spark(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PassThroughIPC)
    return spark


def persistshard_available(spark: SparkSession) -> str | None:
    """None when the ``persistshard`` format is usable, else why not (for a skip note)."""
    try:
        import pyspark_persistshard
    except Exception as e:  # broken or absent module: say so
        return f"pyspark_persistshard does not import ({type(e).__name__}: {e})"
    source = getattr(pyspark_persistshard, "DefaultSource", None)
    if source is None:
        return "pyspark_persistshard does not export DefaultSource yet"
    try:
        spark.dataSource.register(source)
    except Exception as e:
        return f"registering DefaultSource failed ({type(e).__name__}: {e})"
    return None


def parquet_write(df: DataFrame, path: str) -> None:
    df.write.mode("overwrite").parquet(path)


def parquet_sum(spark: SparkSession, path: str) -> Any:
    from pyspark.sql import functions as F

    return spark.read.parquet(path).agg(F.sum("value")).collect()[0][0]


def passthrough_write(df: DataFrame, path: str) -> None:
    df.write.format(PassThroughIPC.name()).mode("overwrite").save(path)


def passthrough_sum(spark: SparkSession, path: str) -> Any:
    from pyspark.sql import functions as F

    return spark.read.format(PassThroughIPC.name()).load(path).agg(F.sum("value")).collect()[0][0]


def persistshard_append(df: DataFrame, path: str) -> None:
    df.write.format("persistshard").mode("append").save(path)


def persistshard_sum(spark: SparkSession, path: str) -> Any:
    from pyspark.sql import functions as F

    return spark.read.format("persistshard").load(path).agg(F.sum("value")).collect()[0][0]


# --- delta-rs ------------------------------------------------------------------------------


def deltalake_available() -> str | None:
    """None when delta-rs can be used, else why not."""
    try:
        import deltalake  # noqa: F401
    except ImportError:
        return "the deltalake package is not installed (pip install deltalake)"
    return None


def delta_write(table: pa.Table, path: str) -> None:
    from deltalake import write_deltalake

    write_deltalake(path, table, mode="append")


def delta_read(path: str) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_table()


def directory_bytes(path: str) -> int:
    """Bytes of every file under ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total
