"""Scans outside Spark (`persistshard.core.read.scan`): answers equal to the whole-table reads
(`Shard.snapshot`, `Shard.updates`) projected and filtered, statistics skipping and
projection proven by the bytes fetched, streaming proven by the bytes fetched before the first
batch, and the real consumers (pyarrow, DuckDB, Polars, pandas). No Spark here.
"""

from __future__ import annotations

import datetime
import os
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persistshard as ps
from persistshard.core.read import plan as plan_mod
from persistshard.core.read import scan as scan_mod
from persistshard.core.read.expression import expression_filter
from persistshard.core.read.filters import Pred, bind
from persistshard.core.shard import Shard
from persistshard.core.storage import parts
from persistshard.core.storage.blob import Blob, BlobWrapper, open_blob
from persistshard.core.write.validate import update_schema

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("s", pa.string()),
        pa.field("v", pa.int32()),
        pa.field("pad", pa.string()),
    ]
)
#: The schema a scan's filter is bound to: the row columns, ``_time`` and ``_diff``.
STORED = update_schema(SCHEMA)
ROOT = Path(__file__).resolve().parent.parent


class CountingBlob(BlobWrapper):
    """Counts the bytes of part ranges fetched (the reads a scan makes)."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.fetched = 0

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        data = super().get_range(key, offset, length)
        self.fetched += len(data)
        return data


def rows(n: int, start: int = 0, *, v: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "s": None if i % 7 == 0 else f"s{i % 13}",
            "v": None if i % 11 == 0 else (i * 3 + v) % 50,
            "pad": random.Random(i).randbytes(48).hex(),  # does not compress
        }
        for i in range(start, start + n)
    ]


def updates(rs: list[dict[str, Any]], time: int, diff: int) -> pa.Table:
    table = pa.Table.from_pylist(rs, schema=SCHEMA)
    n = table.num_rows
    table = table.append_column("_time", pa.array([time] * n, pa.int64()))
    return table.append_column("_diff", pa.array([diff] * n, pa.int64()))


def multiset(table: pa.Table, columns: list[str] | None = None) -> Counter[tuple[Any, ...]]:
    names = columns if columns is not None else table.column_names
    return Counter(tuple(r[c] for c in names) for r in table.to_pylist())


def expand(table: pa.Table) -> Counter[tuple[Any, ...]]:
    """The rows of a ``rows + _diff`` table, each counted by its diff."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r in table.to_pylist():
        d = r.pop("_diff")
        out[tuple(r.values())] += d
    return +out


