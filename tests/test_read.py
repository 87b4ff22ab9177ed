"""Read planning in core: pushed filters (exact, SQL null semantics), statistics-based
skipping of chunks and parts, and filtered reads equal to filtering the unfiltered answer.

No Spark here: `tests/test_spark_pushdown.py` checks the same filters through Spark against
Spark's own filtering.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persistshard as ps
from persistshard.core.read.filters import Pred, bind, chunk_may_match, conjunction, filter_table
from persistshard.core.read.plan import (
    plan_read,
    read_task,
    relevant_parts,
    snapshot_query,
    updates_query,
)
from persistshard.core.rows import DIFF, TIME
from persistshard.core.storage import parts
from persistshard.format import PartReader, encode_part

SCHEMA = pa.schema(
    [
        pa.field("i", pa.int64()),
        pa.field("s", pa.string()),
        pa.field("d", pa.date32()),
        pa.field("m", pa.decimal128(9, 2)),
        pa.field("b", pa.bool_()),
    ]
)

VALUES: dict[str, Any] = {
    "i": st.integers(-5, 5),
    "s": st.sampled_from(["", "a", "ab", "abc", "b", "ba", "bab", "é", "zz"]),
    "d": st.dates(dt.date(2020, 1, 1), dt.date(2020, 1, 8)),
    "m": st.integers(-300, 300).map(lambda x: decimal.Decimal(x).scaleb(-2)),
    "b": st.booleans(),
}


def nullable(column: str) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), VALUES[column])


rows_strategy = st.lists(st.fixed_dictionaries({c: nullable(c) for c in SCHEMA.names}), max_size=40)


@st.composite
def leaves(draw: st.DrawFn) -> Pred:
    column = draw(st.sampled_from(SCHEMA.names))
    ops = ["eq", "eq_null_safe", "lt", "le", "gt", "ge", "in", "is_null", "is_not_null"]
    if column == "s":
        ops += ["starts_with", "ends_with", "contains"]
    op = draw(st.sampled_from(ops))
    if op == "in":
        value: Any = tuple(draw(st.lists(nullable(column), min_size=1, max_size=4)))
    elif op == "eq_null_safe":
        value = draw(nullable(column))
    elif op in ("is_null", "is_not_null"):
        value = None
    else:
        value = draw(VALUES[column])
    pred = bind(op, column, value, SCHEMA)
    assert pred is not None, (op, column, value)
    return pred


preds = st.recursive(
    leaves(),
    lambda children: st.one_of(
        children.map(lambda c: Pred("not", children=(c,))),
        st.lists(children, min_size=2, max_size=3).map(lambda cs: Pred("and", children=tuple(cs))),
        st.lists(children, min_size=2, max_size=3).map(lambda cs: Pred("or", children=tuple(cs))),
    ),
    max_leaves=5,
)


def reference(pred: Pred, row: dict[str, Any]) -> bool | None:
    """SQL three-valued logic, written out by hand (the oracle)."""
    op = pred.op
    if op == "not":
        inner = reference(pred.children[0], row)
        return None if inner is None else not inner
    if op in ("and", "or"):
        results = [reference(c, row) for c in pred.children]
        decisive = op == "or"  # OR: any True decides; AND: any False decides
        if decisive in results:
            return decisive
        return None if None in results else not decisive
    x = row[pred.column]
    v = pred.value
    if op == "is_null":
        return x is None
    if op == "is_not_null":
        return x is not None
    if op == "eq_null_safe":
        return x == v if x is not None and v is not None else (x is None and v is None)
    if x is None:
        return None
    if op == "in":
        if any(x == item for item in v if item is not None):
            return True
        return None if None in v else False
    if op == "starts_with":
        return bool(x.startswith(v))
    if op == "ends_with":
        return bool(x.endswith(v))
    if op == "contains":
        return v in x
    return {
        "eq": x == v,
        "lt": x < v,
        "le": x <= v,
        "gt": x > v,
        "ge": x >= v,
    }[op]


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, pred=preds)
def test_filters_follow_sql_null_semantics(rows: list[dict[str, Any]], pred: Pred) -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    expected = [r for r in rows if reference(pred, r) is True]
    assert filter_table(table, pred).to_pylist() == expected


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy.filter(lambda r: len(r) > 0), pred=preds, chunk=st.integers(60, 400))
def test_statistics_never_skip_a_matching_chunk(
    rows: list[dict[str, Any]], pred: Pred, chunk: int
) -> None:
    """`chunk_may_match` is a proof: a chunk it rules out holds no row the filter keeps."""
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    data, _ = encode_part(table, sort_column="i", chunk_bytes=chunk)
    reader = PartReader.from_bytes("p", data)
    for index in range(len(reader.chunks)):
        if not chunk_may_match(pred, reader, index):
            assert (
                filter_table(pa.Table.from_batches([reader.read_chunk(index)]), pred).num_rows == 0
            )


@pytest.mark.parametrize(
    ("op", "column", "value", "why"),
    [
        ("eq", "f", 1.0, "floats: Spark's NaN order differs from IEEE"),
        ("lt", "t", dt.datetime(2020, 1, 1), "timestamps: literals arrive as local time"),
        ("eq", "m", decimal.Decimal("1.234"), "a literal the column cannot hold exactly"),
        ("eq", "i", 2**70, "out of the column's range"),
        ("eq", "i", True, "a boolean for an integer column"),
        ("in", "i", (), "an empty IN list"),
        ("eq", "nope", 1, "no such column"),
        ("starts_with", "i", "1", "a string test on a number"),
        ("eq", "i", None, "= NULL is never true; Spark folds it itself"),
    ],
)
def test_bind_refuses_what_it_cannot_evaluate_exactly(
    op: str, column: str, value: Any, why: str
) -> None:
    schema = pa.schema(
        [*SCHEMA, pa.field("f", pa.float64()), pa.field("t", pa.timestamp("us", tz="UTC"))]
    )
    assert bind(op, column, value, schema) is None, why


def test_bind_accepts_null_tests_on_any_type() -> None:
    schema = pa.schema([pa.field("f", pa.float64()), pa.field("l", pa.list_(pa.int32()))])
    assert bind("is_null", "f", None, schema) == Pred("is_null", "f")
    assert bind("is_not_null", "l", None, schema) == Pred("is_not_null", "l")


# --- shards: filtered reads and skipping ---------------------------------------------------


class CountingBlob:
    """Counts ranged gets per part key (a footer read is one get, each chunk one more)."""

    def __init__(self, blob: Any) -> None:
        self.blob = blob
        self.gets: dict[str, int] = {}

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.gets[key] = self.gets.get(key, 0) + 1
        data: bytes = self.blob.get_range(key, offset, length)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.blob, name)


#: Parts of many small chunks (each filtered read below can skip most of them).
SMALL_CHUNKS = {"chunk_bytes": 2000}


def orders(lo: int, hi: int, time: int) -> pa.Table:
    n = hi - lo
    return pa.table(
        {
            "id": pa.array(range(lo, hi), pa.int64()),
            "day": pa.array(
                [dt.date(2024, 1, 1) + dt.timedelta(days=i // 10) for i in range(lo, hi)]
            ),
            "note": pa.array([None if i % 7 == 0 else f"n{i % 13}" for i in range(lo, hi)]),
            TIME: pa.array([time] * n, pa.int64()),
            DIFF: pa.array([1] * n, pa.int64()),
        }
    )


def test_chunks_outside_the_filter_are_never_fetched(tmp_path: Any) -> None:
    shard = ps.open_shard(str(tmp_path / "s"), **SMALL_CHUNKS)
    shard.append(orders(0, 3000, 0), new_upper=1)
    shard.append(orders(3000, 6000, 1), new_upper=2)
    state = shard.inspect.state()
    keys = [p.key for b in state.trace for p in b.parts]
    total_chunks = sum(
        len(parts.open_part(shard._blob, p).chunks) for b in state.trace for p in b.parts
    )
    assert total_chunks > 40
    day = dt.date(2024, 1, 1) + dt.timedelta(days=420)  # ids 4200..4209, in the second part
    pred = bind("eq", "day", day, state.schema)
    assert pred is not None
    q = snapshot_query(state, 1, shard.location)

    counting = CountingBlob(shard._blob)
    tasks = plan_read(counting, state, q, row_filter=pred)  # type: ignore[arg-type]
    planned = dict(counting.gets)
    assert planned == {k: 1 for k in keys}  # planning reads each footer once, no chunk
    counting.gets.clear()
    got = pa.concat_tables([read_task(counting, t) for t in tasks])  # type: ignore[arg-type]
    fetched_chunks = sum(n - 1 for n in counting.gets.values())  # minus the footer read
    assert list(counting.gets) == [keys[1]]  # the first part is never opened by a task
    assert 1 <= fetched_chunks <= 2, fetched_chunks
    assert got.column("id").to_pylist() == list(range(4200, 4210))

    # without the filter every chunk is fetched
    counting.gets.clear()
    for t in plan_read(counting, state, q):  # type: ignore[arg-type]
        read_task(counting, t)  # type: ignore[arg-type]
    assert sum(n - 1 for n in counting.gets.values()) == total_chunks


def test_filters_on_non_key_columns_skip_by_their_own_statistics(tmp_path: Any) -> None:
    """`note` is not the sort column: version 2 statistics still rule chunks out."""
    shard = ps.open_shard(str(tmp_path / "s"), **SMALL_CHUNKS)
    table = orders(0, 2000, 0)
    notes = [None] * 1000 + [f"late-{i}" for i in range(1000)]  # nulls first, then values
    table = table.set_column(2, "note", pa.array(notes))
    shard.append(table, new_upper=1)
    state = shard.inspect.state()
    q = snapshot_query(state, 0, shard.location)
    counting = CountingBlob(shard._blob)
    pred = conjunction(
        [
            bind("starts_with", "note", "late-99", state.schema),
            bind("is_not_null", "note", None, state.schema),
        ]  # type: ignore[list-item]
    )
    (task,) = plan_read(counting, state, q, row_filter=pred)  # type: ignore[arg-type]
    counting.gets.clear()
    got = read_task(counting, task)  # type: ignore[arg-type]
    reader = parts.open_part(shard._blob, state.trace[0].parts[0])
    assert sum(counting.gets.values()) - 1 < len(reader.chunks) // 3
    assert sorted(got.column("note").to_pylist()) == sorted(
        [n for n in notes if n is not None and n.startswith("late-99")]
    )


@pytest.mark.parametrize("split", [False, True])
def test_filtered_reads_equal_filtering_the_answer(tmp_path: Any, split: bool) -> None:
    """Snapshots (rows repeated over times, retractions included) and change reads."""
    shard = ps.open_shard(str(tmp_path / "s"), **SMALL_CHUNKS)
    shard.append(orders(0, 1500, 0), new_upper=1)
    retract = orders(0, 1500, 1).slice(
        0,
        1500,
    )
    retract = retract.set_column(
        4, DIFF, pa.array([-1 if i % 3 == 0 else 1 for i in range(1500)], pa.int64())
    )
    shard.append(retract, new_upper=2)
    shard.append(orders(700, 2200, 2), new_upper=3)
    state = shard.inspect.state()
    schema = state.schema
    filters = [
        bind("ge", "id", 600, schema),
        conjunction(
            [bind("lt", "day", dt.date(2024, 4, 1), schema), bind("contains", "note", "1", schema)]
        ),  # type: ignore[list-item]
        Pred("not", children=(bind("in", "note", ("n1", None), schema),)),  # type: ignore[arg-type]
        bind("is_null", "note", None, schema),
    ]
    size = 4000 if split else 1 << 30
    for pred in filters:
        assert pred is not None
        for q in (
            snapshot_query(state, 2, shard.location, with_diff=True),
            snapshot_query(state, 1, shard.location, with_diff=True),
            updates_query(state, 0, 3, shard.location),
            updates_query(state, 2, 3, shard.location),
        ):
            whole = pa.concat_tables(
                [
                    read_task(shard._blob, t)
                    for t in plan_read(shard._blob, state, q, partition_bytes=size)
                ]
            )
            tasks = plan_read(shard._blob, state, q, row_filter=pred, partition_bytes=size)
            assert len(tasks) > 1 or not split
            got = pa.concat_tables([read_task(shard._blob, t) for t in tasks])
            expected = filter_table(whole, pred)
            key = [(c, "ascending") for c in got.column_names]
            assert got.sort_by(key).equals(expected.sort_by(key)), (str(pred), q)


def test_inspect_shows_per_column_statistics(tmp_path: Any, capsys: Any) -> None:
    import json

    from persistshard.cli import main

    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(orders(0, 50, 0), new_upper=1)
    shard.append(orders(50, 120, 1), new_upper=2)
    assert main(["inspect", location, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["column_statistics"]
    assert stats["id"] == {
        "min": 0,
        "max": 119,
        "null_count": 0,
        "chunks": 2,
        "chunks_with_bounds": 2,
    }
    assert (stats["day"]["min"], stats["day"]["max"]) == ("2024-01-01", "2024-01-12")
    assert stats["note"]["null_count"] == len([i for i in range(120) if i % 7 == 0])
    assert (stats["_time"]["min"], stats["_time"]["max"]) == (0, 1)
    assert main(["inspect", location]) == 0
    text = capsys.readouterr().out
    assert "  id: 0 .. 119, 0 nulls, bounds in 2/2 chunks" in text


def test_key_range_tasks_partition_the_rows(tmp_path: Any) -> None:
    """Split reads (chunks wholly inside a task's key range skip the range filter, chunks
    across a boundary are filtered) return exactly the single-task read: overlapping parts,
    null keys and rows on the boundaries included."""
    shard = ps.open_shard(str(tmp_path / "s"))
    for t, (lo, hi) in enumerate([(0, 4000), (2000, 6000), (3000, 3500)]):
        ids: list[int | None] = list(range(lo, hi))
        ids[::97] = [None] * len(ids[::97])
        n = len(ids)
        shard.append(
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "v": pa.array([str(i) for i in range(n)]),
                    "_time": pa.array([t] * n, pa.int64()),
                    "_diff": pa.array([1] * n, pa.int64()),
                }
            ),
            new_upper=t + 1,
        )
    state = shard.inspect.state()
    q = snapshot_query(state, 2, shard.location, with_diff=True)
    whole = read_task(shard._blob, plan_read(shard._blob, state, q, max_partitions=1)[0])
    tasks = plan_read(shard._blob, state, q, partition_bytes=2000)
    assert len(tasks) > 2
    got = pa.concat_tables([read_task(shard._blob, t) for t in tasks])
    key = [(c, "ascending") for c in got.column_names]
    assert got.sort_by(key).equals(whole.sort_by(key))


def test_streamed_pieces_equal_the_whole_answer(tmp_path: Any, monkeypatch: Any) -> None:
    """`iter_task` streams a snapshot chunk by chunk only when nothing needs consolidating;
    its pieces always add up to `read_task`'s answer (as a multiset when ``as_multiset``)."""
    from persistshard.core.read.plan import iter_task

    shard = ps.open_shard(str(tmp_path / "s"), chunk_bytes=4096)  # many chunks per part
    n = 3000
    base = {"id": pa.array(range(n), pa.int64()), "v": pa.array([str(i % 13) for i in range(n)])}
    shard.append(pa.table({**base, "_time": [0] * n, "_diff": [1] * n}), new_upper=1)
    state = shard.inspect.state()
    q = snapshot_query(state, 0, shard.location)
    for multiset in (False, True):
        for task in plan_read(shard._blob, state, q, partition_bytes=4000):
            pieces = list(iter_task(shard._blob, task, as_multiset=multiset))
            assert len(pieces) > 1  # one part at one time: streamed
            whole = read_task(shard._blob, task, as_multiset=multiset)
            assert pa.concat_tables(pieces).equals(whole)
    # a second append at another time: streamed only as a multiset of positive diffs
    shard.append(pa.table({**base, "_time": [1] * n, "_diff": [1] * n}), new_upper=2)
    shard.append(
        pa.table({"id": pa.array([5], pa.int64()), "v": ["5"], "_time": [2], "_diff": [-1]}),
        new_upper=3,
    )
    for as_of, streams in ((1, True), (2, False)):
        state = shard.inspect.state()
        q = snapshot_query(state, as_of, shard.location)
        (task,) = plan_read(shard._blob, state, q, max_partitions=1)
        pieces = list(iter_task(shard._blob, task, as_multiset=True))
        assert (len(pieces) > 1) == streams
        key = [(c, "ascending") for c in pieces[0].column_names]
        got = pa.concat_tables(pieces).sort_by(key)
        assert got.equals(read_task(shard._blob, task, as_multiset=True).sort_by(key))
        expected = read_task(shard._blob, task)  # consolidated
        rows = got.group_by(["id", "v"]).aggregate([(DIFF, "sum")])
        rows = rows.rename_columns(["id", "v", DIFF]).sort_by(key)
        assert rows.cast(expected.schema).equals(expected.sort_by(key))


