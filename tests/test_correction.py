"""Correction buffer: property tests against a dictionary of (row, time) -> diff.

Every read is compared with the reference: the updates' contents as a dictionary (rows made
hashable under the rows.py rule: NaNs equal, -0.0 != 0.0), their order checked with
rows.sort_indices (the one rule), and `check_invariants` runs after every operation.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import struct
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conformance_helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from persistshard.core import rows
from persistshard.core.write.correction import TIME_END, Correction
from persistshard.errors import InvalidUpdates

SCHEMA = pa.schema(
    [("k", pa.int64()), ("s", pa.string()), ("_time", pa.int64()), ("_diff", pa.int64())]
)


def canon(value: Any) -> Any:
    """A hashable stand-in for a value, equal exactly when rows.py says the values are."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("f", struct.pack(">d", value))
    if isinstance(value, list):
        return ("list", tuple(canon(v) for v in value))
    if isinstance(value, dict):
        return ("struct", tuple((k, canon(v)) for k, v in value.items()))
    return value


class Reference:
    """The plain model: a dictionary of (row, time) to diff, advanced to since when read."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        self.diffs: dict[tuple[Any, int], int] = defaultdict(int)
        self.since = 0

    def insert(self, table: pa.Table) -> None:
        data = table.to_pydict()
        for i in range(table.num_rows):
            row = tuple(canon(data[c][i]) for c in self.columns)
            self.diffs[(row, data["_time"][i])] += data["_diff"][i]

    def read(self, lower: int, upper: int) -> dict[tuple[Any, int], int]:
        out: dict[tuple[Any, int], int] = defaultdict(int)
        for (row, time), diff in self.diffs.items():
            time = max(time, self.since)
            if lower <= time < upper:
                out[(row, time)] += diff
        return {key: diff for key, diff in out.items() if diff}


def contents(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> dict[tuple[Any, int], int]:
    """The updates read, as a dictionary; asserts they are sorted, consolidated and bounded."""
    batches = list(batches)
    table = pa.Table.from_batches(batches, schema=schema)
    columns = rows.row_columns(schema)
    order = rows.sort_indices(table, columns, "time_row").to_numpy()
    assert (order == np.arange(table.num_rows)).all(), "not sorted by (time, row)"
    data = table.to_pydict()
    out: dict[tuple[Any, int], int] = {}
    for i in range(table.num_rows):
        key = (tuple(canon(data[c][i]) for c in columns), data["_time"][i])
        assert key not in out, f"not consolidated: {key} twice"
        assert data["_diff"][i] != 0, "zero diff"
        out[key] = data["_diff"][i]
    return out


near_times = st.integers(0, 40)
far_times = st.one_of(st.integers(41, 5000), st.integers(2**40, 2**62))
times = st.one_of(near_times, near_times, near_times, far_times)
diffs = st.sampled_from([-2, -1, 1, 1, 2])


@st.composite
def batches(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(1, 60))
    return pa.table(
        {
            "k": draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)),
            "s": draw(st.lists(st.sampled_from(["a", "b", "", None]), min_size=n, max_size=n)),
            "_time": draw(st.lists(times, min_size=n, max_size=n)),
            "_diff": draw(st.lists(diffs, min_size=n, max_size=n)),
        },
        schema=SCHEMA,
    )


class CorrectionMachine(RuleBasedStateMachine):
    """Random inserts, since advances and reads; every answer equals the reference's."""

    budget: int | None = None

    @initialize(
        chunk_bytes=st.sampled_from([200, 600, 4000]), proportionality=st.sampled_from([2, 3])
    )
    def start(self, chunk_bytes: int, proportionality: int) -> None:
        self.correction = Correction(
            SCHEMA,
            chunk_bytes=chunk_bytes,
            chain_proportionality=proportionality,
            budget_bytes=self.budget,
        )
        self.reference = Reference(["k", "s"])

    def teardown(self) -> None:
        if hasattr(self, "correction"):
            self.correction.close()

    @rule(table=batches())
    def insert(self, table: pa.Table) -> None:
        self.correction.insert(table)
        self.reference.insert(table)

    @rule(table=batches())
    def insert_batch(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.correction.insert(batch)
        self.reference.insert(table)

    @rule(data=st.data())
    def insert_retractions(self, data: st.DataObject) -> None:
        """Retract part of what a read would return, as a writer's feedback does."""
        upper = data.draw(st.integers(0, 45))
        current = self.reference.read(0, upper)
        if not current:
            return
        keys = sorted(current, key=repr)[: data.draw(st.integers(1, len(current)))]
        table = pa.table(
            {
                "k": [key[0][0] for key in keys],
                "s": [key[0][1] for key in keys],
                "_time": [key[1] for key in keys],
                "_diff": [-current[key] for key in keys],
            },
            schema=SCHEMA,
        )
        self.correction.insert(table)
        self.reference.insert(table)

    @rule(since=st.integers(0, 45))
    def advance_since(self, since: int) -> None:
        self.correction.advance_since(since)
        self.reference.since = max(self.reference.since, since)

    @rule(upper=st.one_of(st.integers(0, 50), st.integers(0, 6000), st.just(TIME_END - 1)))
    def updates_before(self, upper: int) -> None:
        got = contents(self.correction.updates_before(upper), SCHEMA)
        assert got == self.reference.read(0, upper)

    @rule(upper=st.integers(0, 50))
    def consolidate_before(self, upper: int) -> None:
        self.correction.consolidate_before(upper)

    @rule(lower=st.one_of(st.integers(0, 50), st.integers(0, 6000)))
    def updates_from(self, lower: int) -> None:
        got = contents(self.correction.updates_from(lower), SCHEMA)
        assert got == self.reference.read(lower, TIME_END)

    @precondition(lambda self: hasattr(self, "correction"))
    @invariant()
    def invariants_hold(self) -> None:
        self.correction.check_invariants()
        everything = contents(self.correction.updates_from(0), SCHEMA)
        assert everything == self.reference.read(0, TIME_END)
        if self.budget is not None:
            assert self.correction.size_bytes <= self.budget + self.correction._chunk_bytes


class SpillingCorrectionMachine(CorrectionMachine):
    """The same, with a budget far below the data, so that chains spill and merge back."""

    budget = 1500


TestCorrection = CorrectionMachine.TestCase
TestCorrection.settings = settings(
    max_examples=examples(40),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestSpillingCorrection = SpillingCorrectionMachine.TestCase
TestSpillingCorrection.settings = settings(
    max_examples=examples(25),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- the rows.py rule: floats and nested values ------------------------------------------------

FANCY = pa.schema(
    [
        ("x", pa.float64()),
        ("tags", pa.list_(pa.int64())),
        ("_time", pa.int64()),
        ("_diff", pa.int64()),
    ]
)
NAN_OTHER = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]
floats = st.sampled_from([0.0, -0.0, 1.5, -1.5, math.nan, NAN_OTHER, math.inf, None])
tags = st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=2))