def projected(table: pa.Table, columns: list[str], extra: list[str]) -> Counter[tuple[Any, ...]]:
    """Sum the diffs of ``table`` per projected row (+ ``extra`` columns), zeros dropped."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r in table.to_pylist():
        out[tuple(r[c] for c in [*columns, *extra])] += r["_diff"]
    return Counter({k: v for k, v in out.items() if v != 0})


#: Many chunks per part and many tasks per scan.
SMALL = {"chunk_bytes": 4096, "scan_task_bytes": 4096}


@pytest.fixture
def shard(tmp_path: Any) -> Shard:
    """Four appends: 2,000 rows at 0, a retraction and re-insert of 300 of them (new v) at 1,
    rows at 2 with a duplicate (diff 2), and a retraction at 3."""
    s = ps.open_shard(str(tmp_path / "shard"), maintenance=False, **SMALL)
    s.append(updates(rows(2000), 0, 1), new_upper=1)
    s.append(
        pa.concat_tables([updates(rows(300, 500), 1, -1), updates(rows(300, 500, v=7), 1, 1)]),
        new_upper=2,
    )
    s.append(updates(rows(100, 2000), 2, 2), new_upper=3)
    s.append(updates(rows(50, 0), 3, -1), new_upper=4)
    return s


def counted(s: Shard) -> tuple[Shard, CountingBlob]:
    blob = CountingBlob(open_blob(s.location))
    return Shard(s.location, blob=blob, config=s.config), blob


# --- answers -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_of", [0, 1, 2, 3])
def test_snapshot_scan_equals_snapshot(shard: Shard, as_of: int) -> None:
    whole = shard.snapshot(as_of)
    scan = shard.scan(as_of)
    assert len(scan.tasks()) > 4  # the fixture splits it
    got = scan.to_arrow()
    assert got.schema == SCHEMA
    assert multiset(got) == expand(whole)
    with_diff = shard.scan(as_of, with_diff=True).to_arrow()
    assert with_diff.sort_by([("id", "ascending")]).equals(whole.sort_by([("id", "ascending")]))


def test_default_as_of_is_upper_minus_one(shard: Shard) -> None:
    assert multiset(shard.scan().to_arrow()) == expand(shard.snapshot(3))


@pytest.mark.parametrize("columns", [["v"], ["s", "v"], ["v", "id"], ["pad"]])
def test_projection_is_the_projected_multiset(shard: Shard, columns: list[str]) -> None:
    whole = shard.snapshot(3)
    got = shard.scan(columns=columns).to_arrow()
    assert got.column_names == columns
    assert multiset(got) == +projected(whole, columns, [])
    with_diff = shard.scan(columns=columns, with_diff=True).to_arrow()
    assert with_diff.column_names == [*columns, "_diff"]
    # one row per distinct projected row, across tasks too
    keys = [tuple(r[c] for c in columns) for r in with_diff.to_pylist()]
    assert len(keys) == len(set(keys))
    assert projected(with_diff, columns, []) == projected(whole, columns, [])


def test_projection_fetches_only_the_chosen_columns(shard: Shard) -> None:
    s, blob = counted(shard)
    s.scan().to_arrow()
    full = blob.fetched
    blob.fetched = 0
    got = s.scan(columns=["v"]).to_arrow()
    assert got.num_rows == shard.snapshot(3).num_rows + 100  # 100 rows count twice
    assert blob.fetched < full / 2, (blob.fetched, full)


@pytest.mark.parametrize(
    "expr",
    [
        pc.field("id") < 100,
        (pc.field("id") >= 700) & (pc.field("id") < 760),
        pc.field("s") == "s3",
        pc.field("v").is_null(),
        ~pc.field("s").is_null(),
        pc.field("id").isin([5, 600, 2050]),
        (pc.field("id") < 10) | (pc.field("id") > 2090),
        ~(pc.field("v") > 20),  # null v: NOT null is null, dropped
        pc.scalar(1990) < pc.field("id"),
        (pc.field("v") * 2 > 40) & (pc.field("id") < 300),  # arithmetic: not translated
        pc.field("id") < 10.5,  # a float literal: not bound, still exact
    ],
)
def test_expression_filter_is_exact(shard: Shard, expr: pc.Expression) -> None:
    whole = shard.scan().to_arrow()
    expected = multiset(whole.filter(expr))
    assert multiset(shard.scan(filter=expr).to_arrow()) == expected
    projected_scan = shard.scan(columns=["pad"], filter=expr).to_arrow()
    assert projected_scan.column_names == ["pad"]
    assert multiset(projected_scan) == multiset(whole.filter(expr), ["pad"])


def test_filter_skips_chunks(shard: Shard) -> None:
    s, blob = counted(shard)
    assert s.scan(filter=pc.field("id") < -5).to_arrow().num_rows == 0
    footers = blob.fetched  # no chunk can match: only footers (and parts small enough to
    blob.fetched = 0  # be read whole when opened) are fetched
    s.scan().to_arrow()
    full = blob.fetched - footers
    blob.fetched = 0
    got = s.scan(filter=(pc.field("id") >= 1000) & (pc.field("id") < 1020)).to_arrow()
    assert sorted(got.column("id").to_pylist()) == list(range(1000, 1020))
    assert blob.fetched - footers < full / 10, (blob.fetched, footers, full)


def test_pred_filter_is_the_spark_pushdown_filter(shard: Shard) -> None:
    pred = bind("starts_with", "s", "s1", SCHEMA)
    assert pred is not None
    got = shard.scan(filter=pred, with_diff=True).to_arrow()
    whole = shard.snapshot(3)
    expected = whole.filter(pc.fill_null(pc.starts_with(whole.column("s"), "s1"), False))
    assert got.sort_by("id").equals(expected.sort_by("id"))


def test_expression_translation() -> None:
    e = expression_filter((pc.field("id") > 3) & pc.field("s").is_valid(), SCHEMA)
    assert e.columns == {"id", "s"} and e.exact
    assert e.skip == Pred("and", children=(Pred("gt", "id", 3), Pred("is_not_null", "s")))
    e = expression_filter((pc.field("v") * 2 > 40) & (pc.field("id") <= 9), SCHEMA)
    assert e.columns == {"v", "id"} and not e.exact
    assert e.skip == Pred("le", "id", 9)  # the part it can prove
    e = expression_filter((pc.field("v") * 2 > 40) | (pc.field("id") <= 9), SCHEMA)
    assert e.skip is None and not e.exact
    e = expression_filter(pc.field("id").isin([1, None]), SCHEMA)
    assert e.skip is None  # null matches null in Arrow's is_in: not a SQL IN
    e = expression_filter(pc.field("_time") >= 2, STORED)
    assert e.columns == {"_time"}
    e = expression_filter(pc.field("nope") >= 2, STORED)
    assert e.columns is None and e.skip is None  # the scan refuses it, evaluating it


def test_expression_translation_covers_the_predicates_and_leaves_the_rest() -> None:
    """Each predicate form the Substrait reading translates, with literals of several Arrow
    types, and the forms it must leave untranslated (no `Pred`: Arrow filters them)."""
    schema = pa.schema(
        [
            ("i", pa.int32()),
            ("t", pa.timestamp("us")),
            ("d", pa.date32()),
            ("s", pa.large_string()),
            ("b", pa.binary()),
            ("f", pa.float64()),
        ]
    )
    t0, d0 = datetime.datetime(2024, 5, 1, 12), datetime.date(2024, 5, 1)
    translated = [
        (pc.field("i") < 5, bind("lt", "i", 5, schema)),
        (pc.field("i") >= 5, bind("ge", "i", 5, schema)),
        (pc.scalar(5) <= pc.field("i"), bind("ge", "i", 5, schema)),
        (pc.scalar(5) > pc.field("i"), bind("lt", "i", 5, schema)),
        (pc.field("i") == 7, bind("eq", "i", 7, schema)),
        (pc.field("s") == "x", bind("eq", "s", "x", schema)),
        (pc.field("b") == b"\x00k", bind("eq", "b", b"\x00k", schema)),
        (pc.field("d") > d0, bind("gt", "d", d0, schema)),
        (pc.field("t") > t0, bind("gt", "t", t0, schema)),
        (pc.field("i").isin([1, 2, 3]), bind("in", "i", (1, 2, 3), schema)),
        (pc.field("s").is_null(), Pred("is_null", "s")),
        (pc.field("s").is_valid(), Pred("is_not_null", "s")),
        (~pc.field("s").is_null(), Pred("is_not_null", "s")),
        (~pc.field("s").is_valid(), Pred("is_null", "s")),
    ]
    for expr, pred in translated:
        e = expression_filter(expr, schema)
        assert e.skip == pred and e.exact == (pred is not None), expr
        assert e.columns is not None and len(e.columns) == 1, expr
    both = expression_filter((pc.field("i") < 5) | pc.field("s").is_null(), schema)
    assert both.skip == Pred("or", children=(bind("lt", "i", 5, schema), Pred("is_null", "s")))
    assert both.exact and both.columns == {"i", "s"}
    untranslated = [
        pc.field("i") != 3,
        pc.field("f").is_nan(),
        ~(pc.field("i") > 20),
        pc.field("i") + 1 > 3,
        pc.field("i").isin([1, None]),
        pc.field("i") < pc.field("f"),
    ]
    for expr in untranslated:
        e = expression_filter(expr, schema)
        assert e.skip is None and not e.exact and e.columns, expr


def test_expressions_substrait_cannot_carry_still_tell_their_columns() -> None:
    """``id < 10.5`` binds with a safe cast and ``is_null(nan_is_null=True)`` has no
    Substrait form: nothing is translated, yet the columns they read are known (so a
    projected scan takes them)."""
    for expr, column in [
        (pc.field("id") < 10.5, "id"),
        (pc.field("v").is_null(nan_is_null=True), "v"),
    ]:
        with pytest.raises(pa.ArrowInvalid):
            expr.to_substrait(STORED)
        e = expression_filter(expr, STORED)
        assert e.columns == {column} and e.skip is None and not e.exact


def test_expressions_are_read_through_a_public_route() -> None:
    """The reading uses pyarrow's public Substrait serialization, never the private pickle
    form (``Expression.__reduce__``, its IPC file of node names) or private constructors
    (``Expression._call``): no module of the package touches them."""
    private = re.compile(r"__reduce__|\bExpression\._call\b|show_schema_metadata")
    found = [
        f"{path.relative_to(ROOT)}"
        for path in sorted(ROOT.rglob("*.py"))
        if "tests" not in path.parts
        and ".venv" not in path.parts
        and private.search(path.read_text())
    ]
    assert found == []
    source = (ROOT / "core" / "read" / "expression.py").read_text()
    assert "to_substrait(" in source and "deserialize_expressions(" in source


# --- change reads --------------------------------------------------------------------------


@pytest.mark.parametrize("lo,hi", [(0, 4), (1, 3), (2, 2)])
def test_scan_updates_equals_updates(shard: Shard, lo: int, hi: int) -> None:
    whole = shard.updates(lo, hi)
    got = shard.scan_updates(lo, hi).to_arrow()
    assert got.column_names == [*SCHEMA.names, "_time", "_diff"]
    assert multiset(got) == multiset(whole)
    cols = ["v"]
    got = shard.scan_updates(lo, hi, columns=cols).to_arrow()
    keys = [(r["v"], r["_time"]) for r in got.to_pylist()]
    assert len(keys) == len(set(keys))
    assert projected(got, cols, ["_time"]) == projected(whole, cols, ["_time"])


def test_change_filter_on_time_and_diff(shard: Shard) -> None:
    expr = (pc.field("_diff") < 0) & (pc.field("_time") == 1)
    got = shard.scan_updates(0, 4, filter=expr).to_arrow()
    whole = shard.updates(0, 4)
    assert multiset(got) == multiset(whole.filter(expr))
    # the retractions at 1 whose re-insert differs (rows with a null v are re-inserted as
    # they were, and cancel)
    assert got.num_rows == sum(1 for i in range(500, 800) if i % 11)


# --- errors --------------------------------------------------------------------------------


def test_times_are_checked_when_the_scan_is_made(shard: Shard) -> None:
    with pytest.raises(ps.NotSealed):
        shard.scan(4)
    with pytest.raises(ps.NotSealed):
        shard.scan_updates(0, 5)
    shard.advance_since(2)
    with pytest.raises(ps.SinceViolation):
        shard.scan(1)


def test_bad_arguments_name_the_shard(shard: Shard) -> None:
    with pytest.raises(ps.InvalidOption, match="nope") as e:
        shard.scan(columns=["id", "nope"])
    assert str(e.value).startswith("InvalidOption: columns")
    assert shard.location in str(e.value)
    with pytest.raises(ps.InvalidOption, match="_diff"):
        shard.scan(filter=pc.field("_diff") > 0)  # no _diff in a snapshot without with_diff
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: filter .*Expression"):
        shard.scan(filter="id > 3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"columns": "id"}, "columns"),  # a string, not a list
        ({"columns": 3}, "columns"),
        ({"columns": ["id", 3]}, "columns"),
        ({"columns": ["id", "id"]}, "columns"),
        ({"columns": ["ID"]}, "columns"),
        ({"filter": pc.field("nope") > 3}, "filter"),
        ({"filter": Pred("gt", "nope", 3)}, "filter"),
        ({"filter": pc.field("id") > "abc"}, "filter"),  # a string against an int64 column
        ({"filter": pc.field("s") > 3}, "filter"),  # a number against a string column
        ({"filter": pc.field("id") + 1}, "filter"),  # not a boolean expression
        ({"filter": Pred("gt", "id", "abc")}, "filter"),
        ({"filter": Pred("between", "id", 3)}, "filter"),  # no such operator
        ({"filter": pc.field("id") > "abc", "columns": ["s"]}, "filter"),
        ({"filter": 3}, "filter"),
    ],
)
def test_bad_scan_arguments_raise_invalid_option(
    shard: Shard, kwargs: dict[str, Any], named: str
) -> None:
    """Every bad argument is refused when the scan is made (before any read), as
    `InvalidOption` (not a bare ValueError/TypeError) whose message names the argument and
    the shard."""
    with pytest.raises(ps.InvalidOption) as e:
        shard.scan(**kwargs)
    assert str(e.value).startswith(f"InvalidOption: {named}")
    assert shard.location in str(e.value)


def test_bad_change_scan_arguments_raise_invalid_option(shard: Shard) -> None:
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: filter"):
        shard.scan_updates(0, 4, filter=pc.field("_time") > "x")
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: columns"):
        shard.scan_updates(0, 4, columns=["_time"])


def test_negative_count_is_refused_when_read(tmp_path: Any) -> None:
    s = ps.open_shard(str(tmp_path / "neg"), maintenance=False)
    s.append(updates(rows(3), 0, -1), new_upper=1)
    scan = s.scan()
    with pytest.raises(ps.NegativeDiff):
        scan.to_arrow()
    assert s.scan(with_diff=True).to_arrow().column("_diff").to_pylist() == [-1, -1, -1]


def test_empty_shards(tmp_path: Any) -> None:
    s = ps.open_shard(str(tmp_path / "empty"), maintenance=False)
    with pytest.raises(ps.NoShard):  # nothing committed: no shard, not an empty table
        s.scan()
    s.compare_and_append(None, 0, 0)  # the empty shard
    assert s.scan().to_arrow().num_rows == 0
    s.append(updates(rows(3), 0, 1), new_upper=1)
    assert s.scan_updates(1, 1).to_arrow().num_rows == 0
    assert s.scan(0, columns=["id"]).to_arrow().column("id").to_pylist() == [0, 1, 2]


# --- streaming -----------------------------------------------------------------------------


def test_unit_diffs_are_not_fetched(tmp_path: Any, monkeypatch: Any) -> None:
    """A snapshot scan of chunks whose statistics prove every diff is 1 never fetches the
    ``_diff`` column (its answer needs no repeat); a chunk holding a diff of 2 still does,
    and repeats its row."""
    s = ps.open_shard(str(tmp_path / "ones"), maintenance=False, **SMALL)
    s.append(updates(rows(3000), 0, 1), new_upper=1)
    s.append(updates(rows(1, 3000), 1, 2), new_upper=2)
    counted_shard, blob = counted(s)
    got = counted_shard.scan(columns=["v"]).to_arrow()
    skipping = blob.fetched
    monkeypatch.setattr(plan_mod, "_unit_diffs", lambda reader, chunks: False)
    blob.fetched = 0
    assert counted_shard.scan(columns=["v"]).to_arrow().equals(got)
    assert skipping < blob.fetched  # without the proof, every chunk's _diff is fetched
    whole = s.snapshot()
    assert multiset(got) == expand(whole.select(["v", "_diff"]))
    assert got.num_rows == 3002


def test_mapped_parts_read_as_ranged_gets_do(shard: Shard, monkeypatch: Any) -> None:
    """A scan maps local parts into memory (every part here, with the size floor at 0) and
    answers exactly what ranged gets through a wrapper (never mapped) answer."""
    mapping = ps.open_shard(shard.location, config=shard.config.replace(map_min_bytes=0))
    maps: list[int] = []
    real = parts.mmap.mmap

    def spy(*args: Any, **kwargs: Any) -> Any:
        maps.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(parts.mmap, "mmap", spy)
    for kwargs in ({}, {"columns": ["v"]}, {"filter": pc.field("id") < 900}):
        mapped = mapping.scan(**kwargs).to_arrow()
        assert maps
        maps.clear()
        unmapped = counted(shard)[0].scan(**kwargs).to_arrow()
        assert not maps
        assert mapped.equals(unmapped)


def test_mapped_part_cut_short_is_corrupt_data(shard: Shard, monkeypatch: Any) -> None:
    """A mapped part file shorter than its reference says is `CorruptData`, never a crash
    or a short answer; a missing one names the part."""
    mapping = ps.open_shard(shard.location, config=shard.config.replace(map_min_bytes=0))
    state = shard._machine.state()
    ref = next(p for b in (*state.trace, *state.unsealed) for p in b.parts if p.num_rows)
    path = shard._blob.local_file(ref.key)  # type: ignore[attr-defined]
    with open(path, "r+b") as f:
        f.truncate(ref.size // 2)
    with pytest.raises(ps.CorruptData):
        mapping.scan().to_arrow()
    os.remove(path)
    with pytest.raises(ps.CorruptData, match=ref.key):
        mapping.scan().to_arrow()


def test_tasks_read_at_once_keep_their_order(shard: Shard, monkeypatch: Any) -> None:
    """Pieces computed ``scan_ahead`` ahead answer in task order, as one at a time does."""
    scan = shard.scan(columns=["id", "s"])
    assert len(scan.tasks()) > 4
    together = scan.to_arrow()
    one = ps.open_shard(shard.location, config=shard.config.replace(scan_ahead=1))
    one_at_a_time = one.scan(columns=["id", "s"])
    assert one_at_a_time.config.scan_ahead == 1
    assert one_at_a_time.to_arrow().equals(together)
    assert together.column("id").to_pylist() == sorted(together.column("id").to_pylist())


def test_to_batches_streams_task_by_task(shard: Shard) -> None:
    s, blob = counted(shard)
    s.scan(filter=pc.field("id") < -5).to_arrow()
    footers = blob.fetched  # what planning reads (see test_filter_skips_chunks)
    blob.fetched = 0
    s.scan().to_arrow()
    full = blob.fetched - footers
    blob.fetched = 0
    batches = s.scan().to_batches()
    first = next(batches)
    assert first.num_rows > 0
    assert blob.fetched - footers < full / 5, (blob.fetched, footers, full)
    rest = list(batches)
    assert sum(b.num_rows for b in [first, *rest]) == s.scan().to_arrow().num_rows


def test_scan_is_lazy_and_reusable(shard: Shard) -> None:
    s, blob = counted(shard)
    scan = s.scan(columns=["id"])
    reader = scan.to_arrow_batch_reader()
    assert blob.fetched == 0  # nothing read before the first batch is asked for
    assert reader.schema == pa.schema([SCHEMA.field("id")])
    first = reader.read_all()
    # the scan is pinned: a later append does not change it
    shard.append(updates(rows(10, 5000), 4, 1), new_upper=5)
    assert scan.to_arrow().equals(first)


# --- consumers -----------------------------------------------------------------------------


def test_pyarrow_reads_the_c_stream(shard: Shard) -> None:
    scan = shard.scan(columns=["id", "v"])
    table = pa.table(scan)
    assert multiset(table) == multiset(scan.to_arrow())
    reader = pa.RecordBatchReader.from_stream(scan)
    assert reader.read_all().num_rows == table.num_rows


def test_duckdb(shard: Shard) -> None:
    scan = shard.scan(filter=pc.field("id") < 1000)
    expected = scan.to_arrow()
    con = duckdb.connect()
    rel = scan.to_duckdb(con, "orders")
    assert rel.aggregate("count(*)").fetchall() == [(expected.num_rows,)]
    got = con.sql("select v, count(*) as n from orders group by v order by v nulls first")
    ref = con.sql("select v, count(*) as n from expected group by v order by v nulls first")
    assert got.fetchall() == ref.fetchall()
    # a second query streams the pinned version again
    total = pc.sum(expected.column("id")).as_py()
    assert con.sql("select sum(id) from orders").fetchall() == [(total,)]
    # DuckDB finds the scan by its Python name (the PyCapsule stream)
    assert duckdb.sql("select count(*) from scan").fetchall() == [(expected.num_rows,)]


def test_polars_and_pandas(shard: Shard) -> None:
    scan = shard.scan(columns=["id", "s"], filter=pc.field("id") < 50)
    expected = scan.to_arrow()
    df = scan.to_polars()
    assert isinstance(df, pl.DataFrame)
    assert df.sort("id").to_arrow().cast(expected.schema).equals(expected.sort_by("id"))
    assert pl.DataFrame(scan).height == expected.num_rows  # through __arrow_c_stream__
    pdf = scan.to_pandas()
    assert isinstance(pdf, pd.DataFrame)
    assert sorted(pdf["id"].tolist()) == sorted(expected.column("id").to_pylist())


# --- property: any filter, any projection, any time ----------------------------------------

VALUE = st.one_of(st.none(), st.integers(0, 4))
UPDATE = st.tuples(VALUE, VALUE, VALUE, st.integers(0, 3), st.sampled_from([-1, 1, 2]))


@st.composite
def filters(draw: st.DrawFn) -> pc.Expression:
    def leaf() -> pc.Expression:
        column = pc.field(draw(st.sampled_from(["a", "b", "c"])))
        kind = draw(st.sampled_from(["lt", "ge", "eq", "null", "valid", "in", "arith"]))
        x = draw(st.integers(0, 4))
        return {
            "lt": lambda: column < x,
            "ge": lambda: column >= x,
            "eq": lambda: column == x,
            "null": lambda: column.is_null(),
            "valid": lambda: column.is_valid(),
            "in": lambda: column.isin([x, x + 1]),
            "arith": lambda: column + 1 > x,
        }[kind]()

    expr = leaf()
    for _ in range(draw(st.integers(0, 2))):
        other = leaf()
        expr = draw(st.sampled_from([expr & other, expr | other, ~expr]))
    return expr


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(st.lists(UPDATE, max_size=30), min_size=1, max_size=4),
    expr=st.one_of(st.none(), filters()),
    columns=st.one_of(st.none(), st.sampled_from([["a"], ["b", "c"], ["c", "a"]])),
    with_diff=st.booleans(),
)
def test_scan_equals_filtered_projected_snapshot(
    tmp_path_factory: Any,
    batches: list[list[tuple[Any, ...]]],
    expr: pc.Expression | None,
    columns: list[str] | None,
    with_diff: bool,
) -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.int64())])
    s = ps.open_shard(str(tmp_path_factory.mktemp("p")), maintenance=False, **SMALL)
    upper = 0
    for batch in batches:
        ups = [(a, b, c, upper + dt, d) for a, b, c, dt, d in batch]
        # keep every row's count non-negative at every time: insert before retracting
        ups = [u for u in ups if u[4] > 0] + [
            (*u[:4], -1) for u in ups if u[4] > 0 and u[4] == 2 and u[0] is not None
        ]
        table = pa.table(
            {
                "a": pa.array([u[0] for u in ups], pa.int64()),
                "b": pa.array([u[1] for u in ups], pa.int64()),
                "c": pa.array([u[2] for u in ups], pa.int64()),
                "_time": pa.array([u[3] for u in ups], pa.int64()),
                "_diff": pa.array([u[4] for u in ups], pa.int64()),
            }
        )
        upper += 4
        s.append(table, new_upper=upper)
    whole = s.snapshot()
    kept = whole if expr is None else whole.filter(expr)
    names = columns if columns is not None else schema.names
    got = s.scan(columns=columns, filter=expr, with_diff=with_diff).to_arrow()
    if with_diff:
        assert projected(got, names, []) == projected(kept, names, [])
        assert got.num_rows == len(projected(kept, names, []))
    else:
        assert multiset(got) == +projected(kept, names, [])


def test_projection_of_one_part_at_one_time(tmp_path: Any) -> None:
    """A part written at one time holds distinct rows, but not distinct projected rows."""
    s = ps.open_shard(str(tmp_path / "one"), maintenance=False)
    s.append(updates(rows(200), 0, 1), new_upper=1)
    got = s.scan(columns=["s"], with_diff=True).to_arrow()
    assert projected(got, ["s"], []) == projected(s.snapshot(), ["s"], [])
    assert got.num_rows == len(set(got.column("s").to_pylist()))
    assert s.scan(columns=["s"]).to_arrow().num_rows == 200


def test_consolidation_across_tasks_spills(shard: Shard, monkeypatch: pytest.MonkeyPatch) -> None:
    """A with_diff or change scan without the first column merges every task's answer: in a
    budgeted buffer that spills to local files, with the same answer."""
    made: list[Any] = []

    class Recording(scan_mod.Correction):  # type: ignore[name-defined,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(scan_mod, "Correction", Recording)
    budget = ps.open_shard(shard.location, config=shard.config.replace(scan_merge_budget=4096))
    got = budget.scan(columns=["s", "v"], with_diff=True).to_arrow()
    assert projected(got, ["s", "v"], []) == projected(shard.snapshot(3), ["s", "v"], [])
    assert len(got) == len(projected(got, ["s", "v"], []))
    changes = budget.scan_updates(0, 4, columns=["pad"]).to_arrow()
    whole = shard.updates(0, 4)
    assert projected(changes, ["pad"], ["_time"]) == projected(whole, ["pad"], ["_time"])
    assert len(made) == 2 and all(c.stats["spilled_runs"] > 0 for c in made)


def test_expression_reading_is_checked_by_rebuilding() -> None:
    """Odd column names are read right or not at all (never a wrong `Pred`)."""
    schema = pa.schema([("it's a 'name'", pa.int64()), ("x\ny", pa.int64())])
    e = expression_filter(pc.field("it's a 'name'") >= 3, schema)
    assert e.columns == {"it's a 'name'"} and e.skip == Pred("ge", "it's a 'name'", 3)
    e = expression_filter(pc.field("x\ny") >= 3, schema)
    assert e.skip in (None, Pred("ge", "x\ny", 3))
    assert e.columns in (None, {"x\ny"})


def test_projection_leaves_the_key_column_undecoded(shard: Shard) -> None:
    """Tasks split on the first column, but a snapshot whose chunks lie inside their task's
    key range (by statistics) does not fetch it unless it is projected or filtered on."""
    s, blob = counted(shard)
    fetched = {}
    for columns in (["v"], ["id", "v"]):
        blob.fetched = 0
        s.scan(columns=columns).to_arrow()
        fetched[len(columns)] = blob.fetched
    assert fetched[1] < fetched[2], fetched


def test_a_streamed_scan_gives_back_mapped_pages_as_it_goes(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large local parts are read through memory mappings; their touched pages count in the
    resident set until given back, so a streamed scan gives them back each time it has read
    ``scan_release_bytes`` of stored parts (issue 27: RSS stays near that much, whatever the
    shard's size), and a smaller read never pays for it. Views still in use read the
    same bytes after the release."""
    from persistshard.core.read import plan

    shard = ps.open_shard(
        str(tmp_path / "s"), map_min_bytes=1, chunk_bytes=64 << 10, scan_task_bytes=64 << 10
    )
    rng = np.random.default_rng(3)
    n = 200_000
    shard.append(pa.table({"id": np.arange(n, dtype=np.int64), "v": rng.random(n)}))
    released: list[int] = []
    real = plan.release_mapped

    def recording(mappings: list) -> None:
        released.append(len(mappings))
        real(mappings)

    monkeypatch.setattr(plan, "release_mapped", recording)
    s = shard.scan()
    assert s.to_arrow().num_rows == n and released == []  # 3.2 MB: under the default
    s = ps.open_shard(
        shard.location, config=shard.config.replace(scan_release_bytes=256 << 10)
    ).scan()
    tasks = s.tasks()
    batches = list(s.to_batches())  # every batch stays alive past the releases
    stored = sum(p.size for b in shard.inspect.state().trace for p in b.parts)
    per_task = stored / len(tasks)
    assert len(tasks) > 8 and len(released) >= 2
    assert stored // ((256 << 10) + per_task) <= len(released) <= stored // (256 << 10)
    assert released[-1] >= 1
    got = pa.Table.from_batches(batches)
    assert got.column("v").to_numpy().tolist() == shard.snapshot().column("v").to_pylist()
