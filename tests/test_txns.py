"""Transactions over many shards (issue 39, item 1; API.md "Several shards as one").

A txns shard commits a write to any number of registered data shards at one time with one
compare-and-append; applying it to the data shards is idempotent and anyone may do it; a
registered shard reads at the logical upper with the committed writes, applied or not, and
refuses plain writes. Faults: a crash cut before every store call of a transaction loses
nothing committed and applies nothing uncommitted; racing transactions: one wins, the loser
is `UpperMismatch` with nothing applied; a lost response resolves by the transaction's id;
gc at retention 0 with pending writes keeps them. On local files and SQLite consensus (the
cut runs: memory with the log next to the data, and SQLite).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
import persistshard.core.storage.layout as layout
from persistshard.conformance.crash import ENDINGS, Cut, CutBlob, LoseBlob
from persistshard.core import txns as txns_module
from persistshard.core.fork import identity
from persistshard.core.shard import Shard
from persistshard.core.statemachine.state import PIN_PENDING_MS
from persistshard.core.storage.blob import open_blob
from persistshard.core.txns import TxnsShard
from persistshard.errors import Indeterminate


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def ids(shard: Shard, as_of: int | None = None) -> list[int]:
    return sorted(r["id"] for r in shard.snapshot(as_of).to_pylist() for _ in range(r["_diff"]))


@pytest.fixture(params=["files", "sqlite"])
def where(request, tmp_path) -> Callable[..., Any]:
    """``where(name)``: a location under ``tmp_path``; ``where.opts``: the options that open
    shards and txns shards there (log next to the data, or one SQLite file)."""
    consensus = None if request.param == "files" else f"sqlite:///{tmp_path / 'logs.db'}"

    def at(name: str) -> str:
        return str(tmp_path / name)

    at.consensus = consensus  # type: ignore[attr-defined]
    return at


def open_data(where: Any, name: str, **kw: Any) -> Shard:
    return ps.open_shard(where(name), consensus=where.consensus, inline_bytes=0, **kw)


def open_x(where: Any, **kw: Any) -> TxnsShard:
    return ps.open_txns(where("_txns"), consensus=where.consensus, inline_bytes=0, **kw)


def test_a_transaction_lands_on_every_shard_at_one_time(where):
    a = open_data(where, "a")
    a.append(rows([1, 2]))
    a.append(rows([3]))
    txns = open_x(where)
    txns.register(where("a"), where("b"))
    assert (
        txns.upper >= a.inspect.state().upper + 1
    )  # registered at a time no earlier than its upper
    with txns.begin() as tx:
        tx.append(where("a"), rows([4]))
        tx.append(where("b"), rows([10, 11]))
    t = tx.committed_at
    assert t is not None and txns.upper == t + 1
    a, b = open_data(where, "a"), open_data(where, "b")
    assert a.upper == b.upper == t + 1
    assert ids(a) == [1, 2, 3, 4] and ids(b) == [10, 11]
    assert ids(a, t - 1) == [1, 2, 3] and ids(b, t - 1) == []
    # Applied: the data shards' own states hold the writes at t.
    assert a.inspect.state().upper == b.inspect.state().upper == t + 1
    assert [h["kind"] for h in b.history()][-1] == "apply_txn"
    assert txns.apply() == 0  # idempotent
    # A second transaction moves both again, even one that writes to a only.
    with txns.begin() as tx2:
        tx2.append(where("a"), pa.table({"id": [1], "v": ["v1"], "_diff": [-1]}))
    assert tx2.committed_at == t + 1
    assert open_data(where, "b").upper == t + 2
    assert ids(open_data(where, "a")) == [2, 3, 4]
    assert a.verify().ok and b.verify().ok


def test_plain_writes_to_a_registered_shard_are_refused(where):
    a = open_data(where, "a")
    a.append(rows([1]))
    txns = open_x(where)
    txns.register(where("a"))
    before = a.inspect.state()
    for write in (
        lambda: a.append(rows([2])),
        lambda: a.seal(a.inspect.state().upper + 5),
        lambda: a.upsert(rows([1]), "id"),
    ):
        with pytest.raises(
            ps.InvalidOption, match=r"^InvalidOption.*registered with the txns"
        ) as e:
            write()
        assert txns.location in str(e.value)
    after = a.inspect.state()
    assert (after.upper, after.trace, after.unsealed) == (
        before.upper,
        before.trace,
        before.unsealed,
    )
    assert a.inspect.state().stored_part_keys() == {
        m.key for m in open_blob(where("a")).list("parts/")
    }


def test_forget_applies_seals_and_makes_a_plain_shard_again(where, monkeypatch):
    txns = open_x(where)
    txns.register(where("a"), where("b"))
    monkeypatch.setattr(txns_module, "apply_write", lambda data, w: 0)  # the committer died
    with txns.begin() as tx:
        tx.append(where("a"), rows([1]))
        tx.append(where("b"), rows([2]))
    monkeypatch.undo()
    assert open_data(where, "b").inspect.state().upper == 0  # not applied yet
    upper = txns.forget(where("b"))
    b = open_data(where, "b")
    assert (
        b.inspect.state().txns is None and b.inspect.state().upper == upper >= tx.committed_at + 1
    )
    assert ids(b) == [2]
    b.append(rows([3]))  # a plain shard again
    assert ids(b) == [2, 3]
    registered = txns.registered()
    assert layout.canonical_location(where("b")) not in registered
    assert layout.canonical_location(where("a")) in registered
    with pytest.raises(ps.InvalidOption, match="not registered"):
        with txns.begin() as tx:
            tx.append(where("b"), rows([4]))
    assert txns.forget(where("b")) == b.inspect.state().upper  # idempotent
    assert ids(open_data(where, "a")) == [1]


def test_a_later_transaction_applies_an_earlier_unapplied_write_first(where, monkeypatch):
    """A transaction committed but not applied (its apply failed after the commit), then a
    later one on the same shard: the later commit applies both, in time order. Applying only
    its own batch would move the shard's upper past the earlier write and lose it."""
    txns = open_x(where)
    txns.register(where("a"))

    def lost(data: Shard, w: Any) -> int:
        raise OSError("the apply's answer was lost")

    monkeypatch.setattr(txns_module, "apply_write", lost)
    with txns.begin() as first:
        first.append(where("a"), rows([1]))
    monkeypatch.undo()
    assert open_data(where, "a").inspect.state().upper <= first.committed_at
    with txns.begin() as second:
        second.append(where("a"), rows([2]))
    a = open_data(where, "a")
    assert a.inspect.state().upper == second.committed_at + 1
    assert ids(a) == [1, 2] and ids(a, first.committed_at) == [1]
    assert txns.apply() == 0