@st.composite
def fancy_batches(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(1, 30))
    return pa.table(
        {
            "x": draw(st.lists(floats, min_size=n, max_size=n)),
            "tags": draw(st.lists(tags, min_size=n, max_size=n)),
            "_time": draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)),
            "_diff": draw(st.lists(diffs, min_size=n, max_size=n)),
        },
        schema=FANCY,
    )


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inserts=st.lists(fancy_batches(), min_size=1, max_size=6),
    since=st.integers(0, 12),
    upper=st.integers(0, 14),
    budget=st.sampled_from([None, 1500]),
)
def test_float_and_nested_rows_follow_the_rows_rule(
    inserts: list[pa.Table], since: int, upper: int, budget: int | None
) -> None:
    reference = Reference(["x", "tags"])
    with Correction(FANCY, chunk_bytes=300, budget_bytes=budget) as correction:
        for table in inserts:
            correction.insert(table)
            reference.insert(table)
            correction.check_invariants()
        correction.advance_since(since)
        reference.since = since
        assert contents(correction.updates_before(upper), FANCY) == reference.read(0, upper)
        correction.check_invariants()
        assert contents(correction.updates_from(upper), FANCY) == reference.read(upper, TIME_END)


def test_nan_payloads_consolidate_and_signed_zeros_do_not() -> None:
    table = pa.table(
        {
            "x": [math.nan, NAN_OTHER, 0.0, -0.0, 0.0],
            "tags": [[1], [1], None, None, None],
            "_time": [3, 3, 3, 3, 3],
            "_diff": [1, 1, 1, 1, -1],
        },
        schema=FANCY,
    )
    with Correction(FANCY) as correction:
        correction.insert(table)
        out = pa.Table.from_batches(list(correction.updates_before(10)), schema=FANCY)
    assert out.to_pydict()["_diff"] == [1, 2]  # -0.0 sorts before NaN; 0.0 cancelled
    assert struct.pack(">d", out.column("x")[0].as_py()) == struct.pack(">d", -0.0)


