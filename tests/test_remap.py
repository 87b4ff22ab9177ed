"""The remap shard without Spark: minting, bindings, reclocking, resumption, and bad input."""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pytest
from conformance_helpers import examples, updates
from hypothesis import given, settings
from hypothesis import strategies as st

import persistshard as ps
from persistshard.conformance.storage import process_context
from persistshard.core.remap import join, offsets_json


@pytest.fixture
def remap(tmp_path) -> ps.RemapShard:
    return ps.open_remap(str(tmp_path / "remap"))


def test_mint_binds_consecutive_into_times(remap):
    assert remap.bindings() == []
    assert remap.mint({"orders:0": 120, "orders:1": 75}) == 0
    assert remap.mint({"orders:0": 130}) == 1  # orders:1 keeps 75
    assert remap.bindings() == [
        (0, {"orders:0": 120, "orders:1": 75}),
        (1, {"orders:0": 130, "orders:1": 75}),
    ]
    assert remap.upper == 2
    # The remap shard is a shard: its contents at an into-time are the frontier then.
    snap = remap.shard.snapshot(0).to_pylist()
    assert {(r["partition"], r["offset"]) for r in snap} == {("orders:0", 120), ("orders:1", 75)}
    assert remap.shard.verify().ok


def test_mint_same_frontier_again_returns_existing_time(remap):
    assert remap.mint({"a": 5}) == 0
    version = remap.shard.inspect.state().version
    assert remap.mint({"a": 5}) == 0
    assert remap.mint({}) == 0
    assert remap.shard.inspect.state().version == version
    assert remap.mint({"a": 6, "b": 0}) == 1
    assert remap.mint({"b": 0}) == 1


def test_empty_frontier_on_empty_remap_is_refused(remap):
    with pytest.raises(ps.InvalidUpdates, match=r"^InvalidUpdates: nothing to bind"):
        remap.mint({})
    assert remap.upper == 0


def test_regression_is_refused_and_names_the_partition(remap):
    remap.mint({"orders:0": 10, "orders:1": 3})
    version = remap.shard.inspect.state().version
    with pytest.raises(ps.InvalidUpdates, match=r"^InvalidUpdates: partition 'orders:1' would go"):
        remap.mint({"orders:0": 11, "orders:1": 2})
    assert remap.shard.inspect.state().version == version
    assert remap.bindings() == [(0, {"orders:0": 10, "orders:1": 3})]


@pytest.mark.parametrize(
    ("frontier", "message"),
    [
        ({"p": -1}, r"^InvalidUpdates: partition 'p' has negative offset -1"),
        ({None: 3}, r"^InvalidUpdates: a source frontier has a null or empty partition key"),
        ({"": 3}, r"^InvalidUpdates: a source frontier has a null or empty partition key"),
        ({"p": None}, r"^InvalidUpdates: partition 'p' has a null offset"),
        ({"p": 1.5}, r"^InvalidUpdates: partition 'p' has offset 1.5, which is not an integer"),
        ({"p": True}, r"^InvalidUpdates: partition 'p' has offset True"),
        ({3: 1}, r"^InvalidUpdates: partition key 3 must be a string"),
        ([("p", 1)], r"^InvalidUpdates: a source frontier is a mapping"),
    ],
)
def test_bad_frontiers_mint_nothing(remap, frontier, message):
    with pytest.raises(ps.InvalidUpdates, match=message):
        remap.mint(frontier)
    assert remap.upper == 0 and remap.shard.inspect.state().version == 0


def test_reclock_gives_the_first_covering_binding(remap):
    remap.mint({"a": 3, "b": 1})  # t0
    remap.mint({"a": 5})  # t1
    remap.mint({"b": 4, "c": 2})  # t2
    parts = pa.array(["a", "a", "a", "a", "b", "b", "c", "c", "a"])
    offs = pa.array([0, 2, 3, 4, 0, 3, 0, 1, 2], pa.int64())
    assert remap.reclock(parts, offs).to_pylist() == [0, 0, 1, 1, 0, 2, 2, 2, 0]
    # Integer partitions and chunked arrays are accepted.
    remap2 = ps.open_remap(remap.location + "-int")
    remap2.mint({"0": 2, "1": 1})
    got = remap2.reclock(pa.chunked_array([[0, 1], [0]], pa.int32()), pa.chunked_array([[1, 0, 0]]))
    assert got.to_pylist() == [0, 0, 0]
    assert remap.reclock(pa.array([], pa.string()), pa.array([], pa.int64())).to_pylist() == []


