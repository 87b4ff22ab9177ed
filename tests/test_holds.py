"""Reader holds and listen: since never passes a live reader (core, no Spark)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from conformance_helpers import rows_of, updates

import persistshard as ps
from persistshard.core.storage import layout
from persistshard.errors import HoldExpired, InvalidOption, SinceViolation


class Clock:
    """A shard's clock (its configuration's ``clock``), settable by the test in seconds."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def now(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def shard(tmp_path, clock) -> ps.Shard:
    """Four appends, on the test's clock (still unless the test moves it)."""
    s = ps.open_shard(str(tmp_path / "s"), clock=clock.now)
    for t in range(4):
        s.append(updates([(t, f"r{t}", t, 1)]))
    return s


def test_register_holds_the_current_since_and_ids_are_unique(shard):
    shard.advance_since(2)
    hold = shard.register_reader("dash", lease_seconds=60)
    assert hold.since == 2
    assert shard.readers()["dash"][0] == 2
    with pytest.raises(InvalidOption, match="InvalidOption: reader 'dash' is already registered"):
        shard.register_reader("dash")
    other = ps.open_shard(shard.location)  # another process sees the hold in the state
    assert set(other.readers()) == {"dash"}


def test_advance_since_stops_at_the_smallest_live_hold(shard):
    a = shard.register_reader("a")
    b = shard.register_reader("b")
    a.downgrade_since(2)
    assert shard.advance_since(3) == 0  # b still holds 0
    b.downgrade_since(1)
    assert shard.advance_since(3) == 1
    b.expire()
    assert shard.advance_since(3) == 2
    a.expire()
    assert shard.advance_since(3) == 3
    assert shard.readers() == {}


def test_downgrade_is_forward_only(shard):
    hold = shard.register_reader("r")
    hold.downgrade_since(2)
    hold.downgrade_since(2)  # same time: fine
    with pytest.raises(SinceViolation, match=r"^SinceViolation: reader 'r' cannot move its hold"):
        hold.downgrade_since(1)
    assert hold.since == 2


def test_leases_run_out_by_the_committing_clock(shard, clock):
    hold = shard.register_reader("r", lease_seconds=10)
    clock.advance(6)
    hold.heartbeat()  # renewed: 10 s from now
    clock.advance(6)
    assert shard.advance_since(3) == 0  # still live
    clock.advance(5)
    assert "r" not in shard.readers()  # ran out, not yet removed from the state
    assert "r" in shard.inspect.state().holds
    assert shard.advance_since(3) == 3  # no longer counts, and the commit drops it
    assert "r" not in shard.inspect.state().holds
    with pytest.raises(HoldExpired, match=r"^HoldExpired: reader 'r' holds no since"):
        hold.heartbeat()
    with pytest.raises(HoldExpired):
        hold.downgrade_since(3)
    shard.register_reader("r")  # the id is free again


def test_an_expired_hold_is_dropped_by_any_commit(shard, clock):
    shard.register_reader("r", lease_seconds=1)
    clock.advance(2)
    shard.append(updates([(9, "x", 4, 1)]))
    assert shard.inspect.state().holds == {}


def test_a_reader_handle_survives_a_restart(shard):
    shard.register_reader("job", lease_seconds=60).downgrade_since(2)
    again = ps.open_shard(shard.location).reader("job")
    assert again.since == 2
    with pytest.raises(HoldExpired):
        shard.reader("nobody")


def test_with_block_releases_the_hold(shard):
    with shard.register_reader("r") as hold:
        assert shard.advance_since(2) == 0
        assert hold.since == 0
    assert shard.advance_since(2) == 2


def test_bad_leases_and_ids_are_refused(shard):
    with pytest.raises(InvalidOption, match="lease_seconds must be positive"):
        shard.register_reader("r", lease_seconds=0)
    with pytest.raises(InvalidOption, match="non-empty"):
        shard.register_reader("")


def test_holds_survive_rollups_and_compaction(shard):
    hold = shard.register_reader("r")
    hold.downgrade_since(1)
    for t in range(4, 4 + 2 * layout.ROLLUP_EVERY):
        shard.append(updates([(t % 3, "k", t, 1)]))
        shard.advance_since(t)
    shard.compact()
    fresh = ps.open_shard(shard.location)
    assert fresh.since == 1 and fresh.readers()["r"][0] == 1
    assert rows_of(fresh.snapshot(1)) == {(0, "r0"): 1, (1, "r1"): 1}


def _listen_all(shard, as_of, **kw):
    out = []
    with shard.listen(as_of, **kw) as sub:
        for table, frontier in sub:
            out.append((table, frontier))
    return out


def test_listen_gives_the_snapshot_then_every_update(shard):
    got = _listen_all(shard, 1, timeout=0.2)
    assert [f for _, f in got] == [2, 4]
    first, rest = got[0][0], got[1][0]
    assert first.column_names == ["id", "item", "_time", "_diff"]
    assert set(first.column("_time").to_pylist()) == {1}
    assert rows_of(first.drop_columns(["_time"])) == rows_of(shard.snapshot(1))
    assert sorted(rest.column("_time").to_pylist()) == [2, 3]
    assert shard.readers() == {}  # released on close