# -- the structure of the seed -------------------------------------------------------------------


def _table(keys: Iterable[int], times: Iterable[int], diff: int = 1) -> pa.Table:
    keys = list(keys)
    times = list(times)
    return pa.table(
        {
            "k": keys,
            "s": ["x"] * len(keys),
            "_time": times,
            "_diff": [diff] * len(keys),
        },
        schema=SCHEMA,
    )


def test_small_inserts_wait_in_the_stage_until_a_chunk_gathers() -> None:
    correction = Correction(SCHEMA, chunk_bytes=10_000)
    correction.insert(_table(range(10), [5] * 10))
    assert len(correction._stage) == 1
    assert not any(b.chains for b in correction._buckets)
    for i in range(500):
        correction.insert(_table([i], [5]))
    assert not correction._stage or correction._stage_bytes < 10_000
    assert any(b.chains for b in correction._buckets)
    correction.check_invariants()


def test_chain_invariant_bounds_the_number_of_chains() -> None:
    correction = Correction(SCHEMA, chunk_bytes=2_000, chain_proportionality=3)
    for i in range(300):
        correction.insert(_table(range(i * 50, i * 50 + 50), [7] * 50))
        correction.check_invariants(deep=False)
    bucket = next(b for b in correction._buckets if b.lower <= 7 < b.upper)
    sizes = [len(c) for c in bucket.chains]
    assert sum(sizes) + sum(t.num_rows for t in correction._stage) == 15_000
    assert len(sizes) <= math.log(15_000, 3) + 1
    assert all(a >= 3 * b for a, b in itertools.pairwise(sizes))


def test_reads_leave_far_future_buckets_untouched() -> None:
    correction = Correction(SCHEMA, chunk_bytes=4_000)
    correction.insert(_table(range(5_000), np.full(5_000, 1_000_000), diff=-1))
    correction.insert(_table(range(100), [3] * 100))
    correction.check_invariants()
    far = [(b, list(b.chains)) for b in correction._buckets if b.lower >= 1 << 19 and b.chains]
    assert far
    merges = correction.stats["merges"]
    got = contents(correction.updates_before(10), SCHEMA)
    assert len(got) == 100
    assert correction.stats["merges"] - merges <= 1
    for bucket, chains in far:
        assert bucket in correction._buckets
        assert all(a is b for a, b in zip(bucket.chains, chains, strict=True))
    assert correction.boundary == 10
    assert correction._buckets[0].lower == 10
    assert len(correction) == 5_100
    assert len(contents(correction.updates_from(10), SCHEMA)) == 5_000
    correction.check_invariants()


def test_late_inserts_go_to_pending_low_and_emitted_keeps_the_last_read() -> None:
    correction = Correction(SCHEMA, chunk_bytes=200)
    correction.insert(_table(range(20), [5] * 20))
    assert len(contents(correction.updates_before(8), SCHEMA)) == 20
    assert len(correction._emitted) == 20
    correction.insert(_table(range(20), [5] * 20, diff=-1))  # the writer's feedback
    correction.insert(_table([100], [2]))
    assert sum(len(c) for c in correction._pending_low) >= 1
    correction.check_invariants()
    got = contents(correction.updates_before(8), SCHEMA)
    assert got == {((100, "x"), 2): 1}
    # A smaller upper puts the rest of emitted back into pending_low.
    assert contents(correction.updates_before(1), SCHEMA) == {}
    assert contents(correction.updates_before(8), SCHEMA) == {((100, "x"), 2): 1}
    correction.check_invariants()


