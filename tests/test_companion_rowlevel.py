"""DELETE, UPDATE and MERGE INTO through the JVM companion: each statement commits exactly the
retractions and insertions it means (duplicates retracted as often as they occur, null
columns and null keys included) at one new time, checked against a model and read back with
the Python API; a writer committing while a statement runs makes it `UpperMismatch` with
nothing applied; a statement failing in its tasks applies nothing; neither leaves a part.
Tasks hand their rows to pooled ``bridge writes`` workers: consecutive statements reuse the
same processes, also after a write failing in Python; a task Spark aborts ends its worker.

Where the statements run (`rowlevel_session.collect`, once for the module): the run's shared
session if it has the companion; without it, a session of the script's own started with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import rowlevel_session
from test_jvm_companion import companion_results

SESSION = Path(__file__).resolve().parent / "rowlevel_session.py"
STATEMENTS = ("delete", "update", "merge", "columnar delete")


@pytest.fixture(scope="module")
def cases(request, spark, tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rowlevel")
    result = companion_results(request, spark, rowlevel_session.collect, SESSION, work)
    cases: dict[str, Any] = result["cases"]
    return cases


POOLED = ("pool delete", "pool merge", "ns delete", "ns merge", "pool after abort")


@pytest.mark.parametrize("name", STATEMENTS + POOLED)
def test_a_statement_commits_its_changes_at_one_new_time(cases, name):
    case = cases[name]
    assert case["error"] is None, f"{name} failed: {case['error']}"
    assert case["rows"] == case["model"], f"{name}: the shard holds what the model does not"
    assert case["upper_after"] == case["upper_before"] + 1, f"{name}: not one new time"
    assert case["committed"], f"{name} changed nothing"
    assert case["orphans"] == 0, f"{name} left {case['orphans']} unreferenced parts"


def test_delete_retracts_each_row_as_often_as_it_occurs(cases):
    case = cases["delete"]
    assert case["committed"] == case["retractions"], "the DELETE's updates are not the model's"
    diffs = {d for _, d in case["committed"]}
    assert {-1, -2, -3} <= diffs, f"duplicates not retracted as often as they occur: {diffs}"
    nulls = any("None" in row for row, _ in case["committed"])
    assert nulls, "no row with a null column retracted"


def test_update_and_merge_retract_old_rows_and_insert_new_ones(cases):
    for name in ("update", "merge"):
        diffs = [d for _, d in cases[name]["committed"]]
        assert min(diffs) < 0 < max(diffs), f"{name} committed {diffs}"
    merged = dict(cases["merge"]["committed"])
    assert merged.get("(500, 'ins')") == 1, "MERGE did not insert the unmatched row"
    assert merged.get("(None, 'nullsrc')") == 1, "a null key matched, or was not inserted"
    assert merged.get("(3, 's3')", 0) < 0, "the matched row to delete was not retracted"


def test_a_table_with_a_column_list_is_deleted_through_the_columnar_scan(cases):
    plan = cases["plan"]["text"]
    assert "WriteDelta" in plan, plan
    assert "persistshard columnar scan" in plan and "with row ids" in plan, plan


def test_a_writer_committing_in_between_is_upper_mismatch_with_nothing_applied(cases):
    case = cases["race"]
    assert case["raced"], "the racing writer never ran"
    assert (case["error"] or "").startswith("UpperMismatch: expected upper 1, shard upper is 2"), (
        f"the DELETE raced by a writer ended in {case['error']!r}"
    )
    assert case["rows"] == case["model"], "rows were deleted, or the racer's row is missing"
    assert case["upper_after"] == case["upper_before"] + 1, "more than the racer committed"
    assert case["committed"] == [["(1000, 'racer')", 1]], "more than the racer committed"
    assert case["orphans"] == 0, f"{case['orphans']} unreferenced parts left"


def test_a_statement_failing_in_its_tasks_writes_nothing(cases):
    case = cases["failure"]
    assert "boom at 29" in (case["error"] or ""), f"the failing DELETE ended in {case['error']!r}"
    assert case["rows"] == case["model"], "the failed statement changed the shard"
    assert case["upper_after"] == case["upper_before"], "the failed statement committed"
    assert case["orphans"] == 0, f"{case['orphans']} unreferenced parts left"


def test_statements_tasks_reuse_the_jvms_write_workers(cases):
    """A task's rows go to a long-lived ``bridge writes`` worker from the JVM's pool: the next
    statements (a MERGE after a DELETE, a DELETE and a MERGE on a shard storing nanoseconds,
    a DELETE whose write failed in Python with the error named as the Python source names
    it) start no interpreter; a task Spark aborts after it handed its worker rows ends that
    worker (never reused), starts no other, and a statement after it commits exactly its
    changes, the aborted one nothing."""
    pool = cast(dict[str, Any], cases["pool"])
    assert pool["first"], "no bridge writes worker served the DELETE"
    assert pool["merge"] == pool["first"], f"the MERGE started interpreters: {pool}"
    failed = cases["pool python failure"]
    assert (failed["error"] or "").startswith("InvalidUpdates: "), failed["error"]
    assert (
        "retyped: t is timestamp[us, tz=UTC], the shard has timestamp[s, tz=UTC]"
        in (failed["error"])
    ), failed["error"]
    assert failed["rows"] == failed["model"] and failed["upper_after"] == failed["upper_before"]
    assert failed["orphans"] == 0, f"{failed['orphans']} unreferenced parts left"
    assert pool["failed"] == pool["first"], f"the failed write's worker was not kept: {pool}"
    aborted = cases["pool abort"]
    assert "abort at the task's row 15000" in (aborted["error"] or ""), aborted["error"]
    assert aborted["rows"] == aborted["model"], "the aborted statement changed the shard"
    assert aborted["upper_after"] == aborted["upper_before"], "the aborted statement committed"
    assert aborted["orphans"] == 0, f"{aborted['orphans']} unreferenced parts left"
    ended = set(pool["first"]) - set(pool["aborted"])
    assert ended and set(pool["aborted"]) < set(pool["first"]), f"aborted task's worker: {pool}"
    assert not ended & set(pool["after"]), f"an ended worker served again: {pool}"


def test_statements_on_a_nanosecond_shard_keep_its_stored_values(cases):
    """Spark's rows hold microseconds; a shard written from pandas stores nanoseconds. A DELETE
    and a MERGE on it write Spark's rows cast to nanoseconds (core/write/validate.widens): the
    rows they leave and insert hold exactly the stored and the inserted instants."""
    assert cases["ns delete"]["stamps"] == [[2, 20_000, 1], [3, 30_000, 1]]
    assert cases["ns merge"]["stamps"] == [[2, 20_000, 1], [3, 30_000, 1], [9, 8_000, 1]]
    assert sorted(cases["ns merge"]["committed"]) == [
        ["(2, 'b')", -1],
        ["(2, 'm2')", 1],
        ["(9, 'm9')", 1],
    ]


def test_a_statement_on_nanoseconds_spark_cannot_see_changes_nothing(cases):
    """A stored instant with a fraction of a microsecond cannot be a Spark row: reading it
    through Spark fails (the read's cast would lose data), so a DELETE never retracts a row
    that differs from the stored one; it fails and the shard is as it was."""
    case = cases["ns sub-microsecond"]
    assert case["error"] is not None, "the DELETE ran on rows Spark cannot hold"
    assert case["upper_after"] == case["upper_before"] and case["rows"] == case["model"]
    assert case["stamps"] == [[1, 10_001, 1], [2, 20_000, 1]]
    assert case["orphans"] == 0
