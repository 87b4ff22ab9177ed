"""Upserts by key in the Python API (core/upsert.py): semantics, bad input, lookup by key
statistics, and a randomized test against a model table."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persistshard as ps
from persistshard import errors
from persistshard.core import upsert as up
from persistshard.errors import InvalidUpdates, UpperMismatch


def rows_of(table: pa.Table) -> dict[Any, Any]:
    """{id: v} of a snapshot; fails if a key repeats or a count is not 1."""
    out: dict[Any, Any] = {}
    for r in table.to_pylist():
        assert r["_diff"] == 1, r
        assert r["id"] not in out, f"two rows with key {r['id']}"
        out[r["id"]] = r["v"]
    return out


def test_upsert_replaces_inserts_and_deletes(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.upsert(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), "id")
    assert rows_of(shard.snapshot()) == {1: "a", 2: "b", 3: "c"}
    shard.upsert(pa.table({"id": [2, 4, 3], "v": ["B", "d", "c"], "_diff": [1, 1, -1]}), "id")
    assert rows_of(shard.snapshot()) == {1: "a", 2: "B", 4: "d"}
    assert shard.upper == 2
    changes = {(r["id"], r["v"], r["_diff"]) for r in shard.updates(1, 2).to_pylist()}
    assert changes == {(2, "b", -1), (2, "B", 1), (3, "c", -1), (4, "d", 1)}
    assert shard.history()[-1]["kind"] == "upsert"
    assert rows_of(shard.snapshot(as_of=0)) == {1: "a", 2: "b", 3: "c"}  # time travel


def test_unchanged_rows_write_nothing(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}), "id")
    shard.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}), "id")
    assert shard.upper == 2
    assert shard.updates(1, 2).num_rows == 0
    # deleting an absent key is a no-op too
    shard.upsert(pa.table({"id": [9], "v": ["z"], "_diff": [-1]}), "id")
    assert shard.updates(2, 3).num_rows == 0


def test_upsert_after_since_reached_upper(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}), "id")
    shard.upsert(pa.table({"id": [1], "v": ["c"]}), "id")
    assert shard.advance_since(shard.upper) == 2  # history folded up to the upper
    shard.compact()
    shard.upsert(pa.table({"id": [2], "v": ["d"]}), "id")
    assert rows_of(shard.snapshot()) == {1: "c", 2: "d"}


def test_delete_column_and_composite_key(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    t = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"], "v": [1.0, 2.0, 3.0], "gone": [False] * 3})
    shard.upsert(t, ["a", "b"], delete_column="gone")
    t2 = pa.table({"b": ["y", "x"], "a": [1, 2], "v": [20.0, 0.0], "gone": [False, True]})
    shard.upsert(t2, "a,b", delete_column="gone")
    got = sorted((r["a"], r["b"], r["v"]) for r in shard.snapshot().to_pylist())
    assert got == [(1, "x", 1.0), (1, "y", 20.0)]
    assert "gone" not in shard.schema.names


def test_upsert_retracts_every_row_of_a_key_written_by_appends(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(pa.table({"id": [1, 1, 1], "v": ["a", "a", "b"]}))
    shard.upsert(pa.table({"id": [1], "v": ["c"]}), "id")
    assert rows_of(shard.snapshot()) == {1: "c"}


def test_duplicate_keys_refused_nothing_written(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.upsert(pa.table({"id": [1], "v": ["a"]}), "id")
    before = (
        shard.upper,
        shard.inspect.state().part_keys(),
        sorted(m.key for m in shard._blob.list("")),
    )
    with pytest.raises(InvalidUpdates, match=r"^InvalidUpdates: duplicate key .*\(id=7\)"):
        shard.upsert(pa.table({"id": [7, 3, 7], "v": ["x", "y", "z"]}), "id")
    with pytest.raises(InvalidUpdates, match=r"duplicate key .*\(id=3\)"):  # delete + upsert
        shard.upsert(pa.table({"id": [3, 3], "v": ["x", "y"], "_diff": [1, -1]}), "id")
    after = (
        shard.upper,
        shard.inspect.state().part_keys(),
        sorted(m.key for m in shard._blob.list("")),
    )
    assert after == before


@pytest.mark.parametrize(
    ("table", "keys", "kwargs", "message"),
    [
        (pa.table({"id": [1], "v": ["a"]}), "nope", {}, r"key column 'nope' is not a column"),
        (pa.table({"id": [1, None], "v": ["a", "b"]}), "id", {}, r"key column id has 1 null"),
        (pa.table({"id": [1.0], "v": ["a"]}), "id", {}, r"key column id has type double"),
        (pa.table({"id": [1], "v": ["a"], "_diff": [2]}), "id", {}, r"_diff is \+1 .* got 2"),
        (pa.table({"id": [1], "v": ["a"], "_time": [0]}), "id", {}, r"drop the _time column"),
        (pa.table({"id": [1], "v": ["a"]}), "id", {"delete_column": "d"}, r"delete_column 'd'"),
        (pa.table({"id": [1], "v": ["a"], "d": [1]}), "id", {"delete_column": "d"}, "boolean"),
        (pa.table({"id": [1], "v": ["a"]}), "id, ,", {}, r"key_columns must name"),
        (pa.table({"id": [1], "v": ["a"]}), "id,ID", {}, r"names id, ID more than once|more than"),
    ],
)
def test_bad_input_is_refused(
    tmp_path: Any, table: pa.Table, keys: str, kwargs: dict[str, Any], message: str
) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    # Options naming no column (or no column at all) are InvalidOption; bad rows InvalidUpdates.
    option = message.startswith(("key column 'nope'", "delete_column 'd'", "key_columns", "names"))
    name = "InvalidOption" if option else "InvalidUpdates"
    with pytest.raises(getattr(errors, name), match=rf"^{name}: .*" + message):
        shard.upsert(table, keys, **kwargs)
    assert shard.upper == 0 and shard.schema is None


def test_key_columns_are_recorded(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.upsert(pa.table({"id": [1], "v": ["a"]}), "ID")  # matched case-insensitively
    assert up.recorded_key_columns(shard.schema) == ("id",)
    shard.append(pa.table({"id": [5], "v": ["e"]}))  # other commits keep the record
    assert up.recorded_key_columns(shard.schema) == ("id",)
    with pytest.raises(errors.InvalidOption, match="upserts use key_columns id; this upsert"):
        shard.upsert(pa.table({"id": [1], "v": ["a"]}), "v")
    assert shard.upper == 2


def test_lookup_reads_only_chunks_that_may_hold_the_keys(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)  # keeps the ten parts
    for i in range(10):  # ten parts, each with one chunk of a disjoint id range
        ids = list(range(i * 100, i * 100 + 100))
        shard.upsert(pa.table({"id": ids, "v": [str(x) for x in ids]}), "id")
    stats = up.LookupStats()
    shard.upsert(pa.table({"id": [150, 160], "v": ["x", "y"]}), "id", stats=stats)
    assert stats.chunks == 10 and stats.chunks_read == 1
    assert stats.rows_read == 100 and stats.rows_found == 2
    snap = rows_of(shard.snapshot())
    assert len(snap) == 1000 and snap[150] == "x" and snap[160] == "y" and snap[151] == "151"


def test_a_concurrent_commit_makes_the_upsert_recompute(tmp_path: Any, monkeypatch: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.upsert(pa.table({"id": [1], "v": ["a"]}), "id")
    other = ps.open_shard(str(tmp_path / "s"))
    real = up.delta_parts
    calls = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:  # another writer upserts key 1 between our read and our commit
            monkeypatch.setattr(up, "delta_parts", real)
            other.upsert(pa.table({"id": [1], "v": ["b"]}), "id")
            monkeypatch.setattr(up, "delta_parts", racing)
        return out

    monkeypatch.setattr(up, "delta_parts", racing)
    parts_before = {m.key for m in shard._blob.list("parts/")}
    shard.upsert(pa.table({"id": [1], "v": ["c"]}), "id")
    assert len(calls) == 2
    assert rows_of(shard.snapshot()) == {1: "c"}
    assert shard.updates(2, 3).to_pylist() == [
        {"id": 1, "v": "b", "_time": 2, "_diff": -1},
        {"id": 1, "v": "c", "_time": 2, "_diff": 1},
    ]
    # the refused attempt's parts were deleted: only referenced parts remain
    assert {m.key for m in shard._blob.list("parts/")} - parts_before == {
        k for k in shard.inspect.state().part_keys() if k not in parts_before
    }
    calls.clear()

    def always_racing(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        monkeypatch.setattr(up, "delta_parts", real)
        other.upsert(pa.table({"id": [2], "v": [str(len(calls))]}), "id")
        monkeypatch.setattr(up, "delta_parts", always_racing)
        calls.append(1)
        return out

    monkeypatch.setattr(up, "delta_parts", always_racing)
    with pytest.raises(UpperMismatch):
        shard.upsert(pa.table({"id": [1], "v": ["d"]}), "id", retries=1)
    assert len(calls) == 2


# --- randomized, against a model --------------------------------------------------------------

op = st.tuples(st.integers(0, 12), st.one_of(st.none(), st.sampled_from(["a", "b", "c"])))
batch = st.lists(op, min_size=0, max_size=10, unique_by=lambda o: o[0])


def _as_table(ops: list[tuple[int, str | None]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([k for k, _ in ops], pa.int64()),
            "v": pa.array([v if v is not None else "" for _, v in ops], pa.string()),
            "_diff": pa.array([-1 if v is None else 1 for _, v in ops], pa.int64()),
        }
    )


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batches=st.lists(batch, min_size=1, max_size=6), compact_after=st.integers(0, 6))
def test_random_upserts_match_a_model(
    tmp_path_factory: Any, batches: list[list[tuple[int, str | None]]], compact_after: int
) -> None:
    """After each commit the snapshot equals the model's table; the change read between any
    two commits equals the model's difference; no snapshot holds two rows with one key."""
    shard = ps.open_shard(str(tmp_path_factory.mktemp("model")))
    model: dict[int, str] = {}
    tables: list[dict[int, str]] = []  # model at time i
    for i, ops in enumerate(batches):
        shard.upsert(_as_table(ops), "id")
        for k, v in ops:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        tables.append(dict(model))
        assert shard.upper == i + 1
        assert rows_of(shard.snapshot()) == model
        if i == compact_after:
            shard.compact()
    for t, expected in enumerate(tables):
        assert rows_of(shard.snapshot(as_of=t)) == expected
    for lo in range(len(tables)):
        for hi in range(lo, len(tables)):
            got: Counter[tuple[int, str]] = Counter()
            for r in shard.updates(lo + 1, hi + 1).to_pylist():
                got[(r["id"], r["v"])] += r["_diff"]
            want: Counter[tuple[int, str]] = Counter()
            for k, v in tables[hi].items():
                want[(k, v)] += 1
            for k, v in tables[lo].items():
                want[(k, v)] -= 1
            assert +got == +want and -got == -want, (lo, hi)