def test_a_read_spreads_over_min_partitions_when_each_gets_a_mebibyte(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """One part far below ``partition_bytes`` still splits into ``min_partitions`` tasks when
    each would get ``min_task_bytes`` (here 20,000); the tasks' answers add up to the whole."""
    shard = ps.open_shard(str(tmp_path / "s"), chunk_bytes=4096)
    n = 20_000
    rng = np.random.default_rng(2)
    table = pa.table(
        {
            "id": pa.array(rng.permutation(n), pa.int64()),
            "v": pa.array([f"value {i}" for i in range(n)]),
            "_time": pa.array([0] * n, pa.int64()),
            "_diff": pa.array([1] * n, pa.int64()),
        }
    )
    shard.append(table, new_upper=1)
    state = shard.inspect.state()
    size = sum(r.size for r in relevant_parts(state, snapshot_query(state, 0, None)))
    assert 3 * 20_000 < size < 24 << 20
    q = snapshot_query(state, 0, shard.location)
    assert len(plan_read(shard._blob, state, q, min_task_bytes=20_000)) == 1
    tasks = plan_read(shard._blob, state, q, min_partitions=3, min_task_bytes=20_000)
    assert len(tasks) == 3
    assert len(plan_read(shard._blob, state, q, min_partitions=3)) < 3  # a mebibyte each
    whole = read_task(shard._blob, plan_read(shard._blob, state, q)[0])
    got = pa.concat_tables([read_task(shard._blob, t) for t in tasks])
    assert got.sort_by("id").equals(whole.sort_by("id"))
    # never more tasks than the bytes allow
    spread = plan_read(shard._blob, state, q, min_partitions=10_000, min_task_bytes=20_000)
    assert len(spread) <= size // 20_000


def _overlapping_appends(tmp_path: Any, retract: bool) -> ps.Shard:
    """Four appends of shuffled keys (every part spans the whole key range), in several
    chunks (of 8 KiB) each; with ``retract`` the last one retracts a row of the first."""
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, chunk_bytes=8192)
    rng = np.random.default_rng(5)
    ids = rng.permutation(8_000)
    for i in range(4):
        chunk = ids[i * 2000 : (i + 1) * 2000]
        rows = pa.table(
            {"id": pa.array(chunk, pa.int64()), "v": pa.array([f"v{x}" for x in chunk])}
        )
        if retract and i == 3:
            first = int(ids[0])
            rows = pa.table(
                {
                    "id": pa.array([first, *chunk], pa.int64()),
                    "v": pa.array([f"v{first}", *[f"v{x}" for x in chunk]]),
                    "_diff": pa.array([-1] + [1] * len(chunk), pa.int64()),
                }
            )
        shard.append(rows)
    return shard