def test_uncovered_record_is_not_sealed(remap):
    remap.mint({"a": 3})
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: partition 'a' offset 3 is not covered"):
        remap.reclock(pa.array(["a"]), pa.array([3]))
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: partition 'z' offset 0 is not covered"):
        remap.reclock(pa.array(["a", "z"]), pa.array([0, 0]))
    # A provisional time for the sink, never a guessed one by default.
    got = remap.pinned().reclock(pa.array(["a", "a", "z"]), pa.array([2, 9, 0]), beyond=7)
    assert got.to_pylist() == [0, 7, 7]


@pytest.mark.parametrize(
    ("parts", "offs", "message"),
    [
        (["a", None], [0, 1], r"^InvalidUpdates: 1 records have a null partition"),
        (["a", "b"], [0, None], r"^InvalidUpdates: partition 'b' has 1 records with a null offset"),
        (["a", "b"], [0, -4], r"^InvalidUpdates: partition 'b' has negative offset -4"),
        (["a"], [0, 1], r"^InvalidUpdates: 1 partitions but 2 offsets"),
    ],
)
def test_reclock_bad_records(remap, parts, offs, message):
    remap.mint({"a": 10, "b": 10})
    with pytest.raises(ps.InvalidUpdates, match=message):
        remap.reclock(pa.array(parts, pa.string()), pa.array(offs, pa.int64()))


def test_reclock_refuses_float_offsets(remap):
    remap.mint({"a": 10})
    with pytest.raises(ps.InvalidUpdates, match=r"^InvalidUpdates: source offsets must be integ"):
        remap.reclock(pa.array(["a"]), pa.array([1.0]))


def test_source_upper_at_and_resume_frontier(tmp_path, remap):
    remap.mint({"t:0": 10})  # 0
    remap.mint({"t:0": 20, "t:1": 5})  # 1
    remap.mint({"t:1": 9})  # 2
    assert remap.source_upper_at(0) == {}
    assert remap.source_upper_at(1) == {"t:0": 10}
    assert remap.source_upper_at(3) == {"t:0": 20, "t:1": 9}
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: into-time 3 is not bound yet"):
        remap.source_upper_at(4)
    out1, out2 = ps.open_shard(str(tmp_path / "o1")), ps.open_shard(str(tmp_path / "o2"))
    out1.compare_and_append(updates([(1, "x", 0, 1)]), 0, 3)
    out2.compare_and_append(updates([(1, "x", 0, 1)]), 0, 2)
    assert ps.resume_frontier(remap.location, [out1.location]) == {"t:0": 20, "t:1": 9}
    assert ps.resume_frontier(remap.location, [out1.location, out2.location]) == {
        "t:0": 20,
        "t:1": 5,
    }
    assert json.loads(ps.resume_offsets(out2.location, remap=remap.location)) == {
        "t": {"0": 20, "1": 5}
    }
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: resume_frontier needs"):
        ps.resume_frontier(remap.location, [])


def test_offsets_json_shapes():
    assert offsets_json({}) == "earliest"
    assert json.loads(offsets_json({"a:0": 1, "b:3": 2, "a:1": 4})) == {
        "a": {"0": 1, "1": 4},
        "b": {"3": 2},
    }
    assert json.loads(offsets_json({"file-a": 3, "x:1": 2})) == {"file-a": 3, "x:1": 2}


def test_remap_survives_compaction_and_since(remap):
    for i in range(1, 40):
        remap.mint({"a": i, f"p{i % 3}": i})
    before = remap.bindings()
    remap.shard.compact()
    assert remap.bindings() == before
    remap.shard.advance_since(10)
    remap.shard.compact()
    after = remap.bindings()
    assert after[0][0] == 10 and after[0][1] == before[10][1]
    assert after[1:] == before[11:]
    assert remap.reclock(pa.array(["a", "a"]), pa.array([0, 30])).to_pylist() == [10, 30]


def test_a_shard_with_other_columns_is_not_a_remap(tmp_path):
    shard = ps.open_shard(str(tmp_path / "orders"))
    shard.append(updates([(1, "x", 0, 1)]))
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: the shard at .* is not a remap"):
        ps.open_remap(shard.location).bindings()


