"""Shared fixtures, and the guarantee that the tests test the working tree.

The repository root *is* the package ``persistshard`` (``package-dir`` maps it), so without
help ``import persistshard`` would find whatever copy ``pip install`` last put into
site-packages, while ``import core`` would find the tree. Before anything imports the
package, this module builds a tiny directory that holds two links, ``persistshard`` -> the
repository root and ``pyspark_persistshard.py`` -> its twin in ``entry/`` (and ``benchmarks``,
not shipped, for the harness tests), and puts it first on
``sys.path`` *and* on ``PYTHONPATH``. So the test process and every Python worker that Spark
starts (they inherit the environment of the JVM, which inherits ours) import exactly the code
in this tree, with or without a reinstall. The repository root itself is taken off
``sys.path``, so no test can import ``core`` or ``errors`` as top-level modules by accident.

One session-scoped SparkSession (pytest-spark's ``spark_session``, local[2]) serves the run.

Test tiers: `pytest_collection_modifyitems` below marks each test by what it starts, from the
fixtures it uses (`FIXTURE_MARKERS`) and a short list for what no fixture shows
(`EXPLICIT_MARKERS`): ``spark`` (the session's JVM), ``database`` (PostgreSQL), ``s3`` (moto's
server), ``subprocess`` (worker processes or a JVM of its own), and ``slow`` for the tests
`SLOW` names (the longest of the rest, measured). The README's fast command deselects them;
the full command (CI's) deselects nothing; tests/test_tiers.py checks the marking.
Hypothesis runs the "dev" profile (few examples) unless ``CI=true`` or
``PERSISTSHARD_HYPOTHESIS_PROFILE`` picks "ci"; tests that need their own budget use
`conformance_helpers.examples`.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


#: The shim's ``sitecustomize.py``, which every Python process of the run imports at start
#: (the shim is on ``PYTHONPATH``): it takes Spark's ``pyspark.zip`` off ``sys.path``. Spark
#: puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python workers' path; the zip
#: holds no bytecode, so each interpreter Spark starts compiles pyspark's modules anew (2 s
#: of CPU for a streaming source's runner, 15 s of wall time at load 9 on 2 cores), and
#: Spark 4.3 waits a fixed 10 s, no setting raises it, for a worker it starts directly (a
#: streaming source's runner) to connect back: "Python worker failed to connect back". The
#: zip is the installed pyspark's own, so the workers import the same code, from the
#: package's compiled modules. The same for Spark's ``py4j-<version>-src.zip`` when the
#: installed py4j is that version: besides compiling py4j, each Python task's
#: ``importlib.invalidate_caches()`` (pyspark's ``setup_spark_files``) re-read the zip's
#: directory, and so did every ``importlib.metadata`` lookup (crc32c's import makes one).
#: Another ``sitecustomize`` on the path still runs after it.
_SITECUSTOMIZE = """\
# Written by persistshard's tests/conftest.py for one test run (see _SITECUSTOMIZE there).
import importlib.machinery, importlib.util, os, sys

