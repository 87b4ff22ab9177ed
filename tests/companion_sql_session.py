"""The statements of tests/test_companion_sql.py: persistshard SQL tables driven through every
statement form, in a Spark session with the JVM companion and its session catalog.

`collect` runs them in a given session: the run's shared one when it has the companion
(tests/conftest.py), else this module's own (``python tests/companion_sql_session.py
WORKDIR`` with the companion jar's cache in ``PERSISTSHARD_COMPANION_CACHE``: a JVM of its
own, as ``spark.jars`` and the session catalog apply only when a session starts, built with
``ps.configure_spark``), which prints one line ``RESULT <json>``. Either way the result is,
per case, what the shards hold afterwards (read with the Python API, as sorted
``[repr(row), diff]`` pairs), the rows Spark read, or the error text; tables are named by
their short names (``t``, ``u``, ...).
"""

from __future__ import annotations

import functools
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

#: persistshard's error classes a case may end in (the first line naming one is kept).
ERRORS = ("SinceViolation", "InvalidOption", "NoShard", "NotSealed", "UpperMismatch")


def error_text(e: BaseException) -> str:
    text = str(e)
    for line in text.splitlines():
        for name in ERRORS:
            if f"{name}: " in line:
                return line[line.index(f"{name}: ") :]
    return text.splitlines()[0] if text else type(e).__name__


#: The tables `_replacing` creates (or tries to): ``r``, replaced by every form in turn; the
#: others, created by a CTAS form (or a CREATE OR REPLACE of no table) that fails, then
#: succeeds (``k_retention``: a CTAS with OPTIONS (retention ...)); ``rn``, a CREATE OR
#: REPLACE without a location; ``k_other``, a CTAS of another provider (the Python source
#: under another name), which the catalog does not stage.
REPLACE_TABLES = (
    "r",
    "k_sql",
    "k_write_to",
    "k_or_replace",
    "k_save",
    "k_retention",
    "rn",
    "k_other",
)
#: Shard history kinds that change a shard's contents (the rest is maintenance and holds).
DATA_KINDS = frozenset({"append", "overwrite", "upsert", "stream append", "seal"})

#: The tables `collect` creates (or tries to), by short name.
TABLES = ("t", "u", "c", "s", "tt", "nowhere", "nowhere2", "nowhere3", *REPLACE_TABLES)


@contextmanager
def session_conf(spark: Any, key: str, value: str) -> Iterator[None]:
    """``spark``'s SQL conf ``key`` set to ``value`` within, then as it was (unset if it was)."""
    was = spark.conf.get(key) if spark._jsparkSession.sessionState().conf().contains(key) else None
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if was is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, was)


def collect(spark: Any, work: Path) -> dict[str, Any]:
    """Run the statements in ``spark`` (a session with the companion's session catalog) on
    shards under ``work``. The session is left as found: its tables and view have names of
    this call's own (``companion_sql_<short>_<tag>``) and are dropped at the end (the shards
    stay in ``work``); the session time zone is UTC within (``TIMESTAMP AS OF`` literals)."""
    tag = uuid.uuid4().hex[:8]
    names = {short: f"companion_sql_{short}_{tag}" for short in (*TABLES, "uv")}
    try:
        with session_conf(spark, "spark.sql.session.timeZone", "UTC"):
            return _statements(spark, work, names)
    finally:
        spark.catalog.dropTempView(names["uv"])
        for short in TABLES:
            spark.sql(f"DROP TABLE IF EXISTS {names[short]}")


