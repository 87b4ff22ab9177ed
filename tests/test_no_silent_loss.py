"""No silent loss: storage Spark cannot share is refused, a shard is never mixed into a
directory of other files, and the command line never reports success on a non-shard path."""

from __future__ import annotations

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.datasource.options import (
    ReadOptions,
    StorageOptions,
    WriteOptions,
    check_shared,
    storage_options,
)


def test_storage_options_are_parsed_and_hidden():
    opts = WriteOptions.parse(
        {
            "path": "s3://b/t",
            "storage.key": "k",
            "storage.secret": "hunter2",
            "storage.client_kwargs": '{"endpoint_url": "http://127.0.0.1:9"}',
            "storage.anon": "false",
            "storage.token": "not json",
        }
    )
    assert opts.storage_options == {
        "key": "k",
        "secret": "hunter2",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "anon": False,
        "token": "not json",
    }
    assert "hunter2" not in repr(opts) and "secret" in repr(opts)
    assert "hunter2" not in repr(StorageOptions(secret="hunter2"))
    assert ReadOptions.parse({"path": "/x"}).storage_options == {}
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: option 'storage\.'"):
        storage_options({"storage.": "x"})


@pytest.mark.parametrize("url", ["memory://t/x", "simplecache::memory://t/x", "memory:///y"])
def test_process_local_storage_is_refused_for_spark(url):
    with pytest.raises(ps.StorageUnsupported, match=r"^StorageUnsupported: memory:// lives"):
        check_shared(url)
    with pytest.raises(ps.StorageUnsupported):
        WriteOptions.parse({"path": url})
    with pytest.raises(ps.StorageUnsupported):
        ReadOptions.parse({"path": url})
    check_shared("/data/somewhere")
    check_shared("s3://bucket/key")


@pytest.mark.spark
def test_spark_refuses_memory_and_the_python_api_keeps_it(spark):
    """A Spark write to memory:// used to report success and vanish."""
    df = spark.createDataFrame([(1,)], "id BIGINT")
    with pytest.raises(Exception, match=r"StorageUnsupported: memory:// lives inside one process"):
        df.write.format("persistshard").mode("append").save("memory://spark-lost/t")
    with pytest.raises(Exception, match=r"StorageUnsupported: memory://"):
        spark.read.format("persistshard").load("memory://spark-lost/t").collect()
    shard = ps.open_shard("memory://python-api-kept/t")
    shard.append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    assert ps.open_shard("memory://python-api-kept/t").upper == 1


def test_no_shard_in_a_directory_of_other_files(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("id\n1\n")
    shard = ps.open_shard(str(tmp_path / "data"))
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: .*holds files but .*orders\.csv"):
        shard.append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["orders.csv"]
    # An existing shard keeps working, whatever else appears next to it.
    ok = ps.open_shard(str(tmp_path / "ok"))
    ok.append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    (tmp_path / "ok" / "notes.txt").write_text("hello")
    ok.append(pa.table({"id": [2], "_time": [1], "_diff": [1]}))
    assert ok.upper == 2


@pytest.mark.spark
def test_spark_write_into_a_directory_of_other_files_is_refused(spark, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0000.parquet").write_bytes(b"PAR1")
    df = spark.createDataFrame([(1,)], "id BIGINT")
    with pytest.raises(Exception, match=r"InvalidOption: the location holds files but no"):
        df.write.format("persistshard").mode("append").save(str(tmp_path / "data"))
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["part-0000.parquet"]


@pytest.mark.parametrize("command", ["inspect", "history", "verify", "compact", "gc"])
def test_every_command_on_a_non_shard_path_exits_non_zero(tmp_path, capsys, command):
    (tmp_path / "notashard").mkdir()
    (tmp_path / "notashard" / "file.txt").write_text("x")
    for where in (str(tmp_path / "notashard"), str(tmp_path / "missing")):
        assert cli([command, where]) == 2
        out, err = capsys.readouterr()
        assert err.startswith("NoShard: no shard at") and out == ""
        assert cli([command, where, "--json"]) == 2
    assert not (tmp_path / "missing").exists()
    assert [p.name for p in (tmp_path / "notashard").iterdir()] == ["file.txt"]


def test_bad_storage_option_syntax_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["inspect", str(tmp_path), "--storage-option", "novalue"])
    assert e.value.code == 2
    assert "NAME=VALUE" in capsys.readouterr().err