_ZIPS = {zips!r}
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) not in _ZIPS]
_here = os.path.dirname(os.path.realpath(__file__))
_rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
"""


def _spark_zips() -> list[str]:
    """The zips Spark puts on its workers' path that hold what is installed anyway: the
    installed pyspark's own ``pyspark.zip``, and its ``py4j-<version>-src.zip`` when the
    installed py4j (a dependency of pyspark's wheel) is that version."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:  # pragma: no cover - pyspark is a dependency
        raise RuntimeError("pyspark is not installed")
    lib = os.path.join(os.path.dirname(os.path.realpath(spec.origin)), "python", "lib")
    zips = [os.path.join(lib, "pyspark.zip")]
    try:
        py4j = os.path.join(lib, f"py4j-{importlib.metadata.version('py4j')}-src.zip")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - pyspark's dependency
        return zips
    if os.path.exists(py4j):
        zips.append(py4j)
    return zips


def _bytecode_for_the_run(shim: str) -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (some machines' environment sets it), no process
    of the run could keep bytecode for the tree: each of the hundreds of Python processes
    Spark and the tests start (workers, planners, the bridge's) compiled persistshard anew,
    about 0.3 s of CPU apiece. So the processes this one starts keep their bytecode in a
    directory of the run's own (``PYTHONPYCACHEPREFIX``, removed with the shim at exit, shared
    by pytest-xdist's workers, which inherit it), and nothing is written next to any source.
    This process keeps the setting it was started with. A prefix already chosen is kept."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(shim, "bytecode")
        del os.environ["PYTHONDONTWRITEBYTECODE"]


def _import_the_tree() -> str:
    if "persistshard" in sys.modules:  # pragma: no cover - a plugin imported it first
        raise RuntimeError("persistshard was imported before tests/conftest.py could redirect it")
    shim = tempfile.mkdtemp(prefix="persistshard-tree-")
    atexit.register(shutil.rmtree, shim, True)
    os.symlink(ROOT, os.path.join(shim, "persistshard"))
    os.symlink(os.path.join(ROOT, "benchmarks"), os.path.join(shim, "benchmarks"))
    os.symlink(
        os.path.join(ROOT, "entry", "pyspark_persistshard.py"),
        os.path.join(shim, "pyspark_persistshard.py"),
    )
    with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE.format(zips=_spark_zips()))
    _bytecode_for_the_run(shim)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != ROOT]
    sys.path.insert(0, shim)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = shim + (os.pathsep + previous if previous else "")
    return shim


TREE_SHIM = _import_the_tree()

#: The options of every JVM the suite starts (the shared session's, the subprocess sessions',
#: Spark's launcher's), unless ``JDK_JAVA_OPTIONS`` is already set: only the C1 compiler and
#: the serial collector. A test JVM lives for minutes on tiny data, so C2's compilations and
#: the parallel collector's threads are mostly spent CPU that never pays back; measured on
#: the Spark read files and the companion's session files, they cost the run's JVMs about
#: half again as much CPU (docs: README, "Development"). They change no behaviour a test
#: sees. ``java`` reads the variable itself (JDK 9+); ``javac`` does not.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("JDK_JAVA_OPTIONS", TEST_JVM_OPTIONS)

import persistshard  # noqa: E402  (after the redirection above, on purpose)

if os.path.realpath(os.path.dirname(persistshard.__file__ or "")) != ROOT:  # pragma: no cover
    raise RuntimeError(f"tests would import {persistshard.__file__}, not the tree at {ROOT}")


# Hypothesis profiles. "dev", the default, runs a quarter of CI's examples so the edit loop
# stays fast; "ci" keeps Hypothesis's own CI settings (derandomized, no deadline) with its
# default of 100 examples. CI=true (or PERSISTSHARD_HYPOTHESIS_PROFILE=ci) selects "ci";
# pytest's --hypothesis-profile still overrides both. A test's own budget is written as
# `conformance_helpers.examples(n)`: n examples under "ci", scaled to the profile loaded.
settings.register_profile("dev", settings.get_profile("default"), max_examples=25)
settings.register_profile("ci", settings.get_profile("ci"), max_examples=100)


def _in_ci() -> bool:
    """Whether ``CI`` says this is a CI run (any value but empty, "0", "false", "no")."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _hypothesis_profile() -> str:
    chosen = os.environ.get("PERSISTSHARD_HYPOTHESIS_PROFILE", "")
    if chosen:
        return chosen
    return "ci" if _in_ci() else "dev"


settings.load_profile(_hypothesis_profile())

#: A test that uses one of these fixtures (directly or through another fixture) gets the
#: marker: what the fixture starts. ``spark`` depends on pytest-spark's ``spark_session``.
FIXTURE_MARKERS: dict[str, str] = {
    "spark_session": "spark",
    "postgres_url": "database",
    "s3_endpoint": "s3",  # tests/test_s3.py
    "s3_options": "s3",  # the moto servers of test_inline, test_linearizability, test_local_cluster
    "s3_direct": "s3",  # test_fault_proxy, test_contracts_under_faults (the proxies sit on it)
    "jdk": "subprocess",  # test_jvm_companion: javac builds the companion, java runs it
}

#: What no fixture shows: ``fnmatch`` patterns over "file::Class::function" (no parameters;
#: "file::function" outside a class) -> markers. ``subprocess``: the test starts another
#: Python interpreter or a JVM of its own (tool commands such as git do not count). A
#: parameter that reaches a server through ``request.getfixturevalue`` carries its marker
#: where it is declared (``db_url`` in test_sqlconsensus.py, the sweep in
#: test_linearizability.py, NegativeDiff in test_errors.py).
EXPLICIT_MARKERS: dict[str, tuple[str, ...]] = {
    # A Spark application in a child process (a JVM of its own).
    "test_local_cluster.py::*": ("spark", "subprocess"),
    "test_spark.py::test_hive_catalog_keeps_the_location": ("spark", "subprocess"),
    "test_jvm_companion.py::test_a_session_*": ("spark", "subprocess"),
    "test_jvm_scan.py::*": ("spark", "subprocess"),
    "test_companion_rowlevel.py::*": ("spark", "subprocess"),
    "test_companion_sql.py::*": ("spark", "subprocess"),
    "test_s3.py::test_the_companion_*": ("spark", "subprocess"),
    # Racing workers of the storage contracts (processes when the store is shared).
    "*::test_put_if_absent_race": ("subprocess",),
    "*::test_cas_race": ("subprocess",),
    # Linearizability recorder runs (worker and gc processes), also under `persistshard
    # conformance`.
    "test_linearizability.py::test_a_store_ignoring_the_condition_is_refused_or_caught": (
        "subprocess",
    ),
    "test_linearizability.py::test_local_files": ("subprocess",),
    "test_linearizability.py::test_sqlite": ("subprocess",),
    "test_linearizability.py::test_postgres": ("subprocess",),
    "test_linearizability.py::test_s3": ("subprocess",),
    "test_linearizability.py::test_sweep": ("subprocess",),
    "test_linearizability.py::test_conformance_*": ("subprocess",),
    "test_cli_output.py::test_conformance_json_on_local_files": ("subprocess",),
    "test_cli_output.py::test_conformance_prints_no_pytest_warnings": ("subprocess",),
    "test_leases_cli.py::test_conformance_cleans_up_after_itself": ("subprocess",),
    "test_sqlconsensus.py::test_cli_conformance_with_consensus": ("subprocess",),
    # Writers racing in processes.
    "test_everyday.py::test_four_processes_append_plainly_without_failures": ("subprocess",),
    "test_remap.py::test_racing_minters_in_processes": ("subprocess",),
    "test_sqlconsensus.py::test_racing_processes_every_version_has_one_winner": ("subprocess",),
    # A child interpreter that measures memory, imports afresh, or exits to leave a dead pid.
    "test_writer_memory.py::test_write_task_memory_stays_near_budget": ("subprocess",),
    "test_diff.py::test_peak_memory_stays_far_below_the_table": ("subprocess",),
    "test_compaction.py::test_import_persistshard_does_not_import_pyspark": ("subprocess",),
    "test_compaction.py::test_the_data_source_imports_without_pandas": ("subprocess",),
    "test_leases_metadata.py::test_spill_directories_of_killed_processes_are_swept": (
        "subprocess",
    ),
    "test_benchmarks_harness.py::test_each_benchmark_runs_in_a_process_of_its_own": ("subprocess",),
    # A child pytest that collects the whole suite.
    "test_tiers.py::test_a_test_is_marked_by_what_its_fixtures_start": ("subprocess",),
    "test_tiers.py::test_the_fast_selection_*": ("subprocess",),
    "test_tiers.py::test_every_marker_used_is_declared": ("subprocess",),
    "test_tiers.py::test_slow_names_tests_that_exist_*": ("subprocess",),
    "test_tiers.py::test_the_session_has_the_companion_*": ("subprocess",),
}


#: The slow tests of what the fast command keeps: each took 10 s or more in runs of the fast
#: tier with ``--durations`` on 2 heavily shared cores (a few seconds on idle ones); together
#: about a third of that tier's time. "file::function" (or "file::Class::function") marks every
#: parameter of the test, "file::function[id]" one. CI runs them all.
SLOW: frozenset[str] = frozenset(
    {
        # Sweeps: a crash, a lost response or a cut page cache at every store call of a
        # scenario whose setup is long (the other scenarios stay in the fast tier).
        "test_crash.py::test_process_dies_before_every_store_call[gc]",
        "test_crash.py::test_page_cache_cut_at_every_step[gc]",
        "test_crash.py::test_lost_response_at_every_store_call[append]",
        "test_crash.py::test_lost_response_at_every_store_call[append-inline]",
        "test_crash.py::test_lost_response_at_every_store_call[consumer]",
        "test_crash.py::test_lost_response_at_every_store_call[fork]",
        "test_crash.py::test_lost_response_at_every_gc_store_call_then_going_on",
        "test_forks.py::test_lost_responses_in_fork_and_drop[fork-drop]",
        # Every interleaving of racing handles, checked for linearizability.
        "test_interleaving.py::test_every_interleaving_of_racing_writers_and_gc_is_linearizable",
        "test_interleaving.py::test_every_interleaving_of_stale_writer_gc_and_reader_is_linearizable",
        "test_linearizability.py::test_random_legal_histories_of_200_ops_are_accepted_fast",
        # Every byte of a part, every stored file, flipped or cut.
        "test_format_corruption.py::test_every_flipped_byte_is_caught",
        "test_storage_corruption.py::test_every_file_flipped_or_truncated_reads_the_same_or_is_corrupt",
        # Random histories and tables (seeds 2 and 3 of the holds stay in the fast tier).
        "test_holds.py::test_random_holds_never_lose_a_readers_history[0]",
        "test_holds.py::test_random_holds_never_lose_a_readers_history[1]",
        "test_format.py::test_random_tables_round_trip",
        "test_correction.py::TestSpillingCorrection::runTest",
        # gc crashed before each of its deletions, and random histories of part files.
        "test_gc.py::test_gc_resumes_after_a_crash_between_any_two_deletions",
        "test_gc.py::test_random_history_never_loses_a_live_version[0]",
        "test_gc.py::test_random_history_never_loses_a_live_version[1]",
        # Spilling and a long retained log.
        "test_scan.py::test_consolidation_across_tasks_spills",
        "test_gc_faults.py::test_gc_reads_only_the_entries_since_its_last_run",
    }
)


def _names(item: pytest.Item) -> tuple[str, str]:
    """("file::Class::function" without parameters, the same with them), from the node id
    (a class by the name the module gives it, as pytest collects it)."""
    path, *rest = item.nodeid.split("::")
    full = "::".join([os.path.basename(path), *rest])
    prefix = full.rpartition("::")[0]
    return f"{prefix}::{getattr(item, 'originalname', item.name)}", full


def _explicit_markers(item: pytest.Item) -> set[str]:
    """The markers `EXPLICIT_MARKERS` and `SLOW` give ``item``."""
    name, full = _names(item)
    found = {
        marker
        for pattern, markers in EXPLICIT_MARKERS.items()
        if fnmatch.fnmatchcase(name, pattern)
        for marker in markers
    }
    if name in SLOW or full in SLOW:
        found.add("slow")
    return found


#: The test files that take longest (each a minute or more of a full run on 2 cores, its
#: slowest first), run first: ``-n 2 --dist loadfile --no-loadscope-reorder`` hands files to
#: the two workers in collection order, so a long file begun last would leave one worker
#: alone at the end. The rest keep pytest's order.
SLOWEST_FILES: tuple[str, ...] = (
    "test_spark.py",
    "test_jvm_scan.py",
    "test_companion_rowlevel.py",
    "test_companion_sql.py",
    "test_companion_versions.py",
    "test_sql.py",
    "test_sql_provenance.py",
    "test_jvm_companion.py",
    "test_crash.py",
    "test_local_cluster.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by what it starts (module docstring), before ``-m`` deselects:
    ``python_source`` also on the Spark tests `WITHOUT_COMPANION` names; then, on pytest-xdist's
    workers, put the files of `SLOWEST_FILES` first (a stable sort: each file's tests stay
    together, in their order). A serial run keeps pytest's order."""
    for item in items:
        have = {m.name for m in item.iter_markers()}
        used = getattr(item, "fixturenames", ())
        wanted = {FIXTURE_MARKERS[f] for f in used if f in FIXTURE_MARKERS}
        wanted.update(_explicit_markers(item))
        if "spark" in have | wanted and _without_companion(item):
            wanted.add("python_source")
        for name in sorted(wanted - have):
            item.add_marker(name)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
        items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _root_off_sys_path() -> None:
    """Take the repository root off ``sys.path`` again once pytest has set up the root's
    package: the root holds an ``__init__.py``, and when its directory name is no valid module
    name (a clone in ``persistshard-main``, say) pytest's default import mode puts the root
    itself on ``sys.path``, which would make ``core`` importable as a top-level twin."""
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != ROOT]


