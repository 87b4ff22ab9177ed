"""Durable consumers (issue 39, item 3): a named position that holds since back with no lease,
moved by compare-and-set (core, no Spark; the Spark option and the CLI: test_consumers_spark,
test_cli)."""

from __future__ import annotations

import threading
from collections import Counter

import pyarrow as pa
import pytest
from conformance_helpers import rows_of, updates

import persistshard as ps
from persistshard.conformance.faults import FaultyBlob
from persistshard.conformance.recorder import FaultyConsensus
from persistshard.core.shard import Shard
from persistshard.core.statemachine import machine
from persistshard.core.statemachine.commits.advance_consumer import AdvanceConsumer
from persistshard.core.statemachine.encoding import fold
from persistshard.core.statemachine.state import ShardState
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.layout import ROLLUP_EVERY
from persistshard.errors import (
    Indeterminate,
    InvalidOption,
    NoShard,
    SinceViolation,
    StateConflict,
)


@pytest.fixture
def shard(tmp_path) -> ps.Shard:
    s = ps.open_shard(str(tmp_path / "s"))
    for t in range(6):
        s.append(updates([(t, f"r{t}", t, 1)]))
    return s


def changes(table: pa.Table) -> Counter[tuple[int, int, int]]:
    """A change read as a multiset of (id, time, diff)."""
    return Counter((r["id"], r["_time"], r["_diff"]) for r in table.to_pylist())


def test_a_consumer_is_created_at_the_since_once_and_listed_apart_from_readers(shard):
    shard.advance_since(2)
    before = shard.inspect.state().version
    c = shard.consumer("nightly-etl")
    assert c.position == 2 and shard.inspect.state().version == before + 1
    again = ps.open_shard(shard.location).consumer("nightly-etl")  # exists: no commit
    assert again.position == 2 and shard.inspect.state().version == before + 1
    assert shard.consumers() == {"nightly-etl": 2}
    assert shard.readers() == {}
    shard.register_reader("dash")
    assert set(shard.readers()) == {"dash"} and set(shard.consumers()) == {"nightly-etl"}
    assert [h["kind"] for h in shard.history()][-2] == "create_consumer"


def test_a_consumer_holds_since_below_its_position_with_no_lease(shard):
    """since stops at position - 1 (so the changes from the position stay exact) under
    advance_since, retention, compaction and gc at retention 0, however much time passes: no
    lease."""
    c = shard.consumer("etl")
    assert shard.advance_since(5) == 0  # created at since 0: since stays there
    c.advance(4, expected=0)
    assert shard.advance_since(5) == 3
    from persistshard.core.storage import layout

    later = layout.now_ms() + 10 * 365 * 86400 * 1000  # ten years on: no lease runs out
    shard = ps.open_shard(shard.location, clock=lambda: later)
    c = shard.consumer("etl")  # the same consumer, through the handle on the later clock
    shard.set_retention(versions=1)
    for t in range(6, 9):
        shard.append(updates([(t, f"r{t}", t, 1)]))
    assert shard.since == 3
    shard.compact()
    shard.gc(dry_run=False, retention_seconds=0)
    assert shard.verify().ok
    assert changes(shard.updates(c.position, shard.upper)) == Counter(
        {(t, t, 1): 1 for t in range(4, 9)}
    )
    c.advance(shard.upper, expected=4)
    assert shard.advance_since(shard.upper) == shard.upper - 1


def test_since_never_passes_the_smallest_consumer_or_hold(shard):
    a, b = shard.consumer("a"), shard.consumer("b")
    a.advance(5, expected=0)
    b.advance(3, expected=0)
    hold = shard.register_reader("r")
    hold.downgrade_since(1)
    assert shard.advance_since(6) == 1
    hold.expire()
    assert shard.advance_since(6) == 2  # b at 3
    b.drop()
    assert shard.advance_since(6) == 4  # a at 5
    a.drop()
    assert shard.advance_since(6) == 6


