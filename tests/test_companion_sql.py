"""persistshard as a full Spark table with the JVM companion's session catalog, in a Spark
session of its own (tests/companion_sql_session.py, run once for the module): LOCATION and
OPTIONS kept; CTAS, saveAsTable, insertInto, writeTo().append() and INSERT ... SELECT from a
view or another table land in the named table's shard and nowhere else (read back with the
Python API); a table without a location is refused before anything is stored or written;
DESCRIBE EXTENDED and SHOW CREATE TABLE show the location; VERSION AS OF and TIMESTAMP AS
OF read what the read option ``as_of`` reads, with persistshard's error classes.

Without the companion these forms keep the Python source's behaviour (tests/test_spark.py,
tests/test_sql_provenance.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_jvm_companion import jar_cache, jdk, run_session  # noqa: F401  (fixtures)

from persistshard.datasource import companion

SESSION = Path(__file__).resolve().parent / "companion_sql_session.py"
APPLE, FIG, KIWI = "(1, 'apple')", "(5, 'fig')", "(6, 'kiwi')"
U = [[FIG, 1], [KIWI, 1]]  # the source table's shard, which no statement may change


@pytest.fixture(scope="module")
def session(jar_cache, tmp_path_factory) -> dict[str, Any]:  # noqa: F811
    work = tmp_path_factory.mktemp("companion-sql")
    result = run_session(SESSION, work, jar_cache)
    result["work"] = str(work)
    return result


def landed(case: dict[str, Any], t: list[list[Any]]) -> None:
    assert "error" not in case, case["error"]
    assert case["shards"]["t"] == t
    assert case["shards"]["u"] == U


def test_configure_spark_sets_the_session_catalog(session):
    assert session["catalog"] == companion.SESSION_CATALOG


def test_create_table_keeps_location_and_options(session):
    for name in ("create_t", "create_u", "insert_values"):
        assert "error" not in session[name], session[name]["error"]
    assert session["insert_values"]["shards"]["t"] == [[APPLE, 1]]
    # OPTIONS (inline_bytes '0') reached the write: the row went to a part file.
    assert session["t_part_files"] == 1


def test_insert_select_from_a_view_and_from_a_table_lands_in_the_target(session):
    landed(session["insert_select_view"], [[APPLE, 1], [FIG, 1], [KIWI, 1]])
    landed(session["insert_select_table"], [[APPLE, 1], [FIG, 2], [KIWI, 1]])


def test_insert_into_and_write_to_append_land_in_the_target(session):
    landed(session["insert_into"], [[APPLE, 1], [FIG, 2], [KIWI, 2]])
    landed(session["write_to_append"], [[APPLE, 1], [FIG, 3], [KIWI, 3]])
    assert session["t_reads"]["value"] == [[APPLE, 1], [FIG, 3], [KIWI, 3]]


def test_ctas_and_save_as_table_land_in_their_own_location(session):
    for name, shard in (("ctas", "c"), ("save_as_table", "s")):
        case = session[name]
        assert "error" not in case, case["error"]
        assert case["shards"][shard] == U
        assert case["shards"]["u"] == U
        assert session[f"{name}_reads"]["value"] == U


def test_a_table_without_a_location_is_refused_and_nothing_is_written(session):
    for name in ("create_no_location", "ctas_no_location", "save_as_table_no_location"):
        error = session[name].get("error", "")
        assert error.startswith("InvalidOption: no shard location"), name
        assert "LOCATION '/data/t'" in error and "CREATE TABLE" in error
    assert session["nowhere_tables"] == []  # nothing stored in the catalog
    assert session["warehouse"] == []  # no managed default location made


def test_drop_table_keeps_the_shard(session):
    assert session["drop_c"]["shards"]["c"] == U
    assert "c" not in session["tables_after_drop"] and "t" in session["tables_after_drop"]


def test_describe_and_show_create_table_show_the_location(session):
    t = Path(session["work"]) / "t"
    location = dict(session["describe"])["Location"]
    assert location.endswith(str(t)) and location.startswith("file:")
    assert dict(session["describe"])["Provider"] == "persistshard"
    show = session["show_create"]
    assert f"LOCATION '{location}'" in show
    assert "USING persistshard" in show and "'inline_bytes' = '0'" in show


def test_version_as_of_is_the_as_of_option(session):
    assert session["version_as_of"]["value"] == session["as_of_option"]["value"]
    assert session["version_as_of"]["value"] == [["(0,)", 1], ["(1,)", 1]]
    assert session["version_as_of_bad"]["error"].startswith("InvalidOption: ")
    assert "as_of" in session["version_as_of_bad"]["error"]
    assert session["version_before_since"]["error"].startswith("SinceViolation: ")


def test_timestamp_as_of_is_the_newest_time_committed_by_then(session):
    rows = [[f"({i},)", 1] for i in range(4)]
    assert session["timestamp_second"]["value"] == rows[:2]
    assert session["timestamp_exact_third"]["value"] == rows[:3]
    assert session["timestamp_future"]["value"] == rows
    error = session["timestamp_before"]["error"]
    assert error.startswith("SinceViolation: ") and "before the oldest commit" in error
