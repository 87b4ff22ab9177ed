"""The tests test the working tree: in this process and in Spark's Python workers."""

from __future__ import annotations

import os

import pytest

import persistshard


def _package_dir(module_file: str) -> str:
    return os.path.realpath(os.path.dirname(module_file))


def test_this_process_imports_the_tree(repo_root):
    assert _package_dir(persistshard.__file__) == repo_root
    import pyspark_persistshard

    assert os.path.realpath(pyspark_persistshard.__file__) == os.path.join(
        repo_root, "entry", "pyspark_persistshard.py"
    )


def test_no_top_level_twin_of_a_subpackage():
    """`core` and `errors` exist only as `persistshard.core`/`persistshard.errors` here, so an
    error class raised by the package is the one the tests catch."""
    for name in ("core", "errors", "format.part"):
        with pytest.raises(ModuleNotFoundError):
            __import__(name)


@pytest.mark.spark
def test_spark_workers_import_the_tree(spark, repo_root):
    def where(_: object) -> tuple[str, str]:
        import persistshard as ps
        import pyspark_persistshard as entry

        return ps.__file__, entry.__file__

    (package_file, entry_file), *_ = spark.sparkContext.parallelize([0], 1).map(where).collect()
    assert _package_dir(package_file) == repo_root
    assert os.path.realpath(entry_file) == os.path.join(
        repo_root, "entry", "pyspark_persistshard.py"
    )


def test_a_test_that_stops_the_shared_session_fails_by_name(spark):
    """conftest's `spark` refuses `stop()` on the suite's one session: a test that stopped it
    would otherwise make every later Spark test in the process fail, none pointing at it."""
    with pytest.raises(RuntimeError, match="stopped the suite's shared SparkSession"):
        spark.stop()
    assert spark.range(3).count() == 3


def test_the_suites_jvms_run_with_the_test_options(spark):
    """conftest's `TEST_JVM_OPTIONS` reach the shared session's JVM (through
    ``JDK_JAVA_OPTIONS``, which ``java`` reads itself): the suite's CPU budget counts on
    them, and a session launched some other way would silently lose them."""
    from conftest import TEST_JVM_OPTIONS

    assert os.environ.get("JDK_JAVA_OPTIONS"), "conftest did not set JDK_JAVA_OPTIONS"
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(bean.getInputArguments())
    wanted = os.environ["JDK_JAVA_OPTIONS"].split()
    assert all(option in arguments for option in wanted), arguments
    if os.environ["JDK_JAVA_OPTIONS"] == TEST_JVM_OPTIONS:
        assert "-XX:TieredStopAtLevel=1" in arguments and "-XX:+UseSerialGC" in arguments