def test_committed_writes_are_read_before_they_are_applied(where, monkeypatch):
    """A handle on a registered shard that nobody applied to yet (the committer died after
    its commit) reads the logical upper and the pending writes in every read path."""
    a = open_data(where, "a")
    a.append(rows([1]))
    txns = open_x(where)
    txns.register(where("a"), where("b"))
    monkeypatch.setattr(txns_module, "apply_write", lambda data, w: 0)
    with txns.begin() as tx:
        tx.append(where("a"), rows([2]))
        tx.append(where("b"), rows([5]))
    monkeypatch.undo()
    t = tx.committed_at
    a, b = open_data(where, "a"), open_data(where, "b")
    assert (
        a.inspect.state().upper <= t
        and b.inspect.state().version > 0
        and b.inspect.state().upper <= t
    )
    assert a.upper == b.upper == t + 1
    assert ids(a) == [1, 2] and ids(b) == [5] and ids(a, t - 1) == [1]
    assert sorted(a.scan().to_arrow().column("id").to_pylist()) == [1, 2]
    changes = a.updates(0, t + 1).to_pylist()
    assert [(r["id"], r["_time"]) for r in changes if r["_time"] == t] == [(2, t)]
    assert b.scan_updates(0, t + 1).to_arrow().column("id").to_pylist() == [5]
    with a.listen(t - 1, timeout=0.1) as listener:
        first, frontier = next(listener)
        assert sorted(first.column("id").to_pylist()) == [1] and frontier == t
        batch, frontier = next(listener)
        assert batch.column("id").to_pylist() == [2] and frontier == t + 1
    assert txns.apply() == 2 and txns.apply() == 0
    assert a.inspect.state().upper == t + 1 and ids(a) == [1, 2]