@pytest.fixture(autouse=True)
def _memory_store_left_as_found():
    """Each test leaves fsspec's ``memory://`` filesystem as it found it. That store is one
    dict for the whole process, and some of its operations scan every key in it (``rm`` asks
    ``exists`` of each path it removes), so files left by earlier tests made later ones
    quadratic: the interleaving test took minutes in the full suite and seconds alone."""
    from fsspec.implementations.memory import MemoryFileSystem

    keys, dirs = set(MemoryFileSystem.store), set(MemoryFileSystem.pseudo_dirs)
    yield
    for key in set(MemoryFileSystem.store) - keys:
        MemoryFileSystem.store.pop(key, None)
    MemoryFileSystem.pseudo_dirs[:] = [
        d for d in MemoryFileSystem.pseudo_dirs if d in dirs or d == ""
    ]


os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

#: Which SparkSession the run shares: unset (or empty), the JVM companion with its session
#: catalog whenever a JDK (javac) is found, and the Python source alone when none is, except
#: under ``CI=true``, where a missing JDK fails the run at its start (CI installs one, so a
#: fallback would only hide that the companion went untested); "0" (or "false", "no"), the
#: Python source alone; any other value requires the companion (no JDK fails the run). The
#: jar is built here, a failed build fails the run. The pytest header says in one line which
#: the run uses. The companion's own tests (test_jvm_scan, test_companion_sql,
#: test_companion_rowlevel, test_companion_versions) use the shared session when it has the
#: companion and start a session of their own in a subprocess when it has not.
COMPANION_ENV = "PERSISTSHARD_TEST_COMPANION"

