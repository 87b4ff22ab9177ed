"""Compaction: merges never change a read at or after since, levels stay ordered, work is
amortized O(log N) per batch, memory is bounded by chunks, lost races clean up after
themselves, and unsealed updates join the trace once the upper passes them."""

from __future__ import annotations

import itertools
import math
import random
import struct
import uuid
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest
from conformance_helpers import examples, rows_of, updates
from hypothesis import HealthCheck, settings
from hypothesis import strategies as hs
from hypothesis.stateful import rule

import persistshard as ps
from persistshard.conformance.model import make_shard_machine
from persistshard.core.maintenance import compact as cm
from persistshard.core.maintenance import trace
from persistshard.core.rows import advance_times, consolidate, row_columns
from persistshard.core.shard import write_transaction
from persistshard.core.statemachine.state import Batch, PartRef
from persistshard.core.storage import parts as parts_mod
from persistshard.core.storage.layout import new_id
from persistshard.core.write.validate import user_schema


@pytest.fixture
def shard(tmp_path) -> ps.Shard:
    return ps.open_shard(str(tmp_path / "orders"), maintenance=False)


def all_reads(shard: ps.Shard) -> dict:
    """Every answer a reader can get: snapshots at every valid as_of, and the updates."""
    state = shard.inspect.state()
    out: dict = {}
    if state.schema is None:
        return out
    for as_of in range(state.since, state.upper):
        out[as_of] = shard.snapshot(as_of).to_pylist()
    out["updates"] = shard.updates(0, state.upper).to_pylist()
    if state.since + 1 < state.upper:
        out["later"] = shard.updates(state.since + 1, state.upper).to_pylist()
    return out


def stored_keys(shard: ps.Shard) -> set[str]:
    return {m.key for m in shard._blob.list("parts/")}


# --- against the reference model ----------------------------------------------------------

_n = iter(range(10**9))
Base = make_shard_machine(lambda: f"memory://compaction-{uuid.uuid4().hex}-{next(_n)}/shard")


class CompactionMachine(Base):  # type: ignore[valid-type, misc]
    """The shard model's machine plus compactions (full, writer-sized, and stale ones that
    commit after the state moved on). Every read at every valid as_of must be the same
    before and after each of them; the inherited rules compare reads with the model, and
    the inherited invariant checks every state invariant (levels included) after each step."""

    @rule(full=hs.booleans())
    def compact(self, full: bool) -> None:
        if not self.model.created:  # nothing committed yet: no shard to compact
            with pytest.raises(ps.NoShard):
                self.shard.compact(full=full)
            return
        before = all_reads(self.shard)
        self.shard.compact(full=full)
        assert all_reads(self.shard) == before

    @rule(budget=hs.integers(1, 2))
    def maybe_compact(self, budget: int) -> None:
        if not self.model.created:
            with pytest.raises(ps.NoShard):
                self.shard._maybe_compact(budget)
            return
        before = all_reads(self.shard)
        self.shard._maybe_compact(budget)
        assert all_reads(self.shard) == before

    @rule(step=hs.integers(0, 2), rival=hs.booleans())
    def stale_compaction(self, step: int, rival: bool) -> None:
        """Plan and run a merge, let the state move (a seal, or a rival compaction), then
        commit: it lands only if its inputs are still there; if not, its parts are gone."""
        state = self.shard.inspect.state()
        plan = trace.next_plan(state) if state.schema is not None else None
        if plan is None:
            return
        result = cm.run_merge(
            self.shard._blob, plan, state.schema, write_id=new_id(), config=self.shard.config
        )
        if rival:
            self.other.compact()
        elif step:
            self.other.seal(self.model.upper + step)
            self.model.seal(self.model.upper + step)
        before = all_reads(self.shard)
        committed, _, _ = cm.commit_merge(self.shard._machine, plan, result)
        assert all_reads(self.shard) == before
        keys = stored_keys(self.shard)
        if not committed:
            assert not set(result.written_keys) & keys