def test_racing_transactions_one_wins_the_loser_applies_nothing(where):
    txns = open_x(where)
    txns.register(where("a"), where("b"))
    first, second = txns.begin(), txns.begin()
    first.append(where("a"), rows([1]))
    second.append(where("a"), rows([2]))
    second.append(where("b"), rows([3]))
    first.append(where("b"), rows([4]))
    t = first.commit()
    with pytest.raises(ps.UpperMismatch):
        second.commit()
    assert second.committed_at is None
    a, b = open_data(where, "a"), open_data(where, "b")
    assert ids(a) == [1] and ids(b) == [4] and a.upper == t + 1
    for shard, name in ((a, "a"), (b, "b")):
        state = shard.inspect.state()
        assert not state.txn_pins
        stored = {m.key for m in open_blob(where(name)).list("parts/")}
        assert stored == state.stored_part_keys()  # the loser's parts are gone
    assert txns.apply() == 0


def test_gc_at_retention_0_keeps_pending_writes(where, clock, monkeypatch):
    """The committer dies after the txns commit; long after every lease ran out, the data
    shards compact and gc at retention 0: the pending parts stay, and applying them later
    (never refused for the expired lease) gives the committed contents."""
    opts = {"clock": clock.now}
    a = open_data(where, "a", **opts)
    a.append(rows([1]))
    txns = open_x(where, **opts)
    txns.register(where("a"), where("b"))
    monkeypatch.setattr(txns_module, "apply_write", lambda data, w: 0)
    with txns.begin() as tx:
        tx.append(where("a"), rows([2, 3]))
        tx.append(where("b"), rows([4]))
    monkeypatch.undo()
    clock.advance(3_600_000)
    for name in ("a", "b"):
        shard = open_data(where, name, **opts)
        shard.set_retention(versions=1)  # a commit at the late time: it bounds gc's clock
        shard.compact()
        report = shard.gc(dry_run=False, retention_seconds=0)
        assert report.fence_version == 0 or shard.inspect.state().lease_fence_ms > 0
        assert shard.inspect.state().txn_pins  # still pending, still pinned
    assert txns.apply() == 2
    a, b = open_data(where, "a", **opts), open_data(where, "b", **opts)
    assert ids(a) == [1, 2, 3] and ids(b) == [4]
    assert not a.inspect.state().txn_pins and a.verify().ok and b.verify().ok


def test_the_txns_shard_history_stays_bounded(where):
    txns = open_x(where)
    txns.register(where("a"))
    for i in range(12):
        with txns.begin() as tx:
            tx.append(where("a"), rows([i]))
    view = txns.view()
    assert len(view.writes) <= 1  # applied writes are retracted by the next commit
    state = txns.shard.inspect.state()
    assert state.since >= state.upper - 3
    assert len(state.parts()) <= 8  # compaction consolidates the retracted pairs
    described = open_data(where, "a").inspect.describe()
    assert described["txns"]["id"] == txns.identity() and described["pending_transactions"] == []
    assert ids(open_data(where, "a")) == list(range(12))


def test_registrations_name_shards_by_identity(where, tmp_path):
    txns = open_x(where)
    a = open_data(where, "a")
    a.append(rows([1]))
    txns.register(where("a"))
    registered = txns.view().registered
    assert list(registered) == [identity(a)]
    ref = a.inspect.state().txns
    assert ref is not None and ref.shard_id == txns.identity()
    # Another spelling of the same location is the same shard.
    txns.register(str(tmp_path / "x" / ".." / "a"))
    assert list(txns.view().registered) == [identity(a)]


