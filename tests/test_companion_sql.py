"""persistshard as a full Spark table with the JVM companion's session catalog: LOCATION and
OPTIONS kept; CTAS, saveAsTable, insertInto, writeTo().append() and INSERT ... SELECT from a
view or another table land in the named table's shard and nowhere else (read back with the
Python API); a table without a location is refused before anything is stored or written;
DESCRIBE EXTENDED and SHOW CREATE TABLE show the location; VERSION AS OF and TIMESTAMP AS
OF read what the read option ``as_of`` reads, with persistshard's error classes.

The statements (tests/companion_sql_session.py's `collect`) run once for the module, in the
run's shared session when it has the companion, else in a session of its own built with
``ps.configure_spark`` (a JVM started for the module): the checks below are the same either
way. Without the companion these forms keep the Python source's behaviour
(tests/test_spark.py, tests/test_sql_provenance.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import companion_sql_session
import pytest
from test_jvm_companion import companion_results

from persistshard.datasource import companion

SESSION = Path(__file__).resolve().parent / "companion_sql_session.py"
APPLE, FIG, KIWI = "(1, 'apple')", "(5, 'fig')", "(6, 'kiwi')"
U = [[FIG, 1], [KIWI, 1]]  # the source table's shard, which no statement may change


@pytest.fixture(scope="module")
def session(request, spark, tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("companion-sql")
    result = companion_results(request, spark, companion_sql_session.collect, SESSION, work)
    result["work"] = str(work)
    return result


def landed(case: dict[str, Any], t: list[list[Any]]) -> None:
    assert "error" not in case, case["error"]
    assert case["shards"]["t"] == t, "the target table's shard"
    assert case["shards"]["u"] == U, "the source table's shard changed"


def test_the_session_has_the_companions_session_catalog(session):
    """(configure_spark setting it in a new session: tests/test_jvm_companion.py.)"""
    assert session["catalog"] == companion.SESSION_CATALOG


def test_create_table_keeps_location_and_options(session):
    for name in ("create_t", "create_u", "insert_values"):
        assert "error" not in session[name], session[name]["error"]
    assert session["insert_values"]["shards"]["t"] == [[APPLE, 1]], "INSERT INTO t VALUES"
    # OPTIONS (inline_bytes '0') reached the write: the row went to a part file.
    assert session["t_part_files"] == 1, "the table's OPTIONS did not reach its write"


def test_insert_select_from_a_view_and_from_a_table_lands_in_the_target(session):
    landed(session["insert_select_view"], [[APPLE, 1], [FIG, 1], [KIWI, 1]])
    landed(session["insert_select_table"], [[APPLE, 1], [FIG, 2], [KIWI, 1]])


def test_insert_into_and_write_to_append_land_in_the_target(session):
    landed(session["insert_into"], [[APPLE, 1], [FIG, 2], [KIWI, 2]])
    landed(session["write_to_append"], [[APPLE, 1], [FIG, 3], [KIWI, 3]])
    assert session["t_reads"]["value"] == [[APPLE, 1], [FIG, 3], [KIWI, 3]], "Spark reads t"


def test_ctas_and_save_as_table_land_in_their_own_location(session):
    for name, shard in (("ctas", "c"), ("save_as_table", "s")):
        case = session[name]
        assert "error" not in case, case["error"]
        assert case["shards"][shard] == U, f"{name}: the new table's shard"
        assert case["shards"]["u"] == U, f"{name}: the source table's shard changed"
        assert session[f"{name}_reads"]["value"] == U, f"{name}: Spark reads the new table"


def test_a_table_without_a_location_is_refused_and_nothing_is_written(session):
    for name in ("create_no_location", "ctas_no_location", "save_as_table_no_location"):
        error = session[name].get("error", "")
        assert error.startswith("InvalidOption: no shard location"), f"{name}: {error!r}"
        assert "LOCATION '/data/t'" in error and "CREATE TABLE" in error, error
    assert session["nowhere_tables"] == [], "a refused table is in the catalog"
    assert session["warehouse"] == [], "a refused table made a managed default location"


def test_drop_table_keeps_the_shard(session):
    assert session["drop_c"]["shards"]["c"] == U, "the dropped table's shard changed"
    tables = session["tables_after_drop"]
    assert "c" not in tables and "t" in tables, f"tables after DROP TABLE c: {tables}"


def test_describe_and_show_create_table_show_the_location(session):
    t = Path(session["work"]) / "t"
    location = dict(session["describe"])["Location"]
    assert location.endswith(str(t)) and location.startswith("file:"), location
    assert dict(session["describe"])["Provider"] == "persistshard", session["describe"]
    show = session["show_create"]
    assert f"LOCATION '{location}'" in show, show
    assert "USING persistshard" in show and "'inline_bytes' = '0'" in show, show


def test_version_as_of_is_the_as_of_option(session):
    version, option = session["version_as_of"], session["as_of_option"]
    assert version.get("value") == option.get("value"), (version, option)
    assert version["value"] == [["(0,)", 1], ["(1,)", 1]], "VERSION AS OF 1"
    bad = session["version_as_of_bad"].get("error", "")
    assert bad.startswith("InvalidOption: ") and "as_of" in bad, f"VERSION AS OF 'x': {bad!r}"
    early = session["version_before_since"].get("error", "")
    assert early.startswith("SinceViolation: "), f"VERSION AS OF before since: {early!r}"


def test_timestamp_as_of_is_the_newest_time_committed_by_then(session):
    rows = [[f"({i},)", 1] for i in range(4)]
    stamps = session["stamps"]
    assert session["timestamp_second"].get("value") == rows[:2], ("between 2nd and 3rd", stamps)
    assert session["timestamp_exact_third"].get("value") == rows[:3], ("at the 3rd", stamps)
    assert session["timestamp_future"].get("value") == rows, "an hour from now"
    error = session["timestamp_before"].get("error", "")
    assert error.startswith("SinceViolation: ") and "before the oldest commit" in error, error


# --- CTAS and REPLACE: atomic (the session catalog is a StagingTableCatalog) ---------------

OLD = [[APPLE, 1], ["(2, 'pear')", 1]]  # table r's rows before the first replace
REPLACING = (
    "replace_sql",
    "create_or_replace_sql",
    "write_to_replace",
    "write_to_create_or_replace",
    "save_as_table_overwrite",
)
CREATING = ("k_sql", "k_write_to", "k_or_replace", "k_save", "k_retention")


def new_data_commits(step: dict[str, Any]) -> list[str]:
    """The history kinds a step added to its table's shard that change contents."""
    before, after = step["before"]["history"], step["after"]["history"]
    assert after[: len(before)] == before, "the shard's history was rewritten"
    return [k for k in after[len(before) :] if k in companion_sql_session.DATA_KINDS]


