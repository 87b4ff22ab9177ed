"""The shard core without Spark: every operation's normal path and every error of the API."""

from __future__ import annotations

import math
import threading
import uuid
from collections import Counter

import fsspec
import pyarrow as pa
import pytest
from conformance_helpers import rows_of, updates
from fsspec.implementations.memory import MemoryFileSystem

import persistshard as ps
from persistshard.core.storage.consensus import MemoryConsensus
from persistshard.core.storage.layout import ROLLUP_EVERY


@pytest.fixture
def shard(tmp_path) -> ps.Shard:
    return ps.open_shard(str(tmp_path / "orders"))


@pytest.fixture
def file_shard(tmp_path) -> ps.Shard:
    """A shard whose appends write part files (inline writes off), for tests about them."""
    return ps.open_shard(str(tmp_path / "orders"), inline_bytes=0)


def part_files(shard: ps.Shard) -> list[str]:
    return [m.key for m in shard._blob.list("parts/")]


def test_new_shard(shard):
    assert (shard.upper, shard.since, shard.schema) == (0, 0, None)
    with pytest.raises(ps.NoShard):  # nothing written: a mistyped path reads as no shard
        shard.snapshot()
    shard.seal(1)  # a first write creates the shard, which reads empty
    assert shard.snapshot().num_rows == 0


def test_append_and_time_travel(shard):
    shard.compare_and_append(updates([(1, "apple", 0, 1), (2, "pear", 1, 1)]), 0, 2)
    shard.append(updates([(1, "apple", 2, -1), (3, "plum", 3, 2)]))
    assert shard.upper == 4
    assert shard.schema == pa.schema([("id", pa.int64()), ("item", pa.string())])
    assert rows_of(shard.snapshot(0)) == {(1, "apple"): 1}
    assert rows_of(shard.snapshot(1)) == {(1, "apple"): 1, (2, "pear"): 1}
    assert rows_of(shard.snapshot(2)) == {(2, "pear"): 1}
    assert rows_of(shard.snapshot()) == {(2, "pear"): 1, (3, "plum"): 2}


def test_snapshot_consolidates_and_sorts(shard):
    shard.append(
        updates([(2, "b", 0, 1), (1, "a", 0, 3), (2, "b", 0, 1), (1, "a", 0, -3), (0, "z", 0, 1)])
    )
    snap = shard.snapshot()
    assert snap.to_pylist() == [
        {"id": 0, "item": "z", "_diff": 1},
        {"id": 2, "item": "b", "_diff": 2},
    ]


def test_updates_between_times(shard):
    shard.append(updates([(1, "a", 0, 1), (1, "a", 1, -1), (2, "b", 1, 1), (2, "b", 1, 1)]))
    shard.append(updates([(3, "c", 2, 1)]))
    got = shard.updates(1, 3).to_pylist()
    assert got == [
        {"id": 1, "item": "a", "_time": 1, "_diff": -1},
        {"id": 2, "item": "b", "_time": 1, "_diff": 2},
        {"id": 3, "item": "c", "_time": 2, "_diff": 1},
    ]
    assert shard.updates(0, 1).num_rows == 1
    assert shard.updates(2, 2).num_rows == 0


def test_unsealed_updates_appear_when_upper_passes(shard):
    shard.compare_and_append(updates([(1, "now", 0, 1), (2, "later", 5, 1)]), 0, 1)
    assert rows_of(shard.snapshot()) == {(1, "now"): 1}
    assert shard.inspect.describe()["unsealed_rows"] == 1
    shard.seal(5)
    assert rows_of(shard.snapshot()) == {(1, "now"): 1}
    shard.seal(6)
    assert rows_of(shard.snapshot()) == {(1, "now"): 1, (2, "later"): 1}
    assert rows_of(shard.snapshot(4)) == {(1, "now"): 1}


def test_seal_moves_upper_only_forward(shard):
    shard.seal(3)
    assert shard.upper == 3
    shard.seal(3)
    with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: cannot seal at 2"):
        shard.seal(2)