#: The Spark tests marked ``python_source``: those of the Python source's batch reads (read
#: options, time travel, pushdown, pruning, ``where``, views) and SQL tables, the paths the
#: companion takes over from it, as ``fnmatch`` patterns over "file::function" (as
#: `EXPLICIT_MARKERS` spells them). Writes, streams and tests that start sessions of their
#: own run once, in the companion's session (its writes and streams are the Python source's
#: own). The README's command runs them a second time without the companion:
#: ``PERSISTSHARD_TEST_COMPANION=0 pytest -m python_source``.
WITHOUT_COMPANION: tuple[str, ...] = (
    "test_spark.py::test_registered_without_register_call",
    "test_spark.py::test_round_trip_of_every_type",
    "test_spark.py::test_time_travel_across_appends",
    "test_spark.py::test_cdc_input_against_pandas_model",
    "test_spark.py::test_unsealed_rows_wait_for_upper",
    "test_spark.py::test_negative_net_diff_is_an_error",
    "test_spark.py::test_reads_stay_consistent_while_committing",
    "test_spark.py::test_key_range_partitions_consolidate_correctly",
    "test_spark.py::test_duplicate_rows_across_tasks_count_correctly",
    "test_spark.py::test_sql_*",
    "test_sql.py::*",
    "test_sql_provenance.py::*",
    "test_sqlconsensus_spark.py::test_sql_*",
    "test_sqlconsensus_spark.py::test_table_options_*",
    "test_spark_pushdown.py::*",
    "test_column_pruning.py::*",
    "test_where.py::test_the_where_option_returns_what_spark_filtering_returns",
    "test_where.py::test_a_float_column_in_where_is_refused_through_spark",
    "test_where.py::test_where_in_sql_statements_and_views",
    "test_ux_spark.py::test_hold_false_with_a_reader_id_is_refused",
    "test_ux_spark.py::test_what_the_catalog_shows_of_a_table",
    "test_jvm_companion.py::test_the_format_resolves_to_the_sessions_provider",
)


