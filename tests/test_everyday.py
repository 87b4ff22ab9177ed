"""Everyday use without Spark: plain appends that retry themselves, columns by name, and
schema evolution (adding nullable columns) across snapshots, change reads and compaction."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.conformance.storage import process_context
from persistshard.core.shard import write_transaction
from persistshard.core.statemachine.state import ShardState
from persistshard.errors import InvalidUpdates, UpperMismatch


def _rows(ids: list[int], item: str = "x") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "item": [item] * len(ids)})


def test_plain_append_after_a_lost_race_lands_at_the_new_upper(tmp_path):
    """A plain append written at upper 1 commits at 2 after another append took 1; its parts
    are not rewritten (same keys), and reads see its rows at time 2."""
    loc = str(tmp_path / "s")
    shard = ps.open_shard(loc)
    shard.append(_rows([1]))
    slow = ps.open_shard(loc)
    written = write_transaction(slow, "w-slow").write_updates(
        _rows([2])
        .append_column("_time", pa.array([1], pa.int64()))
        .append_column("_diff", pa.array([1], pa.int64())),
        lower=1,
        new_upper=2,
        schema=slow.schema,
    )
    shard.append(_rows([3]))  # takes time 1
    state = write_transaction(slow).commit(
        written, expected_upper=1, new_upper=2, schema=slow.schema, rebase=True
    )
    assert state.upper == 3
    assert state.trace[-1].lower == 2 and state.trace[-1].parts[0].key == written.sealed[0].key
    assert shard.updates(2, 3).to_pylist() == [{"id": 2, "item": "x", "_time": 2, "_diff": 1}]
    assert sorted(shard.snapshot(1).column("id").to_pylist()) == [1, 3]
    assert sorted(shard.snapshot().column("id").to_pylist()) == [1, 2, 3]
    assert shard.verify().ok
    # Survives a rollup and compaction: times stay rewritten.
    shard.advance_since(2)
    shard.compact()
    assert sorted(shard.snapshot().column("id").to_pylist()) == [1, 2, 3]
    assert shard.verify().ok


def test_explicit_times_and_expected_upper_still_fail(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(_rows([1]))
    timed = _rows([2]).append_column("_time", pa.array([0], pa.int64()))
    timed = timed.append_column("_diff", pa.array([1], pa.int64()))
    with pytest.raises(UpperMismatch):
        shard.compare_and_append(timed, expected_upper=0, new_upper=1)
    assert shard.upper == 1


def _append_many(loc: str, worker: int, n: int) -> None:
    shard = ps.open_shard(loc)
    for i in range(n):
        shard.append(_rows([worker * 1000 + i], item=f"w{worker}"))


def test_four_processes_append_plainly_without_failures(tmp_path):
    """4 processes x 25 plain appends each: every append succeeds (no UpperMismatch), the
    upper is exactly 100, every row is there once, and verify finds nothing wrong."""
    loc = str(tmp_path / "s")
    ps.open_shard(loc).append(_rows([-1]))
    ctx = process_context()
    procs = [ctx.Process(target=_append_many, args=(loc, w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    shard = ps.open_shard(loc)
    assert shard.upper == 101
    ids = shard.snapshot().column("id").to_pylist()
    assert len(ids) == 101 and len(set(ids)) == 101
    report = shard.verify()
    assert report.ok, report.problems
    # Every time holds exactly one append.
    times = Counter(shard.updates(0, 101).column("_time").to_pylist())
    assert sorted(times) == list(range(101)) and set(times.values()) == {1}


def test_columns_match_by_name_in_any_order_and_case(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(_rows([1], "a"))
    shard.append(pa.table({"ITEM": ["b"], "Id": pa.array([2], pa.int64())}))
    assert sorted(shard.snapshot().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "item": "a", "_diff": 1},
        {"id": 2, "item": "b", "_diff": 1},
    ]


def test_column_mismatch_lists_missing_extra_and_retyped(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(pa.table({"id": pa.array([1], pa.int64()), "item": ["a"], "qty": [1.0]}))
    bad = pa.table({"id": pa.array([1], pa.uint64()), "item": ["a"], "price": [2.0]})
    with pytest.raises(InvalidUpdates) as e:
        shard.append(bad)
    text = str(e.value)
    assert text.startswith("InvalidUpdates: ")
    assert "missing: qty double" in text
    assert "extra: price double" in text
    assert "retyped: id is uint64, the shard has int64" in text
    assert shard.upper == 1


def test_a_narrower_integer_column_is_cast_to_the_shards(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(_rows([1], "a"))
    shard.append(pa.table({"id": pa.array([2**31 - 1], pa.int32()), "item": ["b"]}))
    got = shard.snapshot()
    assert got.schema.field("id").type == pa.int64()
    assert sorted(got.column("id").to_pylist()) == [1, 2**31 - 1]


def test_state_accepts_only_appended_nullable_columns():
    from persistshard.core.statemachine import state as st
    from persistshard.core.statemachine.commits import apply
    from persistshard.core.statemachine.commits.append import Append

    old = pa.schema([pa.field("id", pa.int64())])
    wider = pa.schema([pa.field("id", pa.int64()), pa.field("price", pa.float64())])
    renamed = pa.schema([pa.field("key", pa.int64())])
    s = ShardState()

    def append(state: ShardState, schema: pa.Schema) -> ShardState:
        batch = st.Batch(id=f"b{state.version}", lower=state.upper, upper=state.upper + 1, parts=())
        c = Append(state.upper, state.upper + 1, batch, schema=schema, id=f"c{state.version}")
        return apply(state, c)

    s = append(s, old)
    s = append(s, wider)
    assert s.schema == wider
    s = append(s, old)  # a writer minted before the evolution: its parts read with nulls
    assert s.schema == wider
    with pytest.raises(InvalidUpdates, match="only grow by nullable columns"):
        append(s, renamed)


def test_history_names_what_each_commit_did(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(_rows([1]))
    shard.seal(5)
    shard.advance_since(4)
    shard.compact()
    kinds = [h["kind"] for h in shard.history()]
    assert kinds[:3] == ["append", "seal", "advance_since"]
    assert "compact" in kinds[3:]
    summaries = [h["summary"] for h in shard.history()]
    assert "1 row sealed at the upper found at commit (planned at 0)" in summaries[0]
    assert summaries[1] == "upper 1 -> 5, 0 rows sealed"