def test_since_and_compacted_reads(shard):
    shard.append(updates([(1, "a", 0, 1)]))
    shard.append(updates([(1, "a", 1, 1)]))
    shard.append(updates([(2, "b", 2, 1)]))
    shard.advance_since(2)
    assert shard.since == 2
    shard.advance_since(1)  # since only moves forward: a no-op
    assert shard.since == 2
    assert rows_of(shard.snapshot(2)) == {(1, "a"): 2, (2, "b"): 1}
    assert shard.updates(0, 3).to_pylist() == [
        {"id": 1, "item": "a", "_time": 2, "_diff": 2},
        {"id": 2, "item": "b", "_time": 2, "_diff": 1},
    ]


# --- errors of the API table ------------------------------------------------------------


def test_upper_mismatch(file_shard):
    shard = file_shard  # the refused append's part file is deleted
    shard.append(updates([(1, "a", 0, 1)]), new_upper=7)
    with pytest.raises(ps.UpperMismatch) as err:
        shard.compare_and_append(updates([(2, "b", 5, 1)]), 5, 9)
    assert (err.value.expected, err.value.actual) == (5, 7)
    assert str(err.value) == (
        f"UpperMismatch: expected upper 5, shard upper is 7 (shard {shard.location})"
    )
    assert shard.upper == 7
    assert len(part_files(shard)) == 1


def test_since_violation(shard):
    shard.append(updates([(1, "a", 0, 1)]), new_upper=5)
    shard.advance_since(3)
    with pytest.raises(ps.SinceViolation, match=r"^SinceViolation: as_of 2 is before .* since 3"):
        shard.snapshot(2)
    with pytest.raises(ps.SinceViolation, match=r"^SinceViolation: updates from 2"):
        shard.updates(2, 4)


def test_not_sealed(shard):
    shard.append(updates([(1, "a", 0, 1)]), new_upper=5)
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: as_of 5 is not sealed.*upper is 5"):
        shard.snapshot(5)
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: updates up to 6"):
        shard.updates(0, 6)
    with pytest.raises(ps.NotSealed, match=r"^NotSealed: cannot advance since to 9"):
        shard.advance_since(9)


def _bad(**overrides) -> pa.Table:
    cols = {"id": [1], "item": ["a"], "_time": [3], "_diff": [1]}
    cols.update(overrides)
    return pa.table({k: v for k, v in cols.items() if v is not ...})


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (_bad(_time=pa.array([None], pa.int64())), "_time has 1 null"),
        (_bad(_time=[-1]), "_time has negative time -1"),
        (_bad(_diff=[0]), "_diff has 1 zero"),
        (_bad(_diff=pa.array([None], pa.int64())), "_diff has 1 null"),
        (_bad(_diff=...), "no _diff column"),
        (_bad(_diff=[1.5]), "_diff must be an integer"),
        (_bad(_time=[2]), r"_time 2 is below .* lower 3"),
        (_bad(id=["x"]), r"columns \(id string, item string\) do not match"),
        (_bad(item=..., other=["a"]), r"columns \(id int64, other string\) do not match"),
    ],
)
def test_invalid_updates_write_nothing(shard, table, message):
    shard.append(updates([(1, "a", 0, 1)]), new_upper=3)
    before = shard.inspect.state()
    files = part_files(shard)
    with pytest.raises(ps.InvalidUpdates, match=r"^InvalidUpdates: .*" + message):
        shard.compare_and_append(table, 3, 4)
    after = shard.inspect.state()
    assert (after.version, after.upper) == (before.version, before.upper)
    assert part_files(shard) == files


def test_corrupt_part_is_named(file_shard):
    shard = file_shard
    shard.append(updates([(i, f"item-{i}", 0, 1) for i in range(100)]))
    [key] = part_files(shard)
    path = shard._blob._path(key)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 3] ^= 0x40
    open(path, "wb").write(bytes(data))
    with pytest.raises(ps.CorruptData, match=r"^CorruptData: .*" + key.split("/")[-1]):
        shard.snapshot()
    report = shard.verify()
    assert not report.ok and key.split("/")[-1] in report.problems[0]