def test_racing_advances_one_wins_the_other_gets_state_conflict(shard):
    """Two handles at position 0 (two copies of a nightly job): the first advance lands, the
    second is refused with StateConflict carrying the actual position, and nothing moved."""
    first = shard.consumer("etl")
    second = ps.open_shard(shard.location).consumer("etl")
    assert first.advance(4, expected=first.position) == 4
    version = shard.inspect.state().version
    with pytest.raises(StateConflict, match=r"^StateConflict: consumer 'etl' is at 4") as e:
        second.advance(6, expected=second.position)
    assert (e.value.expected, e.value.actual) == (0, 4)
    assert e.value.location == shard.location
    assert shard.inspect.state().version == version and shard.consumers() == {"etl": 4}
    assert second.position == 4  # the loser's handle now knows where it is
    assert second.advance(6, expected=second.position) == 6


def test_racing_advances_from_threads_exactly_one_lands(shard):
    """N processes' handles race the same compare-and-set through the log: exactly one
    lands, every other is StateConflict with .actual = the winner's position."""
    handles = [ps.open_shard(shard.location).consumer("etl") for _ in range(6)]
    results: list[object] = [None] * len(handles)
    barrier = threading.Barrier(len(handles))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = handles[i].advance(i % 6 + 1, expected=0)
        except StateConflict as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if isinstance(r, int)]
    lost = [r for r in results if isinstance(r, StateConflict)]
    assert len(won) == 1 and len(lost) == len(handles) - 1
    assert shard.consumers() == {"etl": won[0]}
    assert {e.actual for e in lost} == {won[0]}
    kinds = [h["commit"] for h in shard.history()]
    assert kinds.count("advance_consumer") == 1


def test_advance_moves_forward_only_never_past_the_upper(shard):
    c = shard.consumer("etl")
    c.advance(3, expected=0)
    version = shard.inspect.state().version
    with pytest.raises(InvalidOption, match="moves forward only"):
        c.advance(2, expected=3)
    with pytest.raises(InvalidOption, match="past the shard's upper 6"):
        c.advance(7, expected=3)
    for bad in (-1, True, 2.5, "4"):
        with pytest.raises(InvalidOption, match="not a shard time"):
            c.advance(bad, expected=3)  # type: ignore[arg-type]
    assert c.advance(3, expected=3) == 3  # no move: nothing committed
    assert shard.inspect.state().version == version and shard.consumers() == {"etl": 3}
    with pytest.raises(StateConflict) as e:  # no move, but the compare still compares
        c.advance(3, expected=2)
    assert e.value.actual == 3
    assert c.advance(6, expected=3) == 6


def test_the_commit_itself_refuses_a_move_back_or_past_the_upper(shard):
    c = shard.consumer("etl")
    c.advance(3, expected=0)
    for to in (2, 7):
        with pytest.raises(InvalidOption, match="forward only, and never past the upper 6"):
            shard._machine.commit(AdvanceConsumer("etl", 3, to, id=f"forged-{to}"))
    assert shard.consumers() == {"etl": 3}


def test_drop_releases_since_and_a_dropped_consumer_cannot_advance(shard):
    c = shard.consumer("etl")
    c.advance(2, expected=0)
    other = ps.open_shard(shard.location).consumer("etl")
    c.drop()
    c.drop()  # idempotent
    assert shard.consumers() == {}
    assert shard.advance_since(5) == 5
    with pytest.raises(StateConflict, match="consumer 'etl' is not there") as e:
        other.advance(4, expected=2)
    assert e.value.actual is None
    with pytest.raises(StateConflict, match="was dropped"):
        other.position  # noqa: B018
    assert shard.consumer("etl").position == 5  # created again, at the since