def _without_companion(item: pytest.Item) -> bool:
    """Whether `WITHOUT_COMPANION` names ``item`` (by "file::function", no parameters)."""
    name, _ = _names(item)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in WITHOUT_COMPANION)


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """In the second pass (``-m python_source``, README's full command), leave out the test
    files `WITHOUT_COMPANION` names none of: ``python_source`` marks only tests it names
    (tests/test_tiers.py checks that), so nothing else could be selected, and importing the
    whole suite's modules on each worker only to deselect them cost seconds of CPU apiece."""
    if config.getoption("markexpr", "") != "python_source":
        return None
    name = os.path.basename(str(collection_path))
    if name.startswith("test_") and name.endswith(".py"):
        named = {pattern.split("::", 1)[0] for pattern in WITHOUT_COMPANION}
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in named) or None
    return None


def _companion_session() -> tuple[bool, str]:
    """(whether this run's session gets the companion, the pytest header's line saying what
    it uses), after putting the jar and its session catalog into ``PYSPARK_SUBMIT_ARGS`` when
    it does (`COMPANION_ENV`). Raises when the companion is required (asked for, or by
    default under ``CI=true``) and cannot be had."""
    chosen = os.environ.get(COMPANION_ENV, "").strip().lower()
    if chosen in ("0", "false", "no"):
        return False, f"the Python source alone ({COMPANION_ENV}={chosen})"
    from persistshard.datasource.companion import (
        companion_jar,
        find_javac,
        session_catalog_conf,
    )

    if find_javac() is None:
        if chosen or _in_ci():
            why = f"{COMPANION_ENV}={chosen}" if chosen else "CI=true"
            raise RuntimeError(
                f"{why}: the Spark tests run with the JVM companion, but no javac was found "
                "(install a JDK, e.g. apt-get install openjdk-17-jdk-headless, or set "
                f"{COMPANION_ENV}=0 for the Python source alone)"
            )
        return False, f"the Python source alone (no javac found; {COMPANION_ENV}=unset)"
    jar = companion_jar()
    if jar is None:
        raise RuntimeError(
            f"{COMPANION_ENV}={chosen or 'unset'}: the Spark tests run with the JVM companion, "
            "but its jar could not be built (CompanionUnavailable above says why)"
        )
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {jar} {session_catalog_conf()} pyspark-shell"
    return True, f"the JVM companion ({os.path.basename(jar)}) and its session catalog"