class _NoAtomicCreateFS(MemoryFileSystem):
    protocol = "noatomic"
    store: dict = {}  # noqa: RUF012
    pseudo_dirs = [""]  # noqa: RUF012


def test_storage_unsupported():
    fsspec.register_implementation("noatomic", _NoAtomicCreateFS, clobber=True)
    with pytest.raises(ps.StorageUnsupported, match=r"^StorageUnsupported: the 'noatomic'"):
        ps.open_shard("noatomic://bucket/shard")
    shard = ps.open_shard("noatomic://bucket/shard2", consensus=MemoryConsensus())
    shard.append(updates([(1, "a", 0, 1)]))
    assert rows_of(shard.snapshot()) == {(1, "a"): 1}


# --- equality rule ----------------------------------------------------------------------


def test_equality_rule_nan_negative_zero_null_nested(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    t = pa.table(
        {
            "f": pa.array([math.nan, float("nan"), -0.0, 0.0, None, None], pa.float64()),
            "n": pa.array(
                [{"a": [1]}, {"a": [1]}, {"a": None}, {"a": None}, None, None],
                pa.struct([("a", pa.list_(pa.int64()))]),
            ),
            "_time": [0] * 6,
            "_diff": [1, 1, 1, 1, 1, -1],
        }
    )
    shard.append(t)
    snap = shard.snapshot().to_pylist()
    assert len(snap) == 3
    nan_row = next(r for r in snap if r["f"] is not None and math.isnan(r["f"]))
    assert nan_row["_diff"] == 2
    zeros = sorted((math.copysign(1, r["f"]), r["_diff"]) for r in snap if r["f"] == 0)
    assert zeros == [(-1.0, 1), (1.0, 1)]


# --- state machine ----------------------------------------------------------------------


def test_rollups_bound_load_cost(tmp_path):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False)  # counts versions: no merges
    for t in range(ROLLUP_EVERY * 2 + 3):
        shard.append(updates([(t, "x", t, 1)]))
    rollups = [m.key for m in shard._blob.list("rollups/")]
    assert len(rollups) == 2
    fresh = ps.open_shard(location)
    assert fresh.inspect.state() == shard.inspect.state()
    assert rows_of(fresh.snapshot()) == {(t, "x"): 1 for t in range(ROLLUP_EVERY * 2 + 3)}
    history = fresh.history()
    assert [h["version"] for h in history] == list(range(1, ROLLUP_EVERY * 2 + 4))
    assert history[0]["kind"] == "append"


@pytest.mark.parametrize("inline_bytes", [0, None], ids=["files", "inline"])
def test_racing_appends_one_winner(tmp_path, inline_bytes):
    """Eight threads append at the same expected upper: exactly one wins, the others get
    UpperMismatch, and the winner's data alone is in the shard (with part files, the losers'
    files are gone; inline, at the default, they wrote none)."""
    location = str(tmp_path / "s")
    ps.open_shard(location, inline_bytes=inline_bytes).append(updates([(0, "seed", 0, 1)]))
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def writer(i: int) -> None:
        s = ps.open_shard(location, inline_bytes=inline_bytes)
        s.inspect.state()
        barrier.wait()
        try:
            s.compare_and_append(updates([(i, f"w{i}", 1, 1)]), 1, 2)
            outcomes.append(f"won {i}")
        except ps.UpperMismatch:
            outcomes.append("lost")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("lost") == 7
    i = int(winners[0].split()[1])
    shard = ps.open_shard(location)
    assert rows_of(shard.snapshot()) == {(0, "seed"): 1, (i, f"w{i}"): 1}
    assert set(part_files(shard)) == shard.inspect.state().stored_part_keys()
    assert bool(part_files(shard)) == (inline_bytes == 0)


def test_memory_location():
    shard = ps.open_shard(f"memory://ps-{uuid.uuid4().hex}/s")
    shard.append(updates([(1, "a", 0, 2)]))
    assert Counter(rows_of(shard.snapshot())) == Counter({(1, "a"): 2})