def test_listen_waits_for_new_commits_and_holds_since(shard):
    seen: list[int] = []
    ready = threading.Event()

    def consume() -> None:
        with shard.listen(3, timeout=5) as sub:
            for _table, frontier in sub:
                seen.append(frontier)
                ready.set()
                if frontier >= 6:
                    return

    worker = threading.Thread(target=consume)
    worker.start()
    assert ready.wait(10)
    holders = shard.readers()
    assert len(holders) == 1 and next(iter(holders.values()))[0] == 3
    assert shard.advance_since(4) == 3  # the listener holds 3
    shard.append(updates([(7, "x", 4, 1)]))
    shard.append(updates([(7, "x", 5, -1)]))
    worker.join(20)
    assert not worker.is_alive()
    assert seen == [4, 5, 6] or seen == [4, 6]
    assert shard.readers() == {}


def test_listen_refuses_a_time_before_since_and_leaves_no_hold(shard):
    shard.advance_since(2)
    with pytest.raises(SinceViolation):
        shard.listen(1)
    assert shard.readers() == {}


def test_listen_ends_after_its_timeout_without_commits(shard):
    started = time.monotonic()
    got = _listen_all(shard, 3, timeout=0.3)
    assert [f for _, f in got] == [4]
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("seed", range(4))
def test_random_holds_never_lose_a_readers_history(tmp_path, clock, seed):
    """Appends, since advances, register/downgrade/heartbeat/expire, clock jumps, compaction
    and gc in a random order. Model: every update ever appended. After every step, every live
    reader reads every time from its hold to the upper exactly (snapshots and change reads
    equal the model's), and since is never above a live hold."""
    rng = random.Random(seed)
    shard = ps.open_shard(str(tmp_path / "s"), clock=clock.now)
    shard.compare_and_append(None, 0, 0)  # the empty shard: gc and compaction need one
    model: list[tuple[tuple[int, str], int, int]] = []  # (row, time, diff)
    handles: dict[str, ps.core.statemachine.holds.ReaderHold] = {}

    def expected_snapshot(as_of: int) -> dict:
        counts: Counter = Counter()
        for row, t, d in model:
            if t <= as_of:
                counts[row] += d
        return {r: c for r, c in counts.items() if c}

    def expected_updates(lo: int, hi: int) -> Counter:
        counts: Counter = Counter()
        for row, t, d in model:
            if lo <= t < hi:
                counts[(*row, t)] += d
        return Counter({k: v for k, v in counts.items() if v})

    for _step in range(60):
        op = rng.choice(
            ["append", "append", "since", "register", "downgrade", "heartbeat", "expire",
             "clock", "compact", "gc"]
        )  # fmt: skip
        upper = shard.upper
        if op == "append":
            rows = [((rng.randrange(4), "v"), upper, rng.choice([1, 1, -1])) for _ in range(3)]
            shard.append(updates([(k, v, t, d) for (k, v), t, d in rows]))
            model.extend(rows)
        elif op == "since" and upper:
            shard.advance_since(rng.randrange(upper))
        elif op == "register":
            name = f"r{rng.randrange(5)}"
            if name not in shard.readers():
                handles[name] = shard.register_reader(name, lease_seconds=rng.choice([5, 60]))
        elif op in ("downgrade", "heartbeat", "expire") and handles:
            name = rng.choice(sorted(handles))
            try:
                if op == "downgrade":
                    handles[name].downgrade_since(handles[name].since + rng.randrange(3))
                elif op == "heartbeat":
                    handles[name].heartbeat()
                else:
                    handles.pop(name).expire()
            except HoldExpired:
                handles.pop(name, None)
        elif op == "clock":
            clock.advance(rng.choice([1, 3, 10]))
        elif op == "compact":
            shard.compact()
        elif op == "gc":
            shard.gc(dry_run=False, retention_seconds=0)
        state = shard.inspect.state()
        live = shard.readers()
        for name, (since, _) in live.items():
            assert state.since <= since, (name, since, state.since)
            for t in range(since, state.upper):
                assert rows_of(shard.snapshot(t)) == expected_snapshot(t)
            if since + 1 < state.upper:
                got = shard.updates(since + 1, state.upper)
                assert rows_of(got) == dict(expected_updates(since + 1, state.upper))
        if state.upper:
            assert rows_of(shard.snapshot()) == expected_snapshot(state.upper - 1)


def test_holds_are_a_map_not_a_log(shard):
    hold = shard.register_reader("r")
    for _ in range(50):
        hold.heartbeat()
    assert len(shard.inspect.state().holds) == 1
    assert len(shard.inspect.state().to_json()["holds"]) == 1


def test_history_names_hold_commits_and_says_advance_since_may_stop_short(shard):
    with shard.register_reader("dash", lease_seconds=60) as hold:
        hold.downgrade_since(1)
        hold.heartbeat()
        assert shard.advance_since(3) == 1
    tail = shard.history()[-5:]
    assert [h["kind"] for h in tail] == [
        "register_reader",
        "downgrade_since",
        "heartbeat",
        "advance_since",
        "expire_reader",
    ]
    assert tail[0]["summary"] == "reader dash holds since (lease 60 s)"
    assert tail[1]["summary"] == "reader dash holds since at 1"
    assert tail[3]["summary"] == "since toward 3, as far as live reader holds allow"
