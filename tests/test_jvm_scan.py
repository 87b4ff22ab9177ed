"""The JVM companion's table provider in a Spark session of its own (tests/jvm_scan_session.py,
run once for the module): every read through the companion returns what the Python source
returns (the same rows with the same multiplicities, or an error of the same class), across
read options, shards that need consolidation, time filters, a column added later, and parts
of every format version; snapshot reads are the companion's columnar scan, the other reads
the Python source's scan; writes, overwrites and streams through the companion's name work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_jvm_companion import jar_cache, jdk, run_session  # noqa: F401  (fixtures)

SESSION = Path(__file__).resolve().parent / "jvm_scan_session.py"
COLUMNAR = "persistshard columnar scan"
#: Reads that are not plain snapshots: the Python source's scan, delegated.
DELEGATED = ("with_diff", "updates", "where")


@pytest.fixture(scope="module")
def session(jar_cache, tmp_path_factory) -> dict[str, Any]:  # noqa: F811
    return run_session(SESSION, tmp_path_factory.mktemp("jvm-scan"), jar_cache)


def test_the_format_resolves_to_the_companion(session):
    assert session["provider"] == "persistshard.companion.CompanionProvider"


def test_every_read_equals_the_python_sources(session):
    cases = session["cases"]
    assert len(cases) >= 25
    differ = {
        name: (case["companion"], case["python"])
        for name, case in cases.items()
        if case["companion"] != case["python"]
    }
    assert not differ, json.dumps(differ, indent=1)[:5000]
    # The comparison has teeth: rows, repetitions and errors of several classes.
    assert all(
        "rows" in c["python"]
        for n, c in cases.items()
        if n.endswith(": snapshot") and not n.startswith("missing")
    )
    assert any(count > 1 for _, count in cases["retractions: snapshot"]["python"]["rows"])
    errors = {c["python"]["error"].split(":")[0] for c in cases.values() if "error" in c["python"]}
    assert {"NotSealed", "InvalidOption", "NoShard"} <= errors


def test_snapshot_reads_are_columnar_and_other_reads_delegated(session):
    for name, case in session["cases"].items():
        if "error" in case["companion"]:
            continue
        label = name.split(": ", 1)[1]
        columnar = COLUMNAR in case["plan"]
        assert columnar == (label not in DELEGATED), (name, case["plan"])


def test_filters_skip_chunks_within_their_own_scan(session):
    plan = session["cases"]["appends: filtered"]["plan"]
    assert "skipping chunks by" in plan and "LessThan(id,120)" in plan
    unfiltered = session["cases"]["appends: snapshot"]["plan"]
    assert "skipping" not in unfiltered


def test_writes_overwrites_and_streams_through_the_companion(session):
    assert session["overwrite"] == list(range(5, 12))
    assert session["stream"] == [[i, 1] for i in range(5, 12)]  # JSON pairs


def test_the_optimizer_sees_the_stored_bytes_scaled_to_the_scans_columns(session):
    """A scan of every column reports the parts' stored bytes (each part once); a scan of one
    column of nine a share of them, as Spark scales a pruned file scan (its broadcast joins
    follow these figures)."""
    sizes = session["optimizer_bytes"]
    assert sizes["all"] == sizes["stored"]
    assert 0 < sizes["id"] < sizes["all"] / 4