def test_few_stale_times_merge_sub_chains_many_materialize() -> None:
    reference = Reference(["k", "s"])
    correction = Correction(SCHEMA, chunk_bytes=500)
    for t in range(3):
        table = _table(range(30), [t] * 30, diff=t + 1)
        correction.insert(table)
        reference.insert(table)
    correction.updates_before(10)
    correction.advance_since(5)
    reference.since = 5
    before = dict(correction.stats)
    assert contents(correction.updates_before(10), SCHEMA) == reference.read(0, 10)
    assert correction.stats["subchain_merges"] == before["subchain_merges"] + 1
    assert correction.stats["materialized_merges"] == before["materialized_merges"]

    many = Correction(SCHEMA, chunk_bytes=500)
    reference = Reference(["k", "s"])
    table = _table(np.arange(400) % 7, np.arange(400) % 40)
    many.insert(table)
    reference.insert(table)
    many.advance_since(30)
    reference.since = 30
    assert contents(many.updates_before(50), SCHEMA) == reference.read(0, 50)
    assert many.stats["materialized_merges"] == 1
    many.check_invariants()


def test_reads_with_upper_at_or_below_since_return_nothing() -> None:
    correction = Correction(SCHEMA)
    correction.insert(_table(range(5), [1] * 5))
    correction.advance_since(4)
    assert list(correction.updates_before(4)) == []
    assert len(contents(correction.updates_from(0), SCHEMA)) == 5
    assert contents(correction.updates_before(5), SCHEMA) == {((k, "x"), 4): 1 for k in range(5)}


# -- spilling ------------------------------------------------------------------------------


def _spill_files(directory: str) -> list[str]:
    return [os.path.join(root, f) for root, _, files in os.walk(directory) for f in files]


def test_spill_holds_memory_near_a_budget_far_below_the_data(tmp_path: Any) -> None:
    budget = 256 << 10
    rng = np.random.default_rng(7)
    reference: dict[tuple[int, int], int] = defaultdict(int)
    correction = Correction(SCHEMA, budget_bytes=budget, spill_dir=str(tmp_path))
    total_bytes = 0
    for _ in range(60):
        keys = rng.integers(0, 40_000, 2_000)
        times = np.where(rng.random(2_000) < 0.8, rng.integers(0, 10, 2_000), 10**9)
        table = _table(keys, times)
        total_bytes += table.nbytes
        correction.insert(table)
        for k, t in zip(keys.tolist(), times.tolist(), strict=True):
            reference[(k, t)] += 1
        assert correction.size_bytes <= budget + correction._chunk_bytes
    assert total_bytes > 10 * budget
    assert correction.stats["spilled_runs"] > 0
    assert _spill_files(str(tmp_path))
    correction.check_invariants()

    def expected(lo: int, hi: int) -> dict[tuple[Any, int], int]:
        return {((k, "x"), t): d for (k, t), d in reference.items() if lo <= t < hi}

    before = contents(correction.updates_before(10), SCHEMA)
    assert before == expected(0, 10)
    assert correction.size_bytes <= budget + correction._chunk_bytes
    assert correction.stats["streaming_merges"] > 0
    correction.check_invariants()
    assert contents(correction.updates_from(10), SCHEMA) == expected(10, TIME_END)
    assert len(reference) <= len(correction) <= 60 * 2_000  # far-future chains not merged yet
    correction.close()
    assert _spill_files(str(tmp_path)) == []
    assert os.listdir(tmp_path) == []


def test_spill_files_are_deleted_when_the_buffer_is_collected(tmp_path: Any) -> None:
    correction = Correction(SCHEMA, budget_bytes=20_000, spill_dir=str(tmp_path))
    for i in range(20):
        correction.insert(_table(range(i * 1000, i * 1000 + 1000), [i] * 1000))
    assert correction.stats["spilled_runs"] > 0
    assert _spill_files(str(tmp_path))
    del correction
    gc.collect()
    assert os.listdir(tmp_path) == []


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (_table([1], [-1]), "negative time -1"),
        (_table([1], [1], diff=0), "zero _diff"),
        (pa.table({"k": [1], "_time": [1], "_diff": [1]}), "expected"),
    ],
)
def test_invalid_updates_are_rejected(table: pa.Table, message: str) -> None:
    correction = Correction(SCHEMA)
    with pytest.raises(InvalidUpdates, match=f"^InvalidUpdates: Correction: .*{message}"):
        correction.insert(table)
    assert len(correction) == 0


def test_schema_without_time_is_rejected() -> None:
    with pytest.raises(InvalidUpdates, match=r"^InvalidUpdates: Correction needs an int64"):
        Correction(pa.schema([("k", pa.int64()), ("_diff", pa.int64())]))