def unchanged(step: dict[str, Any], name: str) -> None:
    """The step failed and left the table's catalog entry, data and history as they were."""
    assert step["before"]["table"] is not None, f"{name}: no table before"
    assert step["after"] == step["before"], f"{name}: the table changed"


def shifted(k: int) -> list[list[Any]]:
    """u's rows with ``id + k``: what ``rows(k)`` of companion_sql_session selects."""
    return [[f"({5 + k}, 'fig')", 1], [f"({6 + k}, 'kiwi')", 1]]


@pytest.mark.parametrize("form", REPLACING)
def test_a_replace_whose_query_fails_changes_nothing(session, form):
    step = session[f"{form}_failing"]
    assert "boom" in step.get("error", ""), f"{form}: {step.get('error')!r}"
    unchanged(step, form)


@pytest.mark.parametrize("form", REPLACING)
def test_a_replace_is_one_overwrite_commit_and_the_old_version_stays_readable(session, form):
    k = 10 * (REPLACING.index(form) + 1)
    step = session[form]
    assert "error" not in step, f"{form}: {step['error']}"
    before, after = step["before"], step["after"]
    assert after["shard"] == shifted(k), f"{form}: the shard's rows"
    assert after["reads"] == shifted(k), f"{form}: what Spark reads"
    assert new_data_commits(step) == ["overwrite"], f"{form}: {after['history']}"
    assert after["upper"] == before["upper"] + 1, f"{form}: more than one new time"
    assert step["previous"] == before["reads"], f"{form}: VERSION AS OF the previous time"
    assert after["table"]["location"] == before["table"]["location"], f"{form}: moved"
    assert after["table"]["provider"] == "persistshard", form
    if form == REPLACING[0]:
        assert before["reads"] == OLD