def test_changes_from_a_new_consumer_are_the_snapshot_then_what_follows(shard):
    """A consumer created at since s > 0 has read nothing: its changes are the snapshot at s
    as updates at s, then every later update (the updates from s itself are not exact)."""
    shard.append(updates([(0, "r0", 6, -1)]))  # delete row 0 at 6
    shard.advance_since(3)
    c = shard.consumer("etl")
    assert c.position == 3
    with pytest.raises(SinceViolation):
        shard.updates(c.position, shard.upper)
    first = c.changes()
    assert changes(first) == Counter(
        {(0, 3, 1): 1, (1, 3, 1): 1, (2, 3, 1): 1, (3, 3, 1): 1, (4, 4, 1): 1}
        | {(5, 5, 1): 1, (0, 6, -1): 1}
    )
    c.advance(shard.upper, expected=3)
    shard.append(updates([(9, "r9", 7, 1)]))
    assert changes(c.changes()) == Counter({(9, 7, 1): 1})
    assert changes(shard.updates(c.position, shard.upper)) == Counter({(9, 7, 1): 1})
    assert changes(c.changes(to=c.position)) == Counter()


def test_advance_consumer_from_the_package(shard):
    c = shard.consumer("etl")
    assert ps.advance_consumer(shard.location, "etl", to=4, expected=0) == 4
    assert shard.consumers() == {"etl": 4}
    with pytest.raises(StateConflict) as e:
        ps.advance_consumer(shard.location, "etl", to=5, expected=c.position)
    assert e.value.actual == 4
    with pytest.raises(StateConflict, match="not there"):  # it never creates one
        ps.advance_consumer(shard.location, "nobody", to=1, expected=0)
    assert set(shard.consumers()) == {"etl"}
    with pytest.raises(InvalidOption, match="non-empty string"):
        ps.advance_consumer(shard.location, "", to=1, expected=0)


def test_no_shard_no_consumer(tmp_path):
    empty = ps.open_shard(str(tmp_path / "nothing"))
    for call in (
        lambda: empty.consumer("etl"),
        empty.consumers,
        lambda: ps.advance_consumer(empty.location, "etl", to=1, expected=0),
    ):
        with pytest.raises(NoShard):
            call()
    assert not (tmp_path / "nothing").exists()


def test_consumers_survive_rollups_and_replay(shard):
    c = shard.consumer("etl")
    for i in range(ROLLUP_EVERY + 2):
        shard.append(updates([(100 + i, "x", 6 + i, 1)]))
    c.advance(10, expected=0)
    fresh = Shard(shard.location)
    machine.SHARED_STATES.clear()
    state = fresh.inspect.state()
    assert state.consumers["etl"].position == 10
    assert ShardState.from_json(state.to_json()) == state
    replayed = fold(ShardState(), [e.commit for _, e in fresh._machine.entries(1)])
    assert replayed.consumers == state.consumers
    described = fresh.inspect.describe()["consumers"]["etl"]
    assert described["position"] == 10 and described["age_ms"] >= 0
    assert described["moved_ms"] == state.consumers["etl"].moved_ms


def test_a_state_with_a_consumer_outside_since_and_upper_is_refused(shard):
    from dataclasses import replace

    from persistshard.core.statemachine.state import ConsumerPosition
    from persistshard.errors import CorruptData

    state = shard.inspect.state()
    for bad in (ConsumerPosition(state.upper + 1, 0), ConsumerPosition(-1, 0)):
        with pytest.raises(CorruptData, match="consumer etl"):
            replace(state, consumers={"etl": bad}).check()


# --- lost responses on the advance commit -----------------------------------------------------


