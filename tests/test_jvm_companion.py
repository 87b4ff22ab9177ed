"""The JVM companion (`persistshard.datasource.companion`, ``jvm/src``): the jar's build
machinery and the part decoder in the JVM.

- Build: the cache key follows each of its inputs; a second call finds the jar; two processes
  building at once end with one complete jar; two builds give the same bytes; without a JDK,
  one `CompanionUnavailable` warning and None, and a Spark session built with
  ``configure_spark`` still works (its Python workers told which interpreter to run).
- Decoder: the golden parts of every format version, and random tables written by the Python
  writer, decode in the JVM to exactly what the Python reader returns (columns pruned,
  chunks skipped by the same statistics decisions as `persistshard.core.read.filters`); a
  damaged part is ``CorruptData`` naming the file and the chunk.

Tests that run javac or a JVM use the ``jdk`` fixture (marked ``subprocess`` by
tests/conftest.py); with ``CI=true`` a missing javac fails them instead of skipping.
The table provider's names: the Python source's short name, the marker option, the service file.
"""

from __future__ import annotations

import decimal
import json
import os
import re
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_format import _tables, all_types_table
from test_format_golden import GOLDEN

from persistshard.core.read import filters
from persistshard.datasource import companion
from persistshard.format import PartReader, encode_part
from persistshard.format.testing import assert_exact

PROVIDER = companion.JAVA_SOURCES / "persistshard/companion/CompanionProvider.java"
SERVICE = (
    companion.JAVA_SOURCES / "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
)
PYTHON_PROVIDER = "org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2"
COMPANION_PROVIDER = "persistshard.companion.CompanionProvider"