TestCompactionModel = CompactionMachine.TestCase
TestCompactionModel.settings = settings(
    max_examples=examples(60),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- levels and amortized work ------------------------------------------------------------


def _append_batches(shard: ps.Shard, n: int, rows: int, after=None) -> list:
    reports = []
    for i in range(n):
        t = shard.upper
        shard.append(updates([(i * rows + j, "x", t, 1) for j in range(rows)]))
        if after is not None:
            reports.append(after(shard))
    return reports


def _digits(n: int, base: int) -> list[int]:
    out = []
    while n:
        n, d = divmod(n, base)
        out.append(d)
    return out


def _levels_after_appends(
    name: str, appends: int, **knobs: int
) -> Iterator[tuple[int, list[int], list[int]]]:
    """After each of ``appends`` appends of 3 distinct rows to a fresh shard (configured with
    ``knobs``), each followed by a level compaction: (appends so far, the trace's levels, its
    batches' row counts)."""
    shard = ps.open_shard(f"memory://{name}-{uuid.uuid4().hex}", maintenance=False, **knobs)
    for n in range(1, appends + 1):
        _append_batches(shard, 1, 3)
        shard.compact(full=False)
        state = shard.inspect.state()
        state.check()
        yield n, trace.levels(state), [b.num_rows for b in state.trace]


def test_levels_form_a_counter_in_base_fan_in(tmp_path):
    f = trace.FAN_IN
    for n, levels, rows in _levels_after_appends("levels", 3 * f * f + 1):
        # Equal-size appends that never consolidate: digit d of n in base FAN_IN is the
        # number of batches at level d, each of 3 * FAN_IN**d rows.
        assert sorted(levels, reverse=True) == levels
        digits = _digits(n, f)
        assert [levels.count(d) for d in range(len(digits))] == digits
        assert rows == [3 * f**lvl for lvl in levels]


def test_wide_batches_merge_in_fours():
    """Batches of at least ``compact_wide_rows`` updates merge WIDE_FAN_IN at a time, smaller
    ones FAN_IN at a time: with 3-row appends and a threshold of 24 rows, the levels count n in
    the mixed radix (FAN_IN, WIDE_FAN_IN, WIDE_FAN_IN, ...)."""
    f, w = trace.FAN_IN, trace.WIDE_FAN_IN
    assert 1 < w < f
    wide_rows = 3 * f
    for n, levels, rows in _levels_after_appends(
        "wide", 3 * f * w + 1, compact_wide_rows=wide_rows
    ):
        digits = [n % f, *_digits(n // f, w)]
        assert [levels.count(d) for d in range(len(digits))] == digits
        assert rows == [3 * (f * w ** (lvl - 1) if lvl else 1) for lvl in levels]

    # A group is wide only when all of its first WIDE_FAN_IN batches are: one small batch
    # among them makes the level wait for FAN_IN.
    def batch(rows: int) -> Batch:
        return Batch(new_id(), 0, 1, (PartRef(f"parts/{new_id()}.part", 1, rows, 0, 0),), 1)

    small = [batch(3 * f - 1)]
    wide = [batch(3 * f) for _ in range(w)]
    assert trace.fan_in(wide, wide_rows=wide_rows) == w
    assert trace.fan_in(small + wide, wide_rows=wide_rows) == f
    assert trace.fan_in(small + wide, 1, wide_rows=wide_rows) == w
    assert trace.fan_in(wide[:-1], wide_rows=wide_rows) == f
    assert trace.fan_in(wide) == f  # at the default threshold (4,096 updates) they are small


@pytest.mark.parametrize("budget", [1, None])
def test_merge_work_is_amortized_log_n(budget):
    """N appends of R rows each, compacting after every append (a writer's budget of one
    merge, or everything due): every row is rewritten at most once per level, so the total is
    at most N * R * log2(N), and the trace keeps O(log N) batches."""
    shard = ps.open_shard(f"memory://work-{uuid.uuid4().hex}", maintenance=False)
    n, rows = 128, 4

    def after(s: ps.Shard):
        return s._maybe_compact(1) if budget == 1 else s.compact(full=False)

    reports = _append_batches(shard, n, rows, after)
    written = sum(r.rows_written for r in reports if r is not None)
    assert written <= n * rows * math.log2(n)
    assert written >= n * rows  # it did merge
    state = shard.inspect.state()
    assert len(state.trace) <= 2 * math.log2(n) + 2
    # No single call rewrote more than twice the rows appended so far (a full carry chain).
    assert all(r is None or r.rows_written <= 2 * n * rows for r in reports)


def test_a_row_updated_many_times_before_since_costs_one_update(shard):
    shard.append(updates([(1, "v0", 0, 1)]))
    for t in range(1, 121):
        shard.append(updates([(1, f"v{(t - 1) % 2}", t, -1), (1, f"v{t % 2}", t, 1)]))
        shard._maybe_compact()
    assert sum(b.num_rows for b in shard.inspect.state().trace) > 120
    shard.advance_since(shard.upper - 1)
    before = all_reads(shard)
    report = shard.compact()
    assert all_reads(shard) == before
    state = shard.inspect.state()
    assert sum(b.num_rows for b in state.trace) == 1
    assert report.levels_after == trace.levels(state)
    assert rows_of(shard.snapshot()) == {(1, "v0"): 1}


def test_compaction_consolidates_by_the_row_rule(shard):
    """NaNs are one value, -0.0 and 0.0 are two (core.rows): merges follow that rule."""
    nan1 = float("nan")
    nan2 = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000123))[0]  # another payload
    batches = [
        [(nan1, 1), (0.0, 1), (-0.0, 1)],
        [(nan2, -1), (0.0, 1), (-0.0, -1)],
    ]
    for t, rows in enumerate(batches):
        shard.append(
            pa.table(
                {
                    "x": pa.array([r[0] for r in rows], pa.float64()),
                    "_time": pa.array([t] * len(rows), pa.int64()),
                    "_diff": pa.array([r[1] for r in rows], pa.int64()),
                }
            )
        )
    shard.advance_since(1)
    before = shard.snapshot().to_pylist()
    shard.compact()
    assert shard.snapshot().to_pylist() == before
    stored = shard.updates(0, 2).to_pylist()
    assert [(str(r["x"]), r["_diff"]) for r in stored] == [("0.0", 2)]


def test_nested_columns_merge(shard):
    for t in range(4):
        shard.append(
            pa.table(
                {
                    "s": pa.array([{"a": [1, t % 2]}, {"a": [2]}]),
                    "_time": pa.array([t, t], pa.int64()),
                    "_diff": pa.array([1, 1 if t % 2 == 0 else -1], pa.int64()),
                }
            )
        )
    shard.advance_since(3)
    before = all_reads(shard)
    shard.compact()
    assert all_reads(shard) == before


def test_full_compaction_leaves_one_run_and_then_has_nothing_to_do(shard):
    # One batch made of two overlapping runs (as a Spark write with two tasks makes).
    written = write_transaction(shard, new_id()).write_updates(
        updates([(i, "a", 0, 1) for i in range(0, 100, 2)]), lower=0, new_upper=1, schema=None
    )
    written.extend(
        write_transaction(shard, new_id()).write_updates(
            updates([(i, "a", 0, 1) for i in range(1, 100, 2)]), lower=0, new_upper=1, schema=None
        )
    )
    schema = user_schema(updates([]).schema)
    write_transaction(shard).commit(written, expected_upper=0, new_upper=1, schema=schema)
    state = shard.inspect.state()
    assert len(state.trace[0].parts) == 2 and not trace.is_one_run(state.trace[0])
    assert shard.compact(full=False).merges == []
    for t in range(1, 6):
        shard.append(updates([(t, "b", t, 1)]))
    before = all_reads(shard)
    shard.compact()
    assert all_reads(shard) == before
    (only,) = shard.inspect.state().trace
    assert trace.is_one_run(only) and len(only.parts) == 1
    assert shard.compact().merges == []
    shard.seal(9)
    report = shard.compact()  # an empty batch joins for free and the run stays one run
    assert [m.free for m in report.merges] == [True]
    assert trace.is_one_run(shard.inspect.state().trace[0])
    assert shard.compact().merges == []


# --- seals, lost races ------------------------------------------------------------------


def test_seals_merge_for_free(shard):
    shard.append(updates([(1, "a", 0, 1)]))
    for u in range(2, 10):
        shard.seal(u)
        shard.compare_and_append(None, u, u)  # an empty append is a no-op
    before = all_reads(shard)
    report = shard.compact()
    assert all_reads(shard) == before
    assert report.bytes_read == 0 and report.bytes_written == 0
    assert all(m.free for m in report.merges)
    assert len(shard.inspect.state().trace) == 1


def test_lost_race_deletes_outputs(shard):
    for t in range(trace.FAN_IN):
        shard.append(updates([(t, "a", t, 1)]))
    state = shard.inspect.state()
    plan = trace.next_plan(state)
    assert plan is not None and plan.reason == "level"
    result = cm.run_merge(shard._blob, plan, state.schema, write_id=new_id(), config=shard.config)
    assert result.written_keys and set(result.written_keys) <= stored_keys(shard)
    rival = ps.open_shard(shard.location, maintenance=False)
    rival.compact()
    committed, _, _ = cm.commit_merge(shard._machine, plan, result)
    assert not committed
    assert not set(result.written_keys) & stored_keys(shard)
    assert rows_of(shard.snapshot()) == {(t, "a"): 1 for t in range(trace.FAN_IN)}


def test_independent_merges_committed_in_any_order_keep_levels_ordered(shard):
    f = trace.FAN_IN
    for t in range(f * f + 2 * f):
        shard.append(updates([(t, "a", t, 1)]))
    shard.compact(max_merges=f)
    state = shard.inspect.state()
    assert trace.levels(state) == [1] * f + [0] * (2 * f)
    plans = trace.independent_plans(state)
    assert [p.input_ids for p in plans] == [
        [b.id for b in state.trace[i : i + f]] for i in (0, f, 2 * f)
    ]
    results = [
        cm.run_merge(shard._blob, p, state.schema, write_id=new_id(), config=shard.config)
        for p in plans
    ]
    for plan, result in reversed(list(zip(plans, results, strict=True))):  # newest first
        assert cm.commit_merge(shard._machine, plan, result)[0]
        shard.inspect.state().check()
    assert trace.levels(shard.inspect.state()) == [2, 1, 0]


def test_a_merge_that_would_break_level_order_is_refused(shard, monkeypatch):
    for t in range(3):
        shard.append(updates([(t, "a", t, 1)]))
    state = shard.inspect.state()
    plan = trace.MergePlan("level", state.trace[1:], since=0, upper_at_plan=state.upper)
    result = cm.run_merge(shard._blob, plan, state.schema, write_id=new_id(), config=shard.config)
    monkeypatch.setattr(trace, "commit_level", lambda *a: 1)  # above its predecessor's 0
    committed, _, _ = cm.commit_merge(shard._machine, plan, result)
    assert not committed
    assert not set(result.written_keys) & stored_keys(shard)
    assert trace.levels(shard.inspect.state()) == [0, 0, 0]


def test_commit_level_is_clamped_to_the_predecessor():
    from persistshard.core.statemachine.state import Batch, ShardState

    def batch(i: int, level: int, rows: int) -> Batch:
        ref = parts_mod.PartRef(f"parts/w/{i}.part", 10, rows, i, i)
        return Batch(id=str(i), lower=i, upper=i + 1, parts=(ref,), level=level)

    state = ShardState(upper=3, trace=(batch(0, 1, 5), batch(1, 1, 5), batch(2, 1, 5)))
    plan = trace.MergePlan("level", state.trace[1:], since=0, upper_at_plan=3)
    assert plan.natural_level(10) == 2
    assert trace.commit_level(plan, 10, state) == 1


# --- unsealed -----------------------------------------------------------------------------


def test_unsealed_updates_join_the_trace(shard):
    # Updates at 0 (sealed), 3..5 (unsealed, will be passed) and 20 (far ahead).
    shard.compare_and_append(
        updates(
            [
                (1, "now", 0, 1),
                (2, "soon", 3, 1),
                (3, "soon", 5, 1),
                (2, "soon", 4, -1),
                (9, "far", 20, 1),
            ]
        ),
        0,
        1,
    )
    shard.compare_and_append(updates([(7, "x", 1, 1)]), 1, 5)  # 3 and 4 now visible
    before = all_reads(shard)
    report = shard.compact()
    assert all_reads(shard) == before
    assert any(m.reason == "unsealed" for m in report.merges)
    state = shard.inspect.state()
    assert len(state.unsealed) == 1
    (u,) = state.unsealed
    assert (u.lower, u.upper, u.num_rows) == (5, 21, 2)  # trimmed: 5 and 20 remain
    trace_times = {r["_time"] for r in shard.updates(0, state.upper).to_pylist()}
    assert trace_times <= set(range(0, 5))
    shard.seal(21)
    assert rows_of(shard.snapshot()) == {
        (1, "now"): 1,
        (3, "soon"): 1,
        (7, "x"): 1,
        (9, "far"): 1,
    }
    shard.compact()
    assert shard.inspect.state().unsealed == ()
    assert rows_of(shard.snapshot()) == {
        (1, "now"): 1,
        (3, "soon"): 1,
        (7, "x"): 1,
        (9, "far"): 1,
    }


def test_fully_passed_unsealed_batches_are_dropped_and_far_parts_reused(shard):
    shard.compare_and_append(updates([(1, "a", 2, 1)]), 0, 1)
    shard.compare_and_append(updates([(2, "b", 1, 1)]), 1, 2)
    shard.compare_and_append(updates([(3, "c", 50, 1)]), 2, 3)
    far_parts = shard.inspect.state().unsealed[1].parts
    shard.seal(4)
    before = all_reads(shard)
    shard._maybe_compact(5)
    assert all_reads(shard) == before
    state = shard.inspect.state()
    assert len(state.unsealed) == 1
    assert state.unsealed[0].parts == far_parts  # not rewritten


# --- memory bound and output shape -------------------------------------------------------


def test_merge_memory_is_bounded_by_chunks_not_batches(shard):
    chunk = 16 << 10
    shard = ps.open_shard(shard.location, maintenance=False, chunk_bytes=chunk)
    rng = random.Random(7)
    k = 4
    for t in range(k):
        rows = [(rng.randrange(10**6), f"item-{rng.randrange(1000)}", t, 1) for _ in range(20000)]
        shard.append(updates(rows))
    state = shard.inspect.state()
    total = sum(b.num_rows for b in state.trace)
    plan = trace.MergePlan("level", state.trace, since=0, upper_at_plan=state.upper)
    result = cm.run_merge(shard._blob, plan, state.schema, write_id=new_id(), config=shard.config)
    stats = result.stats
    assert stats.chunks_read > 10 * k
    # At most one chunk per input run, the arriving chunk, and the bound row.
    assert stats.peak_buffered_bytes <= (k + 1) * chunk * 1.25
    assert stats.peak_buffered_bytes < updates([(0, "item-0", 0, 1)] * total).nbytes / 5
    assert result.rows_out == total


@pytest.mark.parametrize("seed", range(3))
def test_multi_chunk_merge_equals_sort_and_consolidate(shard, seed):
    """Tiny chunks, few distinct rows repeated across runs and chunk boundaries, times
    forwarded: the streaming merge equals sorting and consolidating everything at once."""
    shard = ps.open_shard(shard.location, maintenance=False, chunk_bytes=512)
    rng = random.Random(seed)
    for t in range(5):
        n = rng.randrange(50, 400)
        rows = [(rng.randrange(40), rng.choice("ab"), t, rng.choice([1, -1, 2])) for _ in range(n)]
        shard.append(updates(rows))
    shard.advance_since(3)
    state = shard.inspect.state()
    plan = trace.MergePlan("full", state.trace, since=3, upper_at_plan=state.upper)
    result = cm.run_merge(
        shard._blob, plan, state.schema, write_id=new_id(), config=shard.config, part_bytes=2048
    )
    assert result.stats.chunks_read > 10
    got = pa.concat_tables([parts_mod.read_part(shard._blob, p) for p in result.parts])
    inputs = [parts_mod.read_part(shard._blob, p) for b in state.trace for p in b.parts]
    want = consolidate(advance_times(pa.concat_tables(inputs), plan.floor))
    assert got.equals(want)


def test_outputs_are_cut_where_the_row_changes(shard):
    shard.append(updates([(i, "x", 0, 1) for i in range(1500)]))
    shard.append(updates([(i, "x", 1, 1) for i in range(1500)]))
    state = shard.inspect.state()
    plan = trace.next_plan(state)
    result = cm.run_merge(
        shard._blob, plan, state.schema, write_id=new_id(), config=shard.config, part_bytes=4096
    )
    assert len(result.parts) > 3
    tables = [parts_mod.read_part(shard._blob, p) for p in result.parts]
    for a, b in itertools.pairwise(tables):
        assert a.column("id")[-1].as_py() != b.column("id")[0].as_py()
    merged = pa.concat_tables(tables)
    expected = consolidate(
        pa.concat_tables(
            [parts_mod.read_part(shard._blob, p) for b in state.trace for p in b.parts]
        ),
        row_columns(merged.schema),
    )
    assert merged.equals(expected)
    assert [p.num_rows for p in result.parts] == [t.num_rows for t in tables]


def test_maybe_compact_is_a_no_op_when_nothing_is_due(shard):
    f = trace.FAN_IN
    with pytest.raises(ps.NoShard):  # before the first write there is no shard to compact
        shard._maybe_compact()
    for t in range(f - 1):
        shard.append(updates([(t, "a", t, 1)]))
        assert shard._maybe_compact() is None
    shard.append(updates([(f, "a", f - 1, 1)]))
    report = shard._maybe_compact()
    assert report is not None and report.committed == 1
    assert report.levels_before == [0] * f and report.levels_after == [1]
    assert report.to_json()["committed"] == 1


def test_snapshot_counts_match_after_random_history(tmp_path):
    """A longer random history with since trailing upper: compaction after every step."""
    shard = ps.open_shard(str(tmp_path / "random"), maintenance=False)
    rng = random.Random(3)
    truth: Counter = Counter()
    for step in range(60):
        t = shard.upper
        batch = [(rng.randrange(30), rng.choice("ab"), t, rng.choice([1, -1])) for _ in range(20)]
        shard.append(updates(batch))
        for r in batch:
            truth[(r[0], r[1])] += r[3]
        if step % 3 == 0:
            shard.advance_since(max(0, shard.upper - 2))
        shard._maybe_compact(2)
        if step % 10 == 9:
            shard.compact()
        shard.inspect.state().check()
        want = {k: v for k, v in truth.items() if v}
        assert rows_of(shard.snapshot()) == want


# --- distributed ----------------------------------------------------------------------------


def test_import_persistshard_does_not_import_pyspark():
    import subprocess
    import sys

    code = "import sys, persistshard as ps; ps.compact; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_data_source_imports_without_pandas():
    """Spark imports the data source afresh in every Python worker it forks (planning, each
    write, each commit): pyarrow.dataset, and with it pandas, cost about 0.7 s of CPU there,
    so only the filter literals that need Acero import it, when they are evaluated."""
    import subprocess
    import sys

    code = (
        "import sys, pyspark_persistshard; "
        "loaded = [m for m in ('pandas', 'pyarrow.dataset', 'pyarrow.acero') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.spark
def test_distributed_compaction(spark, tmp_path):
    """Independent merges run in Spark tasks and commit on the driver; reads are unchanged
    and the trace ends as tidy as an in-process compaction leaves it."""
    location = str(tmp_path / "dist")
    shard = ps.open_shard(location, maintenance=False)
    n = 3 * trace.FAN_IN - 1  # parallel level merges, then more
    for t in range(n):
        shard.append(updates([(t % 4, "x", t, 1), (t, "y", t, 1)]))
    shard.compare_and_append(updates([(50, "z", n + 1, 1)]), shard.upper, n + 1)  # unsealed
    shard.seal(n + 2)
    shard.advance_since(5)
    before = all_reads(shard)
    report = ps.compact(spark, location)
    assert report.committed >= 4 and report.conflicts == 0
    assert all_reads(ps.open_shard(location, maintenance=False)) == before
    state = shard.inspect.state()
    state.check()
    assert state.unsealed == ()
    assert trace.next_plan(state) is None
    assert report.levels_after == trace.levels(state)


def test_maybe_compact_after_a_commit_reads_nothing_unless_work_is_due(tmp_path):
    """A writer's maybe_compact decides on the state its own commit made: with nothing due
    it reads no consensus head; when a level group is due it merges (after a fresh read)."""
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    heads = []
    consensus = shard._machine.consensus
    real_head = consensus.head

    def counting_head():
        heads.append(1)
        return real_head()

    consensus.head = counting_head  # type: ignore[method-assign]
    merged = []
    for i in range(trace.FAN_IN):
        _append_batches(shard, 1, 3)
        before = len(heads)
        report = shard._maybe_compact()
        if report is None:
            assert len(heads) == before, f"append {i}: nothing due, yet the head was read"
        else:
            merged.append(report)
    assert len(merged) == 1 and merged[0].merges and merged[0].merges[0].committed
    assert len(shard.inspect.state().trace) == 1
    # A writer that has seen no state yet reads the head to decide.
    other = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    assert other._machine.known().version == 0
    assert other._maybe_compact() is None and other._machine.known().version > 0


# --- writer-triggered compaction plans on the writer's own state ----------------------------


def _eight_appends(shard: ps.Shard) -> None:
    for i in range(8):
        shard.append(updates([(i * 10 + r, f"item-{r}", shard.upper, 1) for r in range(5)]))


def test_writer_compaction_reads_no_head(shard, monkeypatch):
    """Planned on the state the writer's own append produced, and committed on it: no head
    read at all (persist plans a writer's compaction on its append's result)."""
    _eight_appends(shard)
    consensus = shard._machine.consensus
    heads = []
    real = consensus.head
    monkeypatch.setattr(consensus, "head", lambda: heads.append(1) or real())
    report = shard._maybe_compact()
    assert report is not None and report.committed == 1
    assert heads == []


def test_writer_compaction_on_a_stale_state_lands_on_the_newest(tmp_path):
    """Another writer committed after this writer's last commit: the merge planned on the
    stale state loses its compare-and-set, is re-applied to the newest state, and lands."""
    location = str(tmp_path / "s")
    mine = ps.open_shard(location, maintenance=False)
    _eight_appends(mine)
    other = ps.open_shard(location, maintenance=False)
    other.append(updates([(1000, "late", other.upper, 1)]))
    report = mine._maybe_compact()
    assert report is not None and report.committed == 1
    state = mine.inspect.state()
    assert state.upper == 9 and len(state.trace) == 2
    assert mine.snapshot().equals(other.snapshot())
    assert 1000 in mine.snapshot().column("id").to_pylist()


def test_a_writers_merges_share_a_young_write_id(tmp_path, clock, monkeypatch):
    """Merges of one writer put their parts under one write id while it is young (no new
    directory per merge), and under a new one once it is `MERGE_WRITE_ID_SECONDS` old, or an
    eighth of a (shortened) implicit lease: every merge starts with most of its lease."""
    from persistshard.core.statemachine import leases
    from persistshard.core.statemachine.state import part_write_id

    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, clock=clock.now)

    def merge_ids() -> list[str | None]:
        for _ in range(8):
            clock.advance(1)
            shard.append(updates([(shard.upper * 100 + r, "x", shard.upper, 1) for r in range(3)]))
        report = shard._maybe_compact()
        assert report is not None and report.committed == 1
        newest = max(shard.inspect.state().trace, key=lambda b: b.upper)
        return [part_write_id(p.key) for p in newest.parts]

    first, second = merge_ids(), merge_ids()
    assert first == second
    clock.advance(int(cm.MERGE_WRITE_ID_SECONDS * 1000))
    third = merge_ids()
    assert third != second
    monkeypatch.setattr(leases, "implicit_lease_ms", lambda: 8_000)  # an eighth: 1 s
    clock.advance(1_000)
    assert merge_ids() != third
    assert shard.snapshot().num_rows == 4 * 8 * 3