WITH_COMPANION, SESSION_LINE = _companion_session()


def pytest_report_header(config: pytest.Config) -> str:
    """One line saying what the run's shared SparkSession uses (`COMPANION_ENV`)."""
    return f"persistshard Spark session: {SESSION_LINE}"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Give this process's SparkSession a scratch directory of its own for its warehouse
    (managed tables) instead of the working directory: with ``-n 2`` each pytest-xdist worker
    has its own session, and two sessions sharing ``./spark-warehouse`` would see each other's
    managed tables. After pytest-spark's own hook (``trylast``), which builds the
    configuration from ``spark_options`` (pyproject.toml: Spark's in-memory catalog, not the
    Hive metastore pytest-spark defaults to; tests/test_spark.py's Hive test starts its own
    sessions with Hive support)."""
    from pytest_spark.config import SparkConfigBuilder

    scratch = tempfile.mkdtemp(prefix="persistshard-spark-")
    atexit.register(shutil.rmtree, scratch, True)
    conf = SparkConfigBuilder.get()
    conf.set("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))


@pytest.fixture(scope="session")
def spark(spark_session):
    """The session-scoped SparkSession (local[2], see ``spark_options`` in pyproject.toml).

    Nothing but pytest-spark's own teardown at the end of the run may stop it: a test (or
    code under test) that stops it fails by name (`_refuse_stopping`), instead of every
    later Spark test in the process failing on a stopped context, or on a new one that
    cannot find the source, with nothing pointing at the cause."""
    spark_session.sparkContext.setLogLevel("ERROR")
    with _refuse_stopping(spark_session.sparkContext):
        yield spark_session


@contextlib.contextmanager
def _refuse_stopping(context: Any) -> Iterator[None]:
    """While open, ``SparkContext.stop`` on `context` raises instead of stopping it (other
    contexts stop as before)."""
    from pyspark import SparkContext

    original = SparkContext.stop

    def stop(self: Any) -> None:
        if self is context:
            raise RuntimeError(
                "this test stopped the suite's shared SparkSession; every later Spark test "
                "in this process would fail: stop only sessions the test built itself"
            )
        original(self)

    SparkContext.stop = stop  # type: ignore[method-assign]
    try:
        yield
    finally:
        SparkContext.stop = original  # type: ignore[method-assign]


@pytest.fixture
def has_companion_catalog(spark) -> bool:
    """Whether the run's session has the companion's session catalog (`WITH_COMPANION`): SQL
    table statements then carry the table's own location, so forms the Python source alone
    refuses land in the named table."""
    from persistshard.datasource.companion import SESSION_CATALOG, SESSION_CATALOG_KEY

    return bool(spark.conf.get(SESSION_CATALOG_KEY, "") == SESSION_CATALOG)


@pytest.fixture(scope="module")
def s3_direct(request):
    """s3fs options for a moto server on loopback with the test module's ``BUCKET``, stopped
    after the module (the fault proxies of test_fault_proxy and test_contracts_under_faults
    sit in front of it)."""
    from persistshard.conformance.s3server import moto_server

    with moto_server(request.module.BUCKET, "testing", "secret") as endpoint:
        yield {
            "key": "testing",
            "secret": "secret",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }


@pytest.fixture
def clock():
    """A settable clock (`conformance_helpers.Clock`, milliseconds): a test hands it to the
    shards it opens (``open_shard(path, clock=clock.now)``, the configuration's clock)."""
    from conformance_helpers import Clock

    return Clock()


@pytest.fixture
def process_clock(monkeypatch):
    """A settable clock put in place of this process's wall clock
    (`persistshard.core.storage.layout.now_ms`, every shard's default clock): for shards
    opened where no clock can be handed over, inside the Spark driver's code."""
    from conformance_helpers import Clock

    from persistshard.core.storage import layout

    c = Clock()
    monkeypatch.setattr(layout, "now_ms", c.now)
    return c


@pytest.fixture(scope="session")
def repo_root() -> str:
    """The repository root: the directory the package ``persistshard`` is imported from."""
    return ROOT


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _postgres_bin() -> str:
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:  # never a skip: CI installs it (.ci/run), a missing server fails the run
        raise RuntimeError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
            "apt-get install postgresql"
        )
    return os.path.dirname(found[-1])


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the session: ``initdb`` in a temporary directory (as the
    ``postgres`` user when run as root: initdb refuses root), ``pg_ctl start`` on a free port
    with its socket in that directory, one database; yields its URL, stops it at the end."""
    import pathlib
    import pwd
    import subprocess

    bindir = _postgres_bin()
    base = pathlib.Path(tempfile.mkdtemp(prefix="persistshard-pg-"))
    data = base / "data"
    run_as: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
        role = "postgres"
    else:
        role = pwd.getpwuid(os.geteuid()).pw_name
    port = _free_port()

    def run(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, capture_output=True, timeout=120)

    run(f"{bindir}/initdb", "-D", str(data), "-A", "trust", "-U", role, "--no-sync")
    run(
        f"{bindir}/pg_ctl",
        "-D",
        str(data),
        "-l",
        str(base / "log"),
        "-w",
        "-o",
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off",
        "start",
    )
    try:
        run(f"{bindir}/createdb", "-h", str(base), "-p", str(port), "-U", role, "persist")
        yield f"postgresql://{role}@127.0.0.1:{port}/persist"
    finally:
        run(f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def jdk() -> str:
    """The javac the JVM companion builds with; CI has one, so there its absence fails."""
    from persistshard.datasource import companion

    javac = companion.find_javac()
    if javac is None:
        if _in_ci():
            pytest.fail("CI=true but no javac (JAVA_HOME/bin or PATH): install a JDK 17+")
        pytest.skip("no javac on this machine: the companion's JVM tests need a JDK 17+")
    return javac


@pytest.fixture(scope="session")
def jar_cache(jdk, tmp_path_factory):
    """A cache directory holding the companion jar, built once for the run: here, as a test
    module importing a session fixture from another module gets an instance of its own."""
    from pathlib import Path

    from persistshard.datasource import companion

    cache = tmp_path_factory.mktemp("companion-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(companion.CACHE_ENV, str(cache))
        path = companion.companion_jar()
    assert path is not None and Path(path).parent == cache
    return cache
