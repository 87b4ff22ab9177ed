"""DELETE, UPDATE and MERGE INTO through the JVM companion, in a Spark session of its own
(tests/rowlevel_session.py, run once for the module): each statement commits exactly the
retractions and insertions it means (duplicates retracted as often as they occur, null
columns and null keys included) at one new time, checked against a model and read back with
the Python API; a writer committing while a statement runs makes it `UpperMismatch` with
nothing applied; a statement failing in its tasks applies nothing; neither leaves a part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_jvm_companion import jar_cache, jdk, run_session  # noqa: F401  (fixtures)

SESSION = Path(__file__).resolve().parent / "rowlevel_session.py"
STATEMENTS = ("delete", "update", "merge", "columnar delete")


@pytest.fixture(scope="module")
def cases(jar_cache, tmp_path_factory) -> dict[str, Any]:  # noqa: F811
    result = run_session(SESSION, tmp_path_factory.mktemp("rowlevel"), jar_cache)
    cases: dict[str, Any] = result["cases"]
    return cases


@pytest.mark.parametrize("name", STATEMENTS)
def test_a_statement_commits_its_changes_at_one_new_time(cases, name):
    case = cases[name]
    assert case["error"] is None
    assert case["rows"] == case["model"]
    assert case["upper_after"] == case["upper_before"] + 1
    assert case["committed"], "the statement changed nothing"
    assert case["orphans"] == 0


def test_delete_retracts_each_row_as_often_as_it_occurs(cases):
    case = cases["delete"]
    assert case["committed"] == case["retractions"]
    diffs = {d for _, d in case["committed"]}
    assert {-1, -2, -3} <= diffs  # duplicates
    assert any("None" in row for row, _ in case["committed"])  # null columns


def test_update_and_merge_retract_old_rows_and_insert_new_ones(cases):
    for name in ("update", "merge"):
        diffs = [d for _, d in cases[name]["committed"]]
        assert min(diffs) < 0 < max(diffs), name
    merged = dict(cases["merge"]["committed"])
    assert merged["(500, 'ins')"] == 1 and merged["(None, 'nullsrc')"] == 1
    assert "(3, 's3')" in merged and merged["(3, 's3')"] < 0  # matched and deleted


def test_a_table_with_a_column_list_is_deleted_through_the_columnar_scan(cases):
    plan = cases["plan"]["text"]
    assert "WriteDelta" in plan
    assert "persistshard columnar scan" in plan and "with row ids" in plan


def test_a_writer_committing_in_between_is_upper_mismatch_with_nothing_applied(cases):
    case = cases["race"]
    assert case["raced"]
    assert case["error"].startswith("UpperMismatch: expected upper 1, shard upper is 2")
    assert case["rows"] == case["model"]  # the other writer's row, nothing deleted
    assert case["upper_after"] == case["upper_before"] + 1
    assert case["committed"] == [["(1000, 'racer')", 1]]
    assert case["orphans"] == 0


def test_a_statement_failing_in_its_tasks_writes_nothing(cases):
    case = cases["failure"]
    assert "boom at 29" in case["error"]
    assert case["rows"] == case["model"]
    assert case["upper_after"] == case["upper_before"]
    assert case["orphans"] == 0