def _race(location: str, upper: int, frontiers: list[dict[str, int]]) -> list[object]:
    """Mint each frontier in its own thread, all released at once, at ``upper``."""
    barrier = threading.Barrier(len(frontiers))
    outcomes: list[object] = []

    def mint(frontier: dict[str, int]) -> None:
        barrier.wait()
        try:
            outcomes.append(
                ps.open_remap(location).mint_at(frontier, expected_upper=upper, join_current=False)
            )
        except ps.UpperMismatch as e:
            outcomes.append(e)

    threads = [threading.Thread(target=mint, args=(f,)) for f in frontiers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_racing_minters_in_threads_one_wins_per_into_time(remap):
    """Eight threads mint growing frontiers at the same expected upper, twenty rounds: in
    each round exactly one binds the into-time, every other gets UpperMismatch, and the
    bindings stay monotone."""
    for round_ in range(20):
        upper = remap.upper
        outcomes = _race(remap.location, upper, [{"a": round_ * 10 + i} for i in range(8)])
        wins = [o for o in outcomes if isinstance(o, int)]
        assert wins == [upper], outcomes
    offsets = [f["a"] for _, f in remap.bindings()]
    assert [t for t, _ in remap.bindings()] == list(range(20))
    assert offsets == sorted(offsets)


def _mint_in_process(location: str, start: int, count: int, out) -> None:  # pragma: no cover
    import traceback

    try:
        _mint_loop(location, start, count, out)
    except BaseException:
        out.put(traceback.format_exc())
        raise


def _mint_loop(location: str, start: int, count: int, out) -> None:  # pragma: no cover
    remap = ps.open_remap(location)
    won = 0
    for i in range(count):
        while True:
            try:
                current = remap.pinned()
                remap.mint_at(
                    {"a": current.frontier.get("a", 0) + 1, f"w{start}": i + 1},
                    expected_upper=current.upper,
                    join_current=False,
                )
                won += 1
                break
            except ps.UpperMismatch:
                continue
            except ps.InvalidUpdates:  # the other process moved "a" past us: re-read
                continue
    out.put(won)


def test_racing_minters_in_processes(remap):
    """Two processes each bind ten frontiers, retrying on UpperMismatch: twenty bindings at
    into-times 0..19, the shared partition strictly increasing by one per binding."""
    ctx = process_context()
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_mint_in_process, args=(remap.location, s, 10, out)) for s in (0, 1)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=180), out.get(timeout=180)]
    for p in procs:
        p.join(60)
    assert results == [10, 10], results
    assert [p.exitcode for p in procs] == [0, 0]
    bindings = remap.bindings()
    assert [t for t, _ in bindings] == list(range(20))
    assert [f["a"] for _, f in bindings] == list(range(1, 21))
    assert bindings[-1][1]["w0"] == 10 and bindings[-1][1]["w1"] == 10


@settings(max_examples=examples(30), deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 50), max_size=3),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 60)), max_size=30),
)
def test_reclock_against_a_model(tmp_path_factory, frontiers, records):
    """Against a model: joined frontiers are bound in order; a record's time is the first
    binding whose frontier exceeds its offset; anything else is NotSealed."""
    remap = ps.open_remap(str(tmp_path_factory.mktemp("r") / "remap"))
    model: list[dict[str, int]] = []
    for f in frontiers:
        current = model[-1] if model else {}
        merged = join(current, f)
        if merged == current:
            if model:
                assert remap.mint_at(f, expected_upper=None, join_current=True) == len(model) - 1
            continue
        assert remap.mint_at(f, expected_upper=None, join_current=True) == len(model)
        model.append(merged)
    assert remap.bindings() == list(enumerate(model))
    expected = []
    for p, o in records:
        times = [t for t, f in enumerate(model) if f.get(p, 0) > o]
        expected.append(times[0] if times else None)
    parts = pa.array([p for p, _ in records], pa.string())
    offs = pa.array(np.array([o for _, o in records], dtype=np.int64))
    if None in expected:
        with pytest.raises(ps.NotSealed):
            remap.reclock(parts, offs)
    else:
        assert remap.reclock(parts, offs).to_pylist() == expected