def run_session(script: Path, work: Path, jar_cache: Path) -> dict[str, Any]:
    """Run ``script WORK`` (a Spark session with the companion, in a JVM of its own: spark.jars
    applies only when a session starts) with the jar cache, and return what it printed on its
    one line ``RESULT <json>``."""
    env = {**os.environ, companion.CACHE_ENV: str(jar_cache)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run(
        [sys.executable, str(script), str(work)],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def has_the_companion(spark: Any) -> bool:
    """Whether ``spark`` resolves the format ``persistshard`` to the companion's provider and
    has its session catalog (a session built with ``configure_spark``, or the run's shared
    session when it has the companion, conftest's ``PERSISTSHARD_TEST_COMPANION``)."""
    from persistshard.datasource.companion import SESSION_CATALOG, SESSION_CATALOG_KEY

    conf = spark._jsparkSession.sessionState().conf()
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource
    provider = lookup.lookupDataSource("persistshard", conf).getName()
    return bool(
        provider == COMPANION_PROVIDER
        and spark.conf.get(SESSION_CATALOG_KEY, "") == SESSION_CATALOG
    )


def companion_results(
    request: pytest.FixtureRequest,
    spark: Any,
    collect: Callable[[Any, Path], dict[str, Any]],
    script: Path,
    work: Path,
) -> dict[str, Any]:
    """What ``collect(session, work)`` returns for a session with the companion: the run's
    shared ``spark`` when it has it (no JVM of its own), else ``script``'s own session in a
    subprocess (`run_session`, whose jar cache needs the ``jdk``). Both ways go through JSON,
    so the tests see the same values."""
    if has_the_companion(spark):
        result: dict[str, Any] = json.loads(json.dumps(collect(spark, work)))
        return result
    return run_session(script, work, request.getfixturevalue("jar_cache"))


@pytest.fixture(scope="session")
def jar(jar_cache) -> Path:
    (only,) = jar_cache.glob("*.jar")
    return only


@pytest.fixture
def no_jdk(tmp_path, monkeypatch) -> Path:
    """``JAVA_HOME`` pointing at a JRE-like home (``bin/java`` only, no javac); returns it."""
    home = tmp_path / "jre"
    (home / "bin").mkdir(parents=True)
    java = subprocess.run(
        ["bash", "-c", "command -v java"], capture_output=True, text=True
    ).stdout.strip()
    if java:
        os.symlink(os.path.realpath(java), home / "bin" / "java")
    monkeypatch.setenv("JAVA_HOME", str(home))
    monkeypatch.setattr(companion, "_warned", False)
    return home


# --- build machinery -----------------------------------------------------------------------


def test_cache_key_follows_each_input(monkeypatch, tmp_path):
    """Same inputs, same key; a different persistshard version, source file, pyspark version
    or javac version, a different key."""
    import persistshard

    base = companion.cache_key("javac 17.0.15")
    assert base == companion.cache_key("javac 17.0.15")
    assert base.startswith(f"persistshard-companion-{persistshard.__version__}-")
    assert companion.cache_key("javac 21.0.1") != base
    monkeypatch.setattr(companion, "pyspark_version", lambda: "0.0.1")
    assert companion.cache_key("javac 17.0.15") != base
    monkeypatch.undo()
    monkeypatch.setattr(persistshard, "__version__", "9.9.9")
    assert companion.cache_key("javac 17.0.15") != base
    monkeypatch.undo()
    sources = tmp_path / "src"
    for path in companion.source_files():
        rel = path.relative_to(companion.JAVA_SOURCES)
        (sources / rel).parent.mkdir(parents=True, exist_ok=True)
        (sources / rel).write_bytes(path.read_bytes())
    monkeypatch.setattr(companion, "JAVA_SOURCES", sources)
    assert companion.cache_key("javac 17.0.15") == base  # a copy of the sources: same key
    (sources / "persistshard" / "Extra.java").write_text("class Extra {}\n")
    assert companion.cache_key("javac 17.0.15") != base


def test_the_java_sources_ship_in_the_wheel():
    """pyproject's package data names the sources, and the wheel check expects them."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["persistshard"]
    assert "jvm/src/**/*.java" in data
    sys.path.insert(0, str(root / ".ci"))
    try:
        import check_wheel
    finally:
        sys.path.remove(str(root / ".ci"))
    expected = check_wheel.expected_files()
    shipped = {
        "persistshard/jvm/src/" + p.relative_to(companion.JAVA_SOURCES).as_posix()
        for p in companion.source_files()
    }
    assert shipped and shipped <= expected
    assert not [n for n in expected if "prototype" in n]


def test_without_a_jdk_one_warning_and_none(no_jdk, monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert companion.companion_jar() is None
        assert companion.companion_jar() is None
    unavailable = [w for w in caught if issubclass(w.category, companion.CompanionUnavailable)]
    assert len(unavailable) == 1
    assert "CompanionUnavailable: no javac found on JAVA_HOME/bin" in str(unavailable[0].message)
    # Without JAVA_HOME the PATH decides.
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(no_jdk / "bin"))
    monkeypatch.setattr(companion, "_warned", False)
    with pytest.warns(companion.CompanionUnavailable, match="no javac found on PATH"):
        assert companion.companion_jar() is None


def test_cli_jar_without_a_jdk_says_why(no_jdk, capsys):
    from persistshard.cli import main

    assert main(["jar", "--print-path"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("CompanionUnavailable: no javac found")


class Builder:
    """What `configure_spark` uses of a ``SparkSession.builder``."""

    def __init__(self) -> None:
        self._options: dict[str, str] = {}

    def config(self, key: str, value: str) -> Builder:
        self._options[key] = value
        return self


def test_configure_spark_without_a_jdk_sets_only_the_workers_interpreter(no_jdk, monkeypatch):
    monkeypatch.setattr(companion, "_running_conf", lambda: None)  # as before a session
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    named = Builder().config("spark.pyspark.python", "/opt/py/bin/python")
    with pytest.warns(companion.CompanionUnavailable):
        assert companion.configure_spark(named)._options == {
            "spark.pyspark.python": "/opt/py/bin/python"
        }
    assert "PYSPARK_PYTHON" not in os.environ
    builder = companion.configure_spark(Builder())
    assert builder._options == {"spark.pyspark.python": sys.executable}
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert companion.configure_spark(Builder())._options == {}
    assert os.environ["PYSPARK_PYTHON"] == "/usr/bin/python3"


def test_configure_spark_sets_the_session_catalog_unless_one_is_named(monkeypatch, tmp_path):
    jar = str(tmp_path / "companion.jar")
    monkeypatch.setattr(companion, "companion_jar", lambda: jar)
    monkeypatch.setattr(companion, "_running_conf", lambda: None)  # as before a session
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert companion.configure_spark(Builder())._options == {
        "spark.jars": jar,
        companion.SESSION_CATALOG_KEY: companion.SESSION_CATALOG,
    }
    other = Builder().config(companion.SESSION_CATALOG_KEY, "org.example.OtherCatalog")
    with pytest.warns(UserWarning, match="OtherCatalog, so it is kept.*time travel"):
        chosen = companion.configure_spark(other)._options[companion.SESSION_CATALOG_KEY]
    assert chosen == "org.example.OtherCatalog"
    # A running session without the catalog: the warning names it.
    monkeypatch.setattr(companion, "_running_conf", lambda: {"spark.jars": jar})
    with pytest.warns(UserWarning, match=f"lacks {companion.SESSION_CATALOG_KEY}="):
        companion.configure_spark(Builder())


def test_a_second_call_finds_the_cached_jar(jar_cache, jar, monkeypatch):
    monkeypatch.setenv(companion.CACHE_ENV, str(jar_cache))

    def no_build(*args: Any) -> None:
        raise AssertionError("built again although the jar is cached")

    monkeypatch.setattr(companion, "build_jar", no_build)
    assert companion.companion_jar() == str(jar)
    with zipfile.ZipFile(jar) as z:
        names = z.namelist()
    assert names[0] == "META-INF/MANIFEST.MF" and names[1:] == sorted(names[1:])
    assert "persistshard/companion/format/PartFile.class" in names
    # It registers one data source, the companion's table provider, from jvm/src's resource.
    service = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
    assert [n for n in names if n.startswith("META-INF/services/")] == [service]
    with zipfile.ZipFile(jar) as z:
        assert z.read(service).split() == [b"persistshard.companion.CompanionProvider"]


def test_concurrent_builds_end_with_one_jar_of_the_same_bytes(jar, tmp_path):
    """Two processes build into one empty cache at once: both return the same path, the jar
    is complete, no temporary directory is left, and its bytes equal the session's build
    (same sources and javac: a reproducible build)."""
    cache = tmp_path / "cache"
    script = "import persistshard as ps; print(ps.companion_jar())"
    env = {**os.environ, companion.CACHE_ENV: str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(cache / jar.name)
    assert sorted(p.name for p in cache.iterdir()) == [jar.name]
    assert (cache / jar.name).read_bytes() == jar.read_bytes()


def test_cli_jar_prints_the_path(jar_cache, jar, monkeypatch, capsys):
    from persistshard.cli import main

    monkeypatch.setenv(companion.CACHE_ENV, str(jar_cache))
    assert main(["jar", "--print-path"]) == 0
    assert capsys.readouterr().out == f"{jar}\n"
    assert main(["jar"]) == 0
    out = capsys.readouterr().out
    assert str(jar) in out and "--jars" in out and companion.session_catalog_conf() in out


def test_configure_spark_warns_when_the_session_is_already_running(
    spark, jar_cache, jar, monkeypatch
):
    from pyspark.sql import SparkSession

    monkeypatch.setenv(companion.CACHE_ENV, str(jar_cache))
    with pytest.warns(
        UserWarning, match=f"already running.*lacks spark.jars with {re.escape(str(jar))}"
    ):
        builder = companion.configure_spark(SparkSession.builder)
    assert str(jar) in builder._options["spark.jars"].split(",")
    assert builder._options[companion.SESSION_CATALOG_KEY] == companion.SESSION_CATALOG
    # The shared builder must not carry them to other tests.
    builder._options.pop("spark.jars")
    builder._options.pop(companion.SESSION_CATALOG_KEY)


SESSION_SCRIPT = """
import sys, warnings
warnings.simplefilter("always")
import pyarrow as pa
import persistshard as ps
from pyspark.sql import SparkSession

location = sys.argv[1]
shard = ps.open_shard(location)
shard.append(pa.table({"id": [1, 2, 3], "_time": [0, 0, 0], "_diff": [1, 1, 1]}), new_upper=1)
with warnings.catch_warnings(record=True) as caught:
    builder = ps.configure_spark(SparkSession.builder.master("local[1]"))
spark = builder.config("spark.ui.enabled", "false").getOrCreate()
jvm = spark._jvm
conf = spark._jsparkSession.sessionState().conf()
found = jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
    "persistshard", conf).getName()
rows = sorted(r.id for r in spark.read.format("persistshard").load(location).collect())
try:
    loader = jvm.Thread.currentThread().getContextClassLoader()
    jvm.java.lang.Class.forName("persistshard.companion.format.PartFile", True, loader)
    companion_loaded = True
except Exception:
    companion_loaded = False
catalog = spark.conf.get("spark.sql.catalog.spark_catalog", "")
spark.stop()
print("RESULT " + repr({
    "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    "provider": found, "rows": rows, "companion_loaded": companion_loaded, "catalog": catalog,
}))
"""


def _run_session(tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    script = tmp_path / "session.py"
    script.write_text(SESSION_SCRIPT)
    # The session configures itself (configure_spark): not through the test run's own
    # settings, whose PYSPARK_SUBMIT_ARGS names the jar when the run has the companion.
    dropped = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS")
    env = {k: v for k, v in env.items() if k not in dropped}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "shard")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result: dict[str, Any] = eval(line[len("RESULT ") :])  # our own repr of plain values
    return result


def test_a_session_works_with_a_warning_when_no_jdk_is_found(no_jdk, tmp_path):
    """A new session (a JVM of its own; PYSPARK_PYTHON unset, so the workers find this
    interpreter only through configure_spark) on a machine whose JAVA_HOME is a JRE: one
    warning, the Python source reads the shard."""
    result = _run_session(tmp_path, dict(os.environ))
    assert [w.split(":")[0] for w in result["warnings"]] == ["CompanionUnavailable"]
    assert result["provider"] == PYTHON_PROVIDER
    assert result["rows"] == [1, 2, 3]
    assert result["companion_loaded"] is False
    assert result["catalog"] != companion.SESSION_CATALOG


def test_a_session_with_the_companion_resolves_the_format_to_it(jar_cache, tmp_path):
    result = _run_session(tmp_path, {**os.environ, companion.CACHE_ENV: str(jar_cache)})
    assert result["warnings"] == []
    assert result["companion_loaded"] is True
    assert result["provider"] == COMPANION_PROVIDER
    assert result["catalog"] == companion.SESSION_CATALOG
    assert result["rows"] == [1, 2, 3]


# --- the decoder ---------------------------------------------------------------------------


def decode(jar: Path, jobs: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """Run `DecodePart` on ``jobs`` in one JVM; one report per job."""
    listing = work / "jobs.jsonl"
    listing.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    jars = companion.pyspark_jars()
    done = subprocess.run(
        [
            "java",
            *companion.ARROW_JVM_FLAGS,
            "-cp",
            f"{jar}{os.pathsep}{jars}/*",
            companion.DECODE_MAIN,
            "--jobs",
            str(listing),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(jobs), done.stdout
    return reports


def read_ipc(path: str) -> pa.Table:
    with ipc.open_file(path) as f:
        return f.read_all()


def assert_decoded(job: dict[str, Any], want: pa.Table) -> None:
    """The IPC file the JVM wrote for ``job`` holds exactly ``want`` (no columns asked: only
    the row count can be compared)."""
    got = read_ipc(job["out"])
    if job.get("columns") == []:
        assert got.num_columns == 0 and got.num_rows == want.num_rows
        return
    assert_exact(got, want)


def widened(table: pa.Table) -> pa.Table:
    """The Python read as the JVM returns it: Arrow Java has no 32/64-bit decimals, so they
    come back as decimal128 of the same precision and scale (the same values)."""
    for i, f in enumerate(table.schema):  # columns one by one: pyarrow's whole-table cast
        t = f.type  # mishandles some null-typed nested children
        if pa.types.is_decimal(t) and t.bit_width < 128:
            wide = f.with_type(pa.decimal128(t.precision, t.scale))
            table = table.set_column(i, wide, table.column(i).cast(wide.type))
    return table


def test_golden_parts_of_every_version_decode_as_python_reads_them(jar, tmp_path):
    goldens = sorted(GOLDEN.glob("part-v*-*.pspart"))
    assert {p.name.split("-")[1] for p in goldens} == {"v1", "v2", "v3"}
    jobs = [{"part": str(p), "out": str(tmp_path / f"{p.stem}.arrow")} for p in goldens]
    for report, job, path in zip(decode(jar, jobs, tmp_path), jobs, goldens, strict=True):
        reader = PartReader.from_bytes(str(path), path.read_bytes())
        assert report == {"chunks": list(range(len(reader.chunks))), "num_rows": reader.num_rows}
        assert_exact(read_ipc(job["out"]), widened(reader.read()))


def test_every_type_plain_and_compressed_with_pruning(jar, tmp_path):
    """The table of every type the writer stores, in one chunk per row (compressed segments)
    and in one chunk (several plain ones), read whole and pruned (columns reordered)."""
    table = all_types_table()
    jobs, expected = [], []
    for chunk_bytes in (1, 8 << 20):
        data, _ = encode_part(table, chunk_bytes=chunk_bytes, sort_column="i64")
        path = tmp_path / f"all-{chunk_bytes}.part"
        path.write_bytes(data)
        reader = PartReader.from_bytes(str(path), data)
        assert any(s.plain for c in reader.chunks for s in c.segments)
        assert any(not s.plain for c in reader.chunks for s in c.segments)
        for columns in (None, ["nested", "dec", "s", "_diff"], []):
            out = tmp_path / f"all-{chunk_bytes}-{len(jobs)}.arrow"
            jobs.append({"part": str(path), "out": str(out), "columns": columns})
            expected.append(widened(reader.read(columns)))
    for report, job, want in zip(decode(jar, jobs, tmp_path), jobs, expected, strict=True):
        assert report["num_rows"] == table.num_rows
        assert_decoded(job, want)


def test_many_rows_of_every_width_decode_as_python_reads_them(jar, tmp_path):
    """The JVM unshuffles eight values at a time and the rest one by one: 1003 rows (125
    blocks of eight and a tail of three) of every fixed width the writer shuffles (2 to 32
    bytes, decimals of 32 and 64 bits widened), random values with nulls, in compressed
    segments, read whole and pruned, equal the Python read."""
    import numpy as np

    n = 1003
    rng = np.random.default_rng(38)
    mask = rng.random(n) < 0.1

    def ints(low: int, high: int) -> Any:
        return rng.integers(low, high, n)

    def decimals(values: Any, type_: pa.DataType) -> pa.Array:
        pairs = zip(values, mask, strict=True)
        cents = [None if m else decimal.Decimal(int(v)).scaleb(-2) for v, m in pairs]
        return pa.array(cents, type_)

    # Values of a narrow range, so that shuffled planes compress (a random one is stored plain).
    unscaled = ints(-(10**6), 10**6)
    table = pa.table(
        {
            "i16": pa.array(ints(-300, 300), pa.int16(), mask=mask),
            "i32": pa.array(ints(-(10**5), 10**5), pa.int32(), mask=mask),
            "i64": pa.array(ints(-(10**9), 10**9), pa.int64(), mask=mask),
            "f64": pa.array(ints(0, 4000) / 4, pa.float64(), mask=mask),
            "d32": pa.array(ints(8000, 11000), pa.int32(), mask=mask).cast(pa.date32()),
            "dec32": decimals(unscaled, pa.decimal32(9, 2)),
            "dec64": decimals(unscaled, pa.decimal64(18, 2)),
            "dec128": decimals(unscaled, pa.decimal128(15, 2)),
            "dec256": decimals(unscaled, pa.decimal256(40, 2)),
            "ts": pa.array(ints(0, 10**9) + 1_700_000_000_000_000, pa.timestamp("us"), mask=mask),
        }
    )
    data, _ = encode_part(table, chunk_bytes=8 << 20)
    path = tmp_path / "wide.part"
    path.write_bytes(data)
    reader = PartReader.from_bytes(str(path), data)
    assert len(reader.chunks) == 1 and not any(s.plain for s in reader.chunks[0].segments)
    jobs, expected = [], []
    for columns in (None, ["dec128", "d32", "i16"]):
        out = tmp_path / f"wide-{len(jobs)}.arrow"
        jobs.append({"part": str(path), "out": str(out), "columns": columns})
        expected.append(widened(reader.read(columns)))
    for report, job, want in zip(decode(jar, jobs, tmp_path), jobs, expected, strict=True):
        assert report["num_rows"] == n
        assert_decoded(job, want)


def test_a_damaged_part_is_corrupt_data_naming_file_and_chunk(jar, tmp_path):
    table = pa.table({"k": list(range(100)), "s": [str(i) * 3 for i in range(100)]})
    data, _ = encode_part(table, chunk_bytes=200, sort_column="k")
    reader = PartReader.from_bytes("p", data)
    seg = reader.chunks[1].segments[1]
    jobs = []
    for name, offset in (("segment", seg.offset + seg.length // 2), ("footer", len(data) - 30)):
        damaged = bytearray(data)
        damaged[offset] ^= 0x10
        path = tmp_path / f"{name}.part"
        path.write_bytes(bytes(damaged))
        jobs.append({"part": str(path), "out": str(tmp_path / f"{name}.arrow")})
    truncated = tmp_path / "truncated.part"
    truncated.write_bytes(data[:-1])
    jobs.append({"part": str(truncated), "out": str(tmp_path / "truncated.arrow")})
    segment, footer, cut = (r["error"] for r in decode(jar, jobs, tmp_path))
    assert segment.startswith("CorruptData: checksum mismatch in column 's'")
    assert segment.endswith(f"(file {jobs[0]['part']}, chunk 1)")
    assert footer == f"CorruptData: footer checksum mismatch (file {jobs[1]['part']})"
    assert cut.startswith("CorruptData: not a part") and str(truncated) in cut


def _leaf(column: str, values: list[Any]) -> st.SearchStrategy[filters.Pred]:
    present = [v for v in values if v is not None] or [0]
    value = st.sampled_from(present) | st.sampled_from([min(present), max(present)])
    ops = st.sampled_from(["eq", "lt", "le", "gt", "ge"])
    return st.one_of(
        st.builds(lambda op, v: filters.Pred(op, column, v), ops, value),
        st.builds(
            lambda vs: filters.Pred("in", column, tuple(vs)),
            st.lists(value, min_size=1, max_size=3),
        ),
        st.sampled_from([filters.Pred("is_null", column), filters.Pred("is_not_null", column)]),
    )


def _pred_json(pred: filters.Pred) -> dict[str, Any]:
    if pred.children:
        return {"op": pred.op, "children": [_pred_json(c) for c in pred.children]}
    value = list(pred.value) if isinstance(pred.value, tuple) else pred.value
    return {"op": pred.op, "column": pred.column, "value": value}


def _combined(kids: st.SearchStrategy[filters.Pred]) -> st.SearchStrategy[filters.Pred]:
    """``and``/``or`` of two or three of ``kids``, or ``not`` of one."""
    return st.one_of(
        st.lists(kids, min_size=2, max_size=3).map(
            lambda cs: filters.Pred("and", children=tuple(cs))
        ),
        st.lists(kids, min_size=2, max_size=3).map(
            lambda cs: filters.Pred("or", children=tuple(cs))
        ),
        kids.map(lambda c: filters.Pred("not", children=(c,))),
    )


@st.composite
def _cases(draw: st.DrawFn) -> tuple[pa.Table, int, list[str] | None, filters.Pred | None]:
    """A random table with an int key and a string column in front (the filterable ones),
    a chunk size, a column selection and a filter over the two."""
    rest = draw(_tables())
    n = rest.num_rows
    keys = draw(st.lists(st.integers(-50, 50) | st.none(), min_size=n, max_size=n))
    words = draw(
        st.lists(
            st.sampled_from(["", "a", "ab", "b", "zz", "é"]) | st.none(), min_size=n, max_size=n
        )
    )
    if draw(st.booleans()):
        keys = sorted(keys, key=lambda k: (k is None, k or 0))
    table = pa.table({"key": pa.array(keys, pa.int64()), "word": pa.array(words, pa.string())})
    for name in rest.column_names:
        table = table.append_column(name, rest[name])
    chunk_bytes = draw(st.sampled_from([1, 64, 1000, 1 << 20]))
    columns = draw(st.none() | st.lists(st.sampled_from(table.column_names), unique=True))
    leaves = st.one_of(_leaf("key", keys), _leaf("word", words))
    level1 = leaves | _combined(leaves)
    tree = level1 | _combined(level1)
    pred = draw(st.none() | tree)
    return table, chunk_bytes, columns, pred


def test_random_parts_decode_in_the_jvm_as_python_reads_them(jar, tmp_path):
    """Property: for random tables written by the Python writer, the JVM keeps exactly the
    chunks `filters.chunk_may_match` keeps (format versions 2 and later: every column's
    statistics), and what it decodes from them equals the Python read of those chunks.

    Hypothesis draws every example first (each one's parts written and the Python read of
    them kept), then one JVM decodes the parts of all examples: a JVM per example made this
    the slowest test of the suite. A mismatch names its example's job (part, columns, filter);
    Hypothesis does not shrink it, as the JVM runs after the draws."""
    jobs: list[dict[str, Any]] = []
    expected: list[tuple[list[int], pa.Table]] = []

    @settings(
        max_examples=examples(40),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(cases=st.lists(_cases(), min_size=1, max_size=6))
    def draw_examples(cases: list[tuple[pa.Table, int, list[str] | None, Any]]) -> None:
        for table, chunk_bytes, columns, pred in cases:
            i = len(jobs)
            data, _ = encode_part(table, chunk_bytes=chunk_bytes, sort_column="key")
            path = tmp_path / f"{i}.part"
            path.write_bytes(data)
            reader = PartReader.from_bytes(str(path), data)
            kept = [
                c
                for c in range(len(reader.chunks))
                if pred is None or filters.chunk_may_match(pred, reader, c)
            ]
            parts = [reader.read_chunk(c, columns) for c in kept]
            want = pa.Table.from_batches(parts, schema=reader.projected_schema(columns))
            expected.append((kept, widened(want)))
            jobs.append(
                {
                    "part": str(path),
                    "out": str(tmp_path / f"{i}.arrow"),
                    "columns": columns,
                    "filter": None if pred is None else _pred_json(pred),
                }
            )

    draw_examples()
    assert len(jobs) >= examples(40)  # every example's cases reach the one JVM run
    for report, job, (kept, want) in zip(decode(jar, jobs, tmp_path), jobs, expected, strict=True):
        assert report["chunks"] == kept, job
        assert_decoded(job, want)


def test_version_1_parts_skip_by_the_sort_column_only(jar, tmp_path):
    """A version 1 golden part has no per-column statistics: a filter on its sort column skips
    chunks, one on another column cannot (as in Python)."""
    path = GOLDEN / "part-v1-updates.pspart"
    reader = PartReader.from_bytes(str(path), path.read_bytes())
    assert reader.sort_column is not None and reader.chunks[0].column_stats is None
    bound = reader.chunks[0].key_max
    other = next(n for n in reader.schema.names if n != reader.sort_column)
    preds = [
        filters.Pred("le", reader.sort_column, bound),
        filters.Pred("gt", other, 10**6),
    ]
    jobs = [
        {"part": str(path), "out": str(tmp_path / f"{i}.arrow"), "filter": _pred_json(p)}
        for i, p in enumerate(preds)
    ]
    reports = decode(jar, jobs, tmp_path)
    for report, pred in zip(reports, preds, strict=True):
        kept = [c for c in range(len(reader.chunks)) if filters.chunk_may_match(pred, reader, c)]
        assert report["chunks"] == kept
    assert len(reports[0]["chunks"]) < len(reader.chunks)
    assert len(reports[1]["chunks"]) == len(reader.chunks)


# --- the table provider's names ------------------------------------------------------------


def java_constant(name: str) -> str:
    match = re.search(rf'static final String {name} = "([^"]*)";', PROVIDER.read_text())
    assert match, f"{PROVIDER.name} defines no String constant {name}"
    return match.group(1)


def test_the_provider_takes_the_python_sources_registered_name():
    from pyspark_persistshard import DefaultSource

    assert java_constant("PYTHON_NAME") == DefaultSource.name()


def test_the_marker_option_passes_the_unknown_option_check():
    from persistshard.datasource.options import check_known
    from persistshard.errors import InvalidOption

    marker = java_constant("MARKER_KEY")
    check_known({marker: java_constant("MARKER_VALUE")}, frozenset(), "read")
    with pytest.raises(InvalidOption):  # the check is live: a plain unknown key is refused
        check_known({marker.lstrip("_"): "1"}, frozenset(), "read")


def test_the_service_file_names_a_provider_class_that_exists():
    (name,) = SERVICE.read_text().split()
    assert (companion.JAVA_SOURCES / (name.replace(".", "/") + ".java")).is_file()


@pytest.mark.spark
def test_the_format_resolves_to_the_sessions_provider(spark):
    """``persistshard`` is the companion's provider in a session with its jar, and Spark's
    provider of Python data sources in one without (the README's second pass runs this)."""
    from conftest import WITH_COMPANION

    conf = spark._jsparkSession.sessionState().conf()
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource
    wanted = COMPANION_PROVIDER if WITH_COMPANION else PYTHON_PROVIDER
    assert lookup.lookupDataSource("persistshard", conf).getName() == wanted