# --- crash cuts and lost responses ------------------------------------------------------------


def _fresh() -> str:
    return f"memory://txns-{uuid.uuid4().hex}"


def _setup(base: str, consensus: str | None) -> None:
    a = ps.open_shard(f"{base}/a", consensus=consensus, inline_bytes=0)
    a.append(rows([1]))
    txns = ps.open_txns(f"{base}/_txns", consensus=consensus, inline_bytes=0)
    txns.register(f"{base}/a", f"{base}/b")


def _transaction(txns: TxnsShard, base: str) -> None:
    with txns.begin() as tx:
        tx.append(f"{base}/a", rows([2]))
        tx.append(f"{base}/b", rows([3, 4]))


def _with_blob(base: str, blob: Any, consensus: str | None) -> TxnsShard:
    shard = Shard(
        f"{base}/_txns", blob=blob, consensus=consensus, maintenance=False, inline_bytes=0
    )
    return TxnsShard(shard)


def _recover_and_check(base: str, consensus: str | None, label: str) -> bool:
    """The transaction either landed on both shards or on neither; applying finishes it; gc
    past the pins' pending time leaves no pin and every part stored is named. Whether it
    landed."""
    txns = ps.open_txns(f"{base}/_txns", consensus=consensus, inline_bytes=0)
    a = ps.open_shard(f"{base}/a", consensus=consensus, inline_bytes=0)
    b = ps.open_shard(f"{base}/b", consensus=consensus, inline_bytes=0)
    seen = (ids(a), ids(b) if b.inspect.state().version else [])
    assert seen in (([1], []), ([1, 2], [3, 4])), label
    txns.apply()
    assert (ids(a), ids(b) if b.inspect.state().version else []) == seen, label
    landed = seen[0] == [1, 2]
    if landed:
        assert a.inspect.state().upper == b.inspect.state().upper == txns.upper, label
    later = a._machine.now_ms() + 2 * PIN_PENDING_MS
    saved = layout.now_ms
    layout.now_ms = lambda: later  # type: ignore[assignment]
    try:
        # The txns shard takes the next transaction (whose commits bound gc's clock), and gc
        # past the pins' pending time releases what a transaction that died left pinned.
        _transaction(txns, base)
        n = 2 if landed else 1
        assert ids(a) == [1, *[2] * n] and ids(b) == [*[3] * n, *[4] * n], label
        for shard, name in ((a, "a"), (b, "b")):
            shard.gc(dry_run=False, retention_seconds=0)
            assert not shard.inspect.state().txn_pins, label
            stored = {m.key for m in open_blob(f"{base}/{name}").list("parts/")}
            assert stored == shard.inspect.state().stored_part_keys(), label
            assert shard.verify().ok, label
    finally:
        layout.now_ms = saved  # type: ignore[assignment]
    return landed


@pytest.fixture(params=["blob-log", "sqlite-log"])
def log_url(request, tmp_path) -> Iterator[str | None]:
    yield None if request.param == "blob-log" else f"sqlite:///{tmp_path / 'logs.db'}"


def test_a_transaction_cut_before_every_store_call(log_url):
    """The process dies before its k-th store call (parts, pins, the txns commit, each apply)
    for every k: what committed is never lost, and nothing half-committed appears."""
    base = _fresh()
    _setup(base, log_url)
    counted = CutBlob(open_blob(f"{base}/_txns"))
    _transaction(_with_blob(base, counted, log_url), base)
    steps = counted.calls
    assert steps >= (6 if log_url is None else 3)
    outcomes = set()
    for cut_at in range(steps + 1):
        base = _fresh()
        _setup(base, log_url)
        try:
            _transaction(
                _with_blob(base, CutBlob(open_blob(f"{base}/_txns"), cut_at), log_url), base
            )
        except Cut:
            pass
        outcomes.add(_recover_and_check(base, log_url, f"cut before call {cut_at}"))
    assert outcomes == {True, False}


