"""The JVM companion's table provider: every read through the companion returns what the
Python source returns (the same rows with the same multiplicities, or an error of the same
class), across read options, shards that need consolidation, time filters, a column added
later, nested columns over many chunks, and parts of every format version; snapshot reads
are the companion's columnar scan, the other reads the Python source's scan; writes,
overwrites and streams through the companion's name work.

The reads (tests/jvm_scan_session.py's `collect`) run once for the module, in the run's
shared session when it has the companion, else in a session of its own with it (a JVM
started for the module): the checks below are the same either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jvm_scan_session
import pytest
from test_jvm_companion import COMPANION_PROVIDER, companion_results

SESSION = Path(__file__).resolve().parent / "jvm_scan_session.py"
COLUMNAR = "persistshard columnar scan"
#: Reads that are not plain snapshots: the Python source's scan, delegated.
DELEGATED = ("with_diff", "updates", "where")


@pytest.fixture(scope="module")
def session(request, spark, tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("jvm-scan")
    return companion_results(request, spark, jvm_scan_session.collect, SESSION, work)


def test_the_format_resolves_to_the_companion(session):
    assert session["provider"] == COMPANION_PROVIDER, (
        f"the session that read resolves 'persistshard' to {session['provider']}"
    )


def test_every_case_was_read(session):
    assert sorted(session["cases"]) == sorted(jvm_scan_session.CASES)


@pytest.mark.parametrize("name", jvm_scan_session.CASES)
def test_a_read_through_the_companion_equals_the_python_sources(session, name):
    case = session["cases"][name]
    assert case["companion"] == case["python"], (
        f"{name}: the companion read\n{json.dumps(case['companion'])[:2000]}\n"
        f"the Python source\n{json.dumps(case['python'])[:2000]}"
    )


def test_the_comparison_sees_rows_repetitions_and_errors_of_several_classes(session):
    """The equality above has teeth: the snapshots read rows, some rows occur more than
    once, and the errors compared are of several classes."""
    cases = session["cases"]
    no_rows = [
        n
        for n, c in cases.items()
        if n.endswith(": snapshot") and not n.startswith("missing") and "rows" not in c["python"]
    ]
    assert not no_rows, f"snapshots without rows: {no_rows}"
    counts = [count for _, count in cases["retractions: snapshot"]["python"]["rows"]]
    assert any(count > 1 for count in counts), "no row of the retractions occurs twice"
    errors = {c["python"]["error"].split(":")[0] for c in cases.values() if "error" in c["python"]}
    assert {"NotSealed", "InvalidOption", "NoShard"} <= errors, errors


def test_snapshot_reads_are_columnar_and_other_reads_delegated(session):
    wrong = {}
    for name, case in session["cases"].items():
        if "error" in case["companion"]:
            continue
        label = name.split(": ", 1)[1]
        if (COLUMNAR in case["plan"]) != (label not in DELEGATED):
            wrong[name] = case["plan"]
    assert not wrong, f"columnar expected for snapshots only, plans: {json.dumps(wrong)[:4000]}"


def test_filters_skip_chunks_within_their_own_scan(session):
    plan = session["cases"]["appends: filtered"]["plan"]
    assert "skipping chunks by" in plan and "LessThan(id,120)" in plan, plan
    unfiltered = session["cases"]["appends: snapshot"]["plan"]
    assert "skipping" not in unfiltered, f"an unfiltered scan skips chunks: {unfiltered}"


def test_writes_overwrites_and_streams_through_the_companion(session):
    assert session["overwrite"] == list(range(5, 12)), "the overwrite"
    assert session["stream"] == [[i, 1] for i in range(5, 12)], "the stream's output"  # JSON pairs


def test_the_optimizer_sees_the_stored_bytes_scaled_to_the_scans_columns(session):
    """A scan of every column reports the parts' stored bytes (each part once); a scan of one
    column of nine a share of them, as Spark scales a pruned file scan (its broadcast joins
    follow these figures)."""
    sizes = session["optimizer_bytes"]
    assert sizes["all"] == sizes["stored"], sizes
    assert 0 < sizes["id"] < sizes["all"] / 4, sizes


def test_partitions_read_by_python_reuse_the_jvms_workers(session):
    """A partition the Python source reads for the companion is served by a long-lived
    ``bridge reads`` worker from the JVM's pool: reading again starts no interpreter, a read
    that failed in Python (its error named as the Python source names it) gives its worker
    back, and a read abandoned early (``LIMIT 1``) ends its worker, after which reads still
    answer exactly."""
    w = session["workers"]
    want = session["cases"]["retractions: snapshot"]["python"]["rows"]
    assert w["rows"] == want and w["again"] == want and w["after_limited"] == want
    assert w["after_first"], "no bridge reads worker served the partitions read by Python"
    assert w["after_again"] == w["after_first"], "the second read started interpreters"
    assert w["failed"]["error"].startswith("NegativeDiff: "), w["failed"]
    assert w["after_failed"] == w["after_first"], "the failed read's worker was not kept"
    assert w["limited"] == 1
    assert w["workers_at_end"], w


def test_a_query_asks_the_bridge_once_for_the_schema_and_once_for_the_plan(session):
    """The companion's round trips to Python per query: ``load`` asks the driver's bridge for
    the schema (no Spark Python worker), the scan for its plan, once each, whether the query
    reads one column or all; a load that fails asks once and plans nothing, and fails as
    Spark's Python data source would (an ``AnalysisException`` naming the persistshard
    class)."""
    q = session["per_query"]
    assert q["sum"] == {"schema": 1, "plan": 1}, q
    assert q["full"] == {"schema": 1, "plan": 1}, q
    assert q["missing"] == {"schema": 1, "plan": 0}, q
    assert q["missing_error"]["class"] == "AnalysisException", q["missing_error"]
    assert "NoShard: no shard at" in q["missing_error"]["text"], q["missing_error"]


def test_each_query_reads_the_shards_state_afresh(session):
    """Rows another process appends between two queries of one loaded frame are in the
    second query's answer, and in a new load's: nothing of a shard's state is kept across
    queries."""
    assert session["per_query"]["counts"] == [100, 102, 102]