def test_multiset_snapshot_of_overlapping_parts_reads_each_chunk_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot whose rows are repeated by their counts needs no consolidation across parts
    when every diff is positive: it splits by chunk, and every chunk is decoded by exactly one
    task, where a key-range split over parts of shuffled keys decodes every chunk in every
    task. The tasks' answers still add up to the snapshot."""
    shard = _overlapping_appends(tmp_path, retract=False)
    state = shard.inspect.state()
    q = snapshot_query(state, state.upper - 1, shard.location)
    by_range = plan_read(shard._blob, state, q, partition_bytes=20_000)
    by_chunk = plan_read(shard._blob, state, q, partition_bytes=20_000, multiset=True)
    assert len(by_range) > 1 and len(by_chunk) > 1
    assert all(t.key_range is None for t in by_chunk)

    def decoded(tasks: list[Any]) -> list[tuple[str, int]]:
        return [(s.ref.key, c) for t in tasks for s in t.slices for c in s.chunks or ()]

    every = decoded(by_chunk)
    assert len(every) == len(set(every))  # no chunk twice
    assert len(decoded(by_range)) > len(every)  # the key-range split re-reads chunks
    assert set(decoded(by_range)) == set(every)
    got = pa.concat_tables([read_task(shard._blob, t, as_multiset=True) for t in by_chunk])
    assert got.sort_by("id").equals(shard.snapshot().sort_by("id"))
    scanned = shard.scan().to_arrow().sort_by("id")
    assert scanned.equals(shard.snapshot().drop_columns([DIFF]).sort_by("id"))