def test_lost_responses_in_a_transaction():
    """The response to each store call is lost (a timeout, or "exists" for a conditional
    create: the txns commit's lost answer), then the process goes on or dies: the
    transaction resolves by its id (landed or not, never doubled), and recovery leaves both
    shards consistent."""
    base = _fresh()
    _setup(base, None)
    counted = LoseBlob(open_blob(f"{base}/_txns"))
    _transaction(_with_blob(base, counted, None), base)
    checked = 0
    for lose_at, kind in enumerate(counted.kinds):
        for mode in ("lost", "exists") if kind == "put_if_absent" else ("lost",):
            for die_after in ENDINGS[:2]:
                base = _fresh()
                _setup(base, None)
                blob = LoseBlob(open_blob(f"{base}/_txns"), lose_at, mode, die_after)
                try:
                    _transaction(_with_blob(base, blob, None), base)
                except (Cut, OSError, Indeterminate):
                    pass
                _recover_and_check(base, None, f"call {lose_at} ({kind}) {mode} {die_after}")
                checked += 1
    assert checked > 10


def test_a_lost_commit_response_resolves_by_the_transaction_id(monkeypatch):
    """The txns commit lands but its answer is lost: the committer reads the log back for
    the transaction's id, reports it committed and applies it."""
    base = _fresh()
    _setup(base, None)
    txns = ps.open_txns(f"{base}/_txns", inline_bytes=0)
    consensus = txns.shard._machine.consensus
    real = consensus.compare_and_set
    lost = []

    def lose_once(expected: int | None, data: bytes) -> bool:
        ok = real(expected, data)
        if ok and not lost and b"write" in data:
            lost.append(expected)
            raise TimeoutError("the answer was lost")
        return ok

    monkeypatch.setattr(consensus, "compare_and_set", lose_once)
    _transaction(txns, base)
    assert lost
    a = ps.open_shard(f"{base}/a")
    b = ps.open_shard(f"{base}/b")
    assert ids(a) == [1, 2] and ids(b) == [3, 4]
    assert a.inspect.state().upper == b.inspect.state().upper == txns.upper


def test_readme_transactions_example(repo_root, capsys):
    """The README's transactions example runs as printed and prints what it says."""
    with open(f"{repo_root}/README.md", encoding="utf-8") as f:
        readme = f.read()
    block = readme[readme.index("<!-- txns-section:") :]
    start = block.index("```python") + len("```python")
    code = block[start : block.index("```", start)]
    exec(compile(code, "README.md (transactions)", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "True 2",
        "plain writes go through the txns shard",
    ]


def test_inspect_shows_the_registration(where, capsys):
    from persistshard.cli import main as cli

    txns = open_x(where)
    txns.register(where("a"))
    with txns.begin() as tx:
        tx.append(where("a"), rows([1]))
    args = ["inspect", where("a")]
    if where.consensus is not None:
        args += ["--consensus", where.consensus]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert f"registered with {txns.location}" in out and f"logical upper {txns.upper}" in out


def test_a_transaction_checks_columns_against_pending_writes(where, monkeypatch):
    """A shard whose first write is committed but not applied: the next transaction's rows
    are checked against its columns (a write that could never apply is refused up front)."""
    txns = open_x(where)
    txns.register(where("b"))
    monkeypatch.setattr(txns_module, "apply_write", lambda data, w: 0)
    with txns.begin() as tx:
        tx.append(where("b"), rows([1]))
    monkeypatch.undo()
    assert open_data(where, "b").inspect.state().schema is None  # not applied
    with pytest.raises(ps.InvalidUpdates):
        with txns.begin() as tx:
            tx.append(where("b"), pa.table({"other": ["x"]}))
    assert txns.apply() == 1 and ids(open_data(where, "b")) == [1]
    assert not open_data(where, "b").inspect.state().txn_pins