def _statements(spark: Any, work: Path, n: dict[str, str]) -> dict[str, Any]:
    import persistshard as ps

    out: dict[str, Any] = {
        "catalog": spark.conf.get("spark.sql.catalog.spark_catalog"),
    }
    shorts = {name: short for short, name in n.items()}
    warehouse = Path(urlparse(spark.conf.get("spark.sql.warehouse.dir")).path)

    def stored() -> set[str]:
        return {p.name for p in warehouse.iterdir()} if warehouse.exists() else set()

    before = stored()

    def ours(rows: Any) -> list[str]:
        """The short names of this call's tables among ``SHOW TABLES``'s rows."""
        return sorted(shorts[r.tableName] for r in rows if r.tableName in shorts)

    def shard_rows(loc: str) -> Any:
        if not (Path(loc) / "consensus").exists():
            return None  # nothing was ever written there
        snap = ps.open_shard(loc).snapshot()
        counts = Counter(
            {
                repr(tuple(v for k, v in r.items() if k != "_diff")): r["_diff"]
                for r in snap.to_pylist()
            }
        )
        return sorted([k, v] for k, v in counts.items())

    def spark_rows(df: Any) -> list[list[Any]]:
        counts = Counter(repr(tuple(r)) for r in df.collect())
        return [[k, v] for k, v in sorted(counts.items())]

    def case(name: str, run: Callable[[], Any], *shards: str) -> None:
        result: dict[str, Any] = {}
        try:
            value = run()
            if value is not None:
                result["value"] = value
        except Exception as e:
            result["error"] = error_text(e)
        result["shards"] = {Path(s).name: shard_rows(s) for s in shards}
        out[name] = result

    def loc(name: str) -> str:
        return str(work / name)

    def sql(statement: str) -> Callable[[], None]:
        """Runs ``statement`` to its end when called."""
        return lambda: spark.sql(statement).collect() and None

    def query(statement: str) -> Callable[[], list[list[Any]]]:
        """The rows of ``statement`` when called."""
        return lambda: spark_rows(spark.sql(statement))

    t, u, c, tt, uv = n["t"], n["u"], n["c"], n["tt"], n["uv"]
    cols = "id BIGINT, item STRING"
    # The target t (a column list, LOCATION and OPTIONS) and the source u (no column list).
    t_options = "OPTIONS (inline_bytes '0')"
    case(
        "create_t",
        sql(f"CREATE TABLE {t} ({cols}) USING persistshard LOCATION '{loc('t')}' {t_options}"),
    )
    u_options = f"OPTIONS (columns '{cols}')"
    case("create_u", sql(f"CREATE TABLE {u} USING persistshard LOCATION '{loc('u')}' {u_options}"))
    case("insert_values", sql(f"INSERT INTO {t} VALUES (1, 'apple')"), loc("t"))
    out["t_part_files"] = len(list((work / "t").glob("parts/**/*.part")))
    spark.sql(f"INSERT INTO {u} VALUES (5, 'fig'), (6, 'kiwi')")
    spark.table(u).createOrReplaceTempView(uv)

    # Each form moves u's rows (or t's) into the table it names; u never changes.
    case("insert_select_view", sql(f"INSERT INTO {t} SELECT * FROM {uv}"), loc("t"), loc("u"))
    case(
        "insert_select_table",
        sql(f"INSERT INTO {t} SELECT * FROM {u} WHERE id = 5"),
        loc("t"),
        loc("u"),
    )
    case(
        "insert_into",
        lambda: spark.table(u).filter("id = 6").write.insertInto(t),
        loc("t"),
        loc("u"),
    )
    case("write_to_append", lambda: spark.table(u).writeTo(t).append(), loc("t"), loc("u"))
    ctas = f"CREATE TABLE {c} USING persistshard LOCATION '{loc('c')}' AS SELECT * FROM {u}"
    case("ctas", sql(ctas), loc("c"), loc("u"))
    case("ctas_reads", lambda: spark_rows(spark.table(c)))
    case(
        "save_as_table",
        lambda: (
            spark.table(u).write.format("persistshard").option("path", loc("s")).saveAsTable(n["s"])
        ),
        loc("s"),
        loc("u"),
    )
    case("save_as_table_reads", lambda: spark_rows(spark.table(n["s"])))
    case("t_reads", lambda: spark_rows(spark.table(t)))

    # No location anywhere: refused before anything is stored or written.
    case("create_no_location", sql(f"CREATE TABLE {n['nowhere']} (id BIGINT) USING persistshard"))
    case(
        "ctas_no_location",
        sql(f"CREATE TABLE {n['nowhere2']} USING persistshard AS SELECT * FROM {u}"),
    )
    case(
        "save_as_table_no_location",
        lambda: spark.table(u).write.format("persistshard").saveAsTable(n["nowhere3"]),
    )
    out["nowhere_tables"] = [
        short for short in ours(spark.sql("SHOW TABLES").collect()) if short.startswith("nowhere")
    ]
    out["warehouse"] = sorted(stored() - before)  # what the refused statements made there

    # DESCRIBE EXTENDED and SHOW CREATE TABLE show the location (and the options).
    out["describe"] = [
        [r[0], r[1]]
        for r in spark.sql(f"DESCRIBE TABLE EXTENDED {t}").collect()
        if r[0] in ("Location", "Provider")
    ]
    out["show_create"] = spark.sql(f"SHOW CREATE TABLE {t}").collect()[0][0]

    # DROP TABLE forgets an external table; its shard stays.
    case("drop_c", sql(f"DROP TABLE {c}"), loc("c"))
    out["tables_after_drop"] = ours(spark.sql("SHOW TABLES").collect())

    # Time travel: commits at shard times 0..3, each recorded at its own wall-clock time.
    shard = ps.open_shard(loc("tt"))
    for i in range(4):
        shard.append(pa.table({"id": [i], "_time": [i], "_diff": [1]}), new_upper=i + 1)
        time.sleep(0.05)
    spark.sql(f"CREATE TABLE {tt} USING persistshard LOCATION '{loc('tt')}'")
    case("version_as_of", query(f"SELECT * FROM {tt} VERSION AS OF 1"))
    case(
        "as_of_option",
        lambda: spark_rows(spark.read.format("persistshard").option("as_of", 1).load(loc("tt"))),
    )
    case("version_as_of_bad", query(f"SELECT * FROM {tt} VERSION AS OF 'x'"))

    def at(ms: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"

    stamps = [h["at_ms"] for h in shard.history()]
    out["stamps"] = stamps
    for name, ms in (
        ("timestamp_second", stamps[1] + 1),  # after the second commit, before the third
        ("timestamp_exact_third", stamps[2]),  # at the third commit's recorded time
        ("timestamp_before", stamps[0] - 60_000),
        ("timestamp_future", int(time.time() * 1000) + 3_600_000),
    ):
        case(name, query(f"SELECT * FROM {tt} TIMESTAMP AS OF '{at(ms)}'"))

    # Compacted history: a version before since is SinceViolation, as with the read option.
    shard.advance_since(2)
    case("version_before_since", query(f"SELECT * FROM {tt} VERSION AS OF 0"))
    out.update(_replacing(spark, work, n, shard_rows, spark_rows))
    return out


def _replacing(
    spark: Any,
    work: Path,
    n: dict[str, str],
    shard_rows: Callable[[str], Any],
    spark_rows: Callable[[Any], list[list[Any]]],
) -> dict[str, Any]:
    """CTAS and REPLACE in every form, each run once with a query that fails in its tasks
    (``raise_error`` on the rows of ``u``) and once with one that succeeds. A step's result:
    its error, and the table's ``state`` after it (`state`); a replace's step also the state
    before and what ``VERSION AS OF`` the previous time reads after it."""
    import persistshard as ps

    out: dict[str, Any] = {}
    u, r = n["u"], n["r"]
    failing = f"SELECT id, IF(id > 0, CAST(raise_error('boom') AS STRING), item) AS item FROM {u}"

    def loc(short: str) -> str:
        return str(work / short)

    def state(short: str) -> dict[str, Any]:
        """The catalog's entry for table ``short`` (location, provider, columns), what Spark
        reads from it, what its shard holds, the shard's history (kinds and commit kinds),
        and its retention."""
        found: dict[str, Any] = {"shard": shard_rows(loc(short))}
        if found["shard"] is not None:
            history = ps.open_shard(loc(short)).history()
            found["history"] = [h["kind"] for h in history]
            found["commits"] = [h["commit"] for h in history]
            found["upper"] = ps.open_shard(loc(short)).upper
            kept = ps.open_shard(loc(short)).inspect.retention()
            found["retention"] = kept.describe() if kept is not None else None
        if not spark.catalog.tableExists(n[short]):
            found["table"] = None
            return found
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {n[short]}").collect()
        described = {x[0]: x[1] for x in rows}
        found["table"] = {
            "location": described.get("Location"),
            "provider": described.get("Provider"),
            "columns": [[c.name, c.dataType] for c in spark.catalog.listColumns(n[short])],
        }
        found["reads"] = spark_rows(spark.table(n[short]))
        return found

    def step(name: str, short: str, run: Callable[[], Any]) -> None:
        before = state(short)
        result: dict[str, Any] = {"before": before}
        try:
            run()
        except Exception as e:
            result["error"] = error_text(e)
            result["error_class"] = type(e).__name__
        result["after"] = state(short)
        if before.get("upper"):
            previous = before["upper"] - 1
            try:
                result["previous"] = spark_rows(
                    spark.sql(f"SELECT * FROM {n[short]} VERSION AS OF {previous}")
                )
            except Exception as e:
                result["previous"] = error_text(e)
        out[name] = result

    def sql(statement: str) -> Callable[[], None]:
        return lambda: spark.sql(statement).collect() and None

    def rows(k: int) -> str:
        return f"SELECT id + {k} AS id, item FROM {u}"

    cols = "id BIGINT, item STRING"
    spark.sql(f"CREATE TABLE {r} ({cols}) USING persistshard LOCATION '{loc('r')}'")
    spark.sql(f"INSERT INTO {r} VALUES (1, 'apple'), (2, 'pear')")

    # Every replacing form, failing then succeeding, on r: each success is rows(k).
    using = f"USING persistshard LOCATION '{loc('r')}'"

    def replace_sql(q: str) -> None:
        spark.sql(f"REPLACE TABLE {r} {using} AS {q}").collect()

    def create_or_replace_sql(q: str) -> None:
        spark.sql(f"CREATE OR REPLACE TABLE {r} {using} AS {q}").collect()

    def write_to_replace(q: str) -> None:
        spark.sql(q).writeTo(r).using("persistshard").replace()

    def write_to_create_or_replace(q: str) -> None:
        spark.sql(q).writeTo(r).using("persistshard").createOrReplace()

    def save_as_table_overwrite(q: str) -> None:
        spark.sql(q).write.format("persistshard").mode("overwrite").saveAsTable(r)

    forms = (
        replace_sql,
        create_or_replace_sql,
        write_to_replace,
        write_to_create_or_replace,
        save_as_table_overwrite,
    )
    for k, form in enumerate(forms, start=1):
        step(f"{form.__name__}_failing", "r", functools.partial(form, failing))
        step(form.__name__, "r", functools.partial(form, rows(10 * k)))

    # OPTIONS (retention ...): set by the replace's own commit, so a failed one sets nothing.
    kept = f"{using} OPTIONS (retention '2 versions')"
    step("replace_with_retention_failing", "r", sql(f"REPLACE TABLE {r} {kept} AS {failing}"))
    step("replace_with_retention", "r", sql(f"REPLACE TABLE {r} {kept} AS {rows(60)}"))

    # A schema the shard cannot take (a column dropped): refused, nothing changes.
    step("replace_dropping_a_column", "r", sql(f"REPLACE TABLE {r} {using} AS SELECT id FROM {u}"))
    # A new nullable column: the shard gains it, as after ALTER TABLE ... ADD COLUMNS.
    step(
        "replace_adding_a_column",
        "r",
        sql(f"REPLACE TABLE {r} {using} AS SELECT id, item, 'new' AS note FROM {u}"),
    )
    # OPTIONS with a secret: refused before anything runs.
    secret = "OPTIONS ('storage.key' = 'hunter2')"
    step("replace_with_a_secret", "r", sql(f"REPLACE TABLE {r} {using} {secret} AS {rows(0)}"))

    # Every creating form, failing then succeeding: no table, nothing written, after a failure.
    def located(short: str) -> str:
        return f"USING persistshard LOCATION '{loc(short)}'"

    def k_sql(q: str) -> None:
        spark.sql(f"CREATE TABLE {n['k_sql']} {located('k_sql')} AS {q}").collect()

    def k_write_to(q: str) -> None:
        writer = spark.sql(q).writeTo(n["k_write_to"]).using("persistshard")
        writer.tableProperty("location", loc("k_write_to")).create()

    def k_or_replace(q: str) -> None:
        table = n["k_or_replace"]
        spark.sql(f"CREATE OR REPLACE TABLE {table} {located('k_or_replace')} AS {q}").collect()

    def k_save(q: str) -> None:
        writer = spark.sql(q).write.format("persistshard").option("path", loc("k_save"))
        writer.mode("overwrite").saveAsTable(n["k_save"])

    def k_retention(q: str) -> None:
        options = "OPTIONS (retention '2 versions')"
        table = n["k_retention"]
        spark.sql(f"CREATE TABLE {table} {located('k_retention')} {options} AS {q}").collect()

    for create in (k_sql, k_write_to, k_or_replace, k_save, k_retention):
        short = create.__name__
        step(f"{short}_failing", short, functools.partial(create, failing))
        step(short, short, functools.partial(create, rows(0)))
    step("rn", "rn", sql(f"CREATE OR REPLACE TABLE {n['rn']} USING persistshard AS {rows(0)}"))

    # Another provider: Spark's own CTAS (create, write, drop if the write fails). Spark
    # cannot write the Python source's table by a CTAS: no table is left.
    from persistshard.datasource.source import PersistShardDataSource

    class Unstaged(PersistShardDataSource):
        @classmethod
        def name(cls) -> str:
            return "persistshard_unstaged"

    spark.dataSource.register(Unstaged)
    other = f"CREATE TABLE {n['k_other']} USING persistshard_unstaged AS {rows(0)}"
    step("k_other", "k_other", sql(other))
    return out


def main() -> None:
    from jvm_scan_session import companion_session

    work = Path(sys.argv[1])
    spark = companion_session(**{"spark.sql.warehouse.dir": str(work / "warehouse")})
    result = collect(spark, work)
    spark.stop()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