@pytest.mark.parametrize("fault", ["lose_response", "retry_after_lost", "duplicate"])
def test_a_lost_response_on_the_advance_resolves_to_one_move(tmp_path, fault):
    """The advance's log entry is created and its answer lost (or the client's own retry
    says "exists", or the request arrives twice): the advance is reported landed (or
    Indeterminate, then found landed by reading), never refused as a conflict with itself,
    and lands once."""
    location = str(tmp_path / "s")
    plain = ps.open_shard(location)
    for t in range(20):
        plain.append(updates([(t, "x", t, 1)]))
    plain.consumer("etl")
    blob = FaultyBlob(Blob(location), operations=frozenset({"put_if_absent"}), **{fault: 1.0})
    faulty = Shard(location, blob=blob, commit_backoff_seconds=0)
    c = faulty.consumer("etl")
    position = 0
    for to in (3, 7, 12, 19):
        try:
            assert c.advance(to, expected=position) == to
        except Indeterminate:
            blob.enabled = False
            assert Shard(location).consumers()["etl"] == to
            blob.enabled = True
        position = to
    assert blob.injected >= 4
    clean = Shard(location)
    assert clean.consumers() == {"etl": 19}
    moves = [h["summary"] for h in clean.history() if h["commit"] == "advance_consumer"]
    assert moves == [f"consumer etl {a} -> {b}" for a, b in ((0, 3), (3, 7), (7, 12), (12, 19))]
    assert clean.verify().ok


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.database)])
def db_url(request, tmp_path) -> str:
    """A database consensus: SQLite in the fast tier, PostgreSQL in the database tier."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/log.db"
    return str(request.getfixturevalue("postgres_url"))


def test_lost_database_answers_on_advances_resolve_and_a_racing_handle_loses(tmp_path, db_url):
    """On a database consensus: compare-and-sets of advances fail before they are made or are
    applied and their answer lost, at random (seeded). Each advance is reported landed, or
    fails (Indeterminate, or the injected TimeoutError of a read: raw, or a StorageError
    when the commit met it before any attempt) and is then found landed or
    not by reading; every move lands exactly once, and
    a handle that raced from an old position loses with the actual one."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, consensus=db_url)
    for t in range(12):
        shard.append(pa.table({"id": [t]}))
    shard.consumer("etl")
    loser = ps.open_shard(location, consensus=db_url).consumer("etl")
    faulty = FaultyConsensus(shard._machine.consensus, fail_before=0.2, fail_after=0.5, seed=7)
    shard._machine.consensus = faulty
    c = shard.consumer("etl")
    position = 0
    for to in range(2, 13, 2):
        while True:
            try:
                c.advance(to, expected=position)
                break
            except (Indeterminate, OSError):  # a read failed, or an answer was lost
                landed = ps.open_shard(location, consensus=db_url).consumers()["etl"]
                assert landed in (position, to)
                if landed == to:
                    break
        position = to
    assert faulty.injected >= 3
    faulty.fail_before = faulty.fail_after = 0.0
    with pytest.raises(StateConflict) as e:
        loser.advance(1, expected=0)
    assert e.value.actual == 12
    clean = ps.open_shard(location, consensus=db_url)
    assert clean.consumers() == {"etl": 12}
    moves = [h["summary"] for h in clean.history() if h["commit"] == "advance_consumer"]
    assert moves == [f"consumer etl {t - 2} -> {t}" for t in range(2, 13, 2)]
    assert rows_of(clean.snapshot()) == {(t,): 1 for t in range(12)}


def test_readme_consumers_example(repo_root, tmp_path, capsys):
    """The README's durable consumers example runs as printed, with ``/data`` in a temporary
    directory, and prints what its comments say."""
    with open(f"{repo_root}/README.md", encoding="utf-8") as f:
        readme = f.read()
    block = readme[readme.index("<!-- consumers-section:") :]
    start = block.index("```python") + len("```python")
    code = block[start : block.index("```", start)].replace('"/data/', f'"{tmp_path}/')
    exec(compile(code, "README.md (durable consumers)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "[{'id': 1, '_time': 0, '_diff': 1}, {'id': 2, '_time': 0, '_diff': 1}]",
        "[{'id': 3, '_time': 1, '_diff': 1}]",
        "1",
        "{'nightly-etl': 1} 0",
    ]
    assert ps.open_shard(f"{tmp_path}/orders").consumers() == {}