def test_a_replace_that_drops_a_column_is_refused_naming_the_table(session):
    step = session["replace_dropping_a_column"]
    error = step.get("error", "")
    assert error.startswith("InvalidOption: "), error
    assert "companion_sql_r_" in error and "item" in error, error
    unchanged(step, "replace_dropping_a_column")


def test_a_replace_that_adds_a_column_adds_it_to_the_shard(session):
    step = session["replace_adding_a_column"]
    assert "error" not in step, step["error"]
    assert step["after"]["shard"] == [["(5, 'fig', 'new')", 1], ["(6, 'kiwi', 'new')", 1]]
    assert [c[0] for c in step["after"]["table"]["columns"]] == ["id", "item", "note"]
    assert new_data_commits(step) == ["overwrite"], step["after"]["history"]
    # The previous time's rows, with the table's columns now: the new one reads as null.
    previous = [[row[:-1] + ", None)", n] for row, n in step["before"]["reads"]]
    assert step["previous"] == previous, "VERSION AS OF the previous time"


def test_a_replace_with_a_secret_in_its_options_is_refused(session):
    step = session["replace_with_a_secret"]
    error = step.get("error", "")
    assert error.startswith("InvalidOption: ") and "storage options" in error, error
    assert "hunter2" not in error, error
    unchanged(step, "replace_with_a_secret")


@pytest.mark.parametrize("form", CREATING)
def test_a_ctas_whose_query_fails_leaves_no_table_and_nothing_written(session, form):
    step = session[f"{form}_failing"]
    assert "boom" in step.get("error", ""), f"{form}: {step.get('error')!r}"
    assert step["after"]["table"] is None, f"{form}: a table is in the catalog"
    assert step["after"]["shard"] is None, f"{form}: a shard was written"


@pytest.mark.parametrize("form", CREATING)
def test_a_ctas_after_a_failed_one_creates_the_table(session, form):
    step = session[form]
    assert "error" not in step, f"{form}: {step['error']}"
    assert step["after"]["shard"] == shifted(0), form
    assert step["after"]["reads"] == shifted(0), form
    location = step["after"]["table"]["location"]
    assert location.startswith("file:") and location.endswith(f"/{form}"), location


def test_a_replace_with_a_retention_sets_it_in_its_commit_and_a_failed_one_does_not(session):
    """OPTIONS (retention ...) on a REPLACE: a failed query leaves the retention (and the rest)
    as it was; the replace that lands sets it in its one overwrite commit."""
    failed = session["replace_with_retention_failing"]
    assert "boom" in failed.get("error", ""), failed.get("error")
    unchanged(failed, "replace_with_retention_failing")
    assert failed["after"]["retention"] is None
    step = session["replace_with_retention"]
    assert "error" not in step, step["error"]
    assert new_data_commits(step) == ["overwrite"], step["after"]["history"]
    added = step["after"]["commits"][len(step["before"]["commits"]) :]
    assert [c for c in added if "append" in c or "retention" in c] == ["append_set_retention"]
    assert step["after"]["retention"] == "2 versions"


def test_a_ctas_with_a_retention_sets_it_in_its_commit(session):
    """(Its failed run leaves no table and no shard: the CREATING tests above.)"""
    step = session["k_retention"]
    assert "error" not in step, step["error"]
    assert step["after"]["commits"] == ["append_set_retention"], step["after"]["commits"]
    assert step["after"]["retention"] == "2 versions"


def test_a_create_or_replace_without_a_location_is_refused(session):
    step = session["rn"]
    error = step.get("error", "")
    assert error.startswith("InvalidOption: no shard location"), error
    assert step["after"] == {"shard": None, "table": None}


def test_a_ctas_of_another_provider_is_sparks_own(session):
    """The catalog stages only persistshard tables: another provider's CTAS creates the table,
    writes, and drops it when the write fails (here the Python source's table, which Spark
    cannot write by a CTAS): an error, and no table left."""
    step = session["k_other"]
    assert step.get("error"), "the CTAS did not fail"
    assert step["error_class"] == "AnalysisException", step  # not Spark's internal error
    assert step["after"] == {"shard": None, "table": None}