def test_snapshot_with_a_retraction_keeps_the_key_range_split(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A negative diff must meet its row's other updates in one task: no chunk split then,
    and the streamed scan drops the retracted row."""
    shard = _overlapping_appends(tmp_path, retract=True)
    state = shard.inspect.state()
    q = snapshot_query(state, state.upper - 1, shard.location)
    tasks = plan_read(shard._blob, state, q, partition_bytes=20_000, multiset=True)
    assert len(tasks) > 1 and all(t.key_range is not None for t in tasks)
    expected = shard.snapshot()
    assert expected.num_rows == 7_999
    got = ps.open_shard(shard.location).scan().to_arrow().sort_by("id")
    assert got.equals(expected.drop_columns([DIFF]).sort_by("id"))


def test_run_ahead_answers_in_order_and_leaves_no_work_behind() -> None:
    """`run_ahead` yields each job's result in the jobs' order, whatever order they finish
    in; a job's error reaches the consumer at its turn; a consumer that stops early leaves
    no job running (those not started are cancelled, those under way waited for)."""
    import threading
    import time

    from persistshard.core.read.plan import run_ahead

    def job(i: int, in_thread: bool) -> int:
        time.sleep(0.002 * (7 - i % 7))  # later jobs finish first
        return i

    jobs = [functools.partial(job, i) for i in range(30)]
    assert list(run_ahead(jobs, 3)) == list(range(30))
    alone: list[bool] = []
    assert list(run_ahead([lambda in_thread: alone.append(in_thread) or 5])) == [5]
    assert alone == [False]  # a single job runs in the caller's thread, free to use the pool

    def failing(in_thread: bool) -> int:
        raise ValueError("chunk 3 is bad")

    with pytest.raises(ValueError, match="chunk 3 is bad"):
        list(run_ahead([*jobs[:3], failing, *jobs[3:]], 2))

    started: list[int] = []
    running = threading.Event()
    finished: list[int] = []

    def slow(i: int, in_thread: bool) -> int:
        started.append(i)
        running.set()
        time.sleep(0.05)
        finished.append(i)
        return i

    stream = run_ahead([functools.partial(slow, i) for i in range(50)], 2)
    assert next(stream) == 0
    stream.close()
    assert sorted(finished) == sorted(started)  # nothing still under way after close
    assert len(started) < 50


def test_snapshot_reads_leave_times_undecoded(tmp_path: Any, monkeypatch: Any) -> None:
    """A snapshot needs no `_time` when every time of a part is at or before ``as_of``: the
    column is neither decoded nor, when it lies between wanted columns, fetched apart (one
    get per chunk). A part with later times decodes it (rows after ``as_of`` are dropped)."""
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, chunk_bytes=4096)
    shard.append(orders(0, 3000, 0), new_upper=1)
    shard.append(orders(3000, 6000, 1), new_upper=2)
    decoded: list[str] = []
    original = PartReader._decode_segment

    def spy(self: PartReader, index: int, col: int, data: Any) -> Any:
        decoded.append(self.schema.names[col])
        return original(self, index, col, data)

    monkeypatch.setattr(PartReader, "_decode_segment", spy)
    state = shard.inspect.state()
    counting = CountingBlob(shard._blob)
    q = snapshot_query(state, 1, shard.location)
    tasks = plan_read(counting, state, q)  # type: ignore[arg-type]
    counting.gets.clear()
    got = pa.concat_tables([read_task(counting, t) for t in tasks])  # type: ignore[arg-type]
    assert got.num_rows == 6000 and TIME not in got.column_names
    assert decoded and TIME not in decoded
    chunks = sum(len(parts.open_part(shard._blob, p).chunks) for b in state.trace for p in b.parts)
    # one get per chunk (less each part's footer): _time's bytes read through, not skipped
    assert sum(n - 1 for n in counting.gets.values()) == chunks
    assert shard.scan().to_arrow().num_rows == 6000
    assert TIME not in decoded
    mixed = pa.concat_tables([orders(6000, 6010, 2), orders(6010, 6020, 3)])
    shard.append(mixed, new_upper=4)  # one part of times 2 and 3
    decoded.clear()
    got = shard.scan(as_of=2).to_arrow().column("id").to_pylist()
    assert sorted(got) == list(range(6010))
    assert TIME in decoded  # the mixed part, read as of 2: its times filter its rows
