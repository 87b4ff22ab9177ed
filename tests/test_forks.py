"""Forks and drops (issue 39, item 2; API.md "Several shards as one", Forks).

A fork names its source's parts through a typed reference and writes its metadata only; the
source's gc never deletes a part a fork names (a pin recorded before the fork's first entry),
the fork's gc never deletes the source's parts, and a fork releases its pin once no live
version of it names them. `drop` deletes a shard's own parts and log and releases its pins;
parts its live forks name stay. Every step of a fork and of a drop is cut (a process dying
before each store call) and has its response lost, and the shard, the fork and their pins
come out consistent. On local files, SQLite consensus, S3 (moto) and in Spark.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.conformance.crash import ENDINGS, Cut, CutBlob, LoseBlob
from persistshard.core.fork import DROPPING_KEY, identity
from persistshard.core.shard import Shard
from persistshard.core.statemachine.commits.add_fork import AddFork
from persistshard.core.statemachine.state import PIN_PENDING_MS, key_problem
from persistshard.core.storage.blob import open_blob
from persistshard.core.storage.layout import new_id
from persistshard.errors import Indeterminate

BUCKET = "persistshard-forks"


def rows(ids: list[int], tag: str = "v") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids]})


def contents(shard: Shard, as_of: int | None = None) -> list[dict[str, Any]]:
    return shard.snapshot(as_of).to_pylist()


def files_under(path: str) -> set[str]:
    out = set()
    for root, _, names in os.walk(path):
        for name in names:
            out.add(os.path.relpath(os.path.join(root, name), path))
    return out


@pytest.fixture(params=["files", "sqlite"])
def opener(request, tmp_path) -> Callable[[str], Shard]:
    """Opens shards under ``tmp_path`` with the log next to the data, or in one SQLite file."""
    if request.param == "files":
        return lambda name: ps.open_shard(str(tmp_path / name), inline_bytes=0)
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    return lambda name: ps.open_shard(str(tmp_path / name), consensus=url, inline_bytes=0)


def source_with_history(shard: Shard, n: int = 6) -> Shard:
    shard.maintenance.auto.enabled = False
    for i in range(n):
        shard.append(rows([i, 100 + i]))
    shard.append(pa.table({"id": pa.array([1], pa.int64()), "v": ["v1"], "_diff": [-1]}))
    return shard


def test_a_fork_reads_the_source_snapshot_and_writes_its_metadata_only(tmp_path, opener):
    src = source_with_history(opener("src"))
    src.consumer("nightly")  # the source's consumers and readers are not the fork's
    src.register_reader("reader-1")
    before = files_under(str(tmp_path / "src"))
    dev = src.fork(str(tmp_path / "dev"))
    assert not dev.consumers() and not dev.readers() and not dev.inspect.state().consumers
    assert (dev.since, dev.upper) == (src.upper - 1, src.upper)
    assert contents(dev) == contents(src)
    assert dev.verify().ok
    state = dev.inspect.state()
    assert (
        not state.holds
        and not state.writers
        and not state.stored_part_keys() - {p.key for p in state.parts() if p.source is not None}
    )
    # Every part is the source's, named by identity and location, its key inside the source.
    src_id = identity(src)
    for p in state.parts():
        assert p.source is not None and p.source.shard_id == src_id
        assert p.source.location == src.location and key_problem(p.key) is None
    assert state.sources == {src_id: src.location}
    # Written: metadata only (no part at the fork, nothing new at the source but its log).
    written = files_under(str(tmp_path / "dev"))
    assert not any(f.startswith("parts") for f in written), written
    assert {
        f for f in files_under(str(tmp_path / "src")) - before if f.startswith("parts")
    } == set()
    pin = src.inspect.state().forks[identity(dev)]
    assert set(pin.keys) == {p.key for p in state.parts()} and pin.location == dev.location
    assert [h["kind"] for h in dev.history()] == ["fork"]
    assert src.history()[-1]["kind"] == "add_fork"


def test_a_fork_at_an_earlier_time_sees_exactly_that_snapshot(tmp_path, opener):
    """An ``as_of`` inside a compacted batch: the parts holding updates on both sides are cut
    (their updates at or before ``as_of`` written as the fork's own part); later updates never
    show in the fork, whatever it appends."""
    src = source_with_history(opener("src"), 8)
    src.compact()
    assert len(src.inspect.state().trace) == 1
    dev = src.fork(str(tmp_path / "dev"), as_of=3)
    assert (dev.since, dev.upper) == (3, 4)
    assert contents(dev) == contents(src, 3)
    dev.append(rows([7000]))
    assert contents(dev) == sorted(
        [*contents(src, 3), {"id": 7000, "v": "v7000", "_diff": 1}], key=lambda r: r["id"]
    )
    assert dev.updates(4, 5).num_rows == 1
    assert dev.verify().ok


def test_as_of_and_destination_are_checked(tmp_path, opener):
    src = source_with_history(opener("src"), 3)
    src.advance_since(2)
    with pytest.raises(ps.SinceViolation):
        src.fork(str(tmp_path / "a"), as_of=1)
    with pytest.raises(ps.NotSealed):
        src.fork(str(tmp_path / "b"), as_of=src.upper)
    with pytest.raises(ps.InvalidOption, match="new location"):
        src.fork(str(tmp_path / "src"))
    other = opener("other")
    other.append(rows([1]))
    with pytest.raises(ps.InvalidOption, match="already holds a shard"):
        src.fork(str(tmp_path / "other"))
    with pytest.raises(ps.NoShard):
        opener("nothing").fork(str(tmp_path / "c"))
    assert not src.inspect.state().forks


def test_writes_on_either_side_never_change_the_other(tmp_path, opener):
    src = source_with_history(opener("src"), 4)
    base = contents(src)
    dev = src.fork(str(tmp_path / "dev"))
    dev.append(rows([50]))
    dev.upsert(rows([2], "changed"), "id")
    src.append(rows([60]))
    assert contents(src, dev.since) == base
    assert contents(dev, dev.since) == base
    assert {r["id"] for r in contents(dev)} - {r["id"] for r in base} == {50}
    assert {r["id"] for r in contents(src)} - {r["id"] for r in base} == {60}


def test_a_fork_survives_gc_at_retention_0_on_both_sides(tmp_path, opener):
    """The source compacts and gc's at retention 0: the fork still reads exactly. The fork
    compacts and gc's at retention 0: the source is intact, and the fork's pin goes; then
    the source's gc deletes what only the pin kept, and the fork still reads."""
    src = source_with_history(opener("src"))
    dev = src.fork(str(tmp_path / "dev"))
    expected = contents(dev)
    pinned = set(src.inspect.state().forks[identity(dev)].keys)
    src.compact()
    report = src.gc(dry_run=False, retention_seconds=0)
    assert not pinned & set(report.parts)
    assert contents(dev) == expected and dev.verify().ok
    on_disk = {f for f in files_under(str(tmp_path / "src")) if f.startswith("parts")}
    assert pinned <= on_disk

    dev.append(rows([900]))
    dev.compact()
    fork_report = dev.gc(dry_run=False, retention_seconds=0)
    assert fork_report.released_pins == [identity(src)]
    assert not src.inspect.state().forks
    assert src.verify().ok and contents(src, dev.since) == expected
    assert pinned <= {f for f in files_under(str(tmp_path / "src")) if f.startswith("parts")}
    assert all(p.source is None for p in dev.inspect.state().parts())

    later = src.gc(dry_run=False, retention_seconds=0)
    assert pinned <= set(later.parts)
    assert contents(dev, dev.since) == expected and dev.verify().ok
    assert src.verify().ok


def test_the_fork_keeps_its_pin_while_a_retained_version_names_the_source(tmp_path, opener):
    """gc's retention protects readers of the fork's older versions: its pin stays until the
    version that stopped naming the source's parts is older than the retention window."""
    src = source_with_history(opener("src"), 3)
    dev = src.fork(str(tmp_path / "dev"))
    dev.append(rows([900]))
    dev.compact()
    report = dev.gc(dry_run=False, retention_seconds=3600)
    assert report.unneeded_sources == [] and report.released_pins == []
    assert identity(dev) in src.inspect.state().forks


def test_a_fork_of_a_fork(tmp_path, opener):
    src = source_with_history(opener("src"), 4)
    dev = src.fork(str(tmp_path / "dev"))
    dev.append(rows([500]))
    dev2 = dev.fork(str(tmp_path / "dev2"))
    assert contents(dev2) == contents(dev)
    owners = {p.source.shard_id for p in dev2.inspect.state().parts() if p.source is not None}
    assert owners == {identity(src), identity(dev)}
    assert (
        identity(dev2) in src.inspect.state().forks and identity(dev2) in dev.inspect.state().forks
    )
    expected = contents(dev2)
    for shard in (src, dev):  # both compact and gc at retention 0
        shard.compact()
        shard.gc(dry_run=False, retention_seconds=0)
        shard.gc(dry_run=False, retention_seconds=0)
    assert identity(dev) not in src.inspect.state().forks  # dev released its own pin
    assert identity(dev2) in src.inspect.state().forks
    assert contents(dev2) == expected and dev2.verify().ok
    dev2.drop()
    assert not src.inspect.state().forks and not dev.inspect.state().forks
    assert src.verify().ok and dev.verify().ok


def test_drop_deletes_parts_and_log_and_releases_its_pins(tmp_path, opener):
    src = source_with_history(opener("src"), 3)
    dev = src.fork(str(tmp_path / "dev"))
    dev.append(rows([77]))
    plan = dev.drop(dry_run=True)
    assert plan.dry_run and len(plan.parts) == 1 and plan.log_deleted
    assert plan.released == [identity(src)]
    assert contents(dev)  # a dry run changes nothing
    done = dev.drop()
    assert not done.dry_run and done.deleted > 0
    assert files_under(str(tmp_path / "dev")) == set()
    assert not src.inspect.state().forks
    with pytest.raises(ps.NoShard):
        ps.open_shard(str(tmp_path / "dev"), inline_bytes=0).snapshot()
    with pytest.raises(ps.NoShard):
        dev.drop()
    # The location is free again: a new fork (or shard) may go there.
    again = src.fork(str(tmp_path / "dev"))
    assert contents(again) == contents(src)


def test_a_dropped_source_keeps_what_its_forks_name_until_they_release_it(tmp_path, opener):
    src = source_with_history(opener("src"), 3)
    dev = src.fork(str(tmp_path / "dev"))
    expected = contents(dev)
    src.append(rows([40]))  # a part of the source's that no fork names
    src_id = identity(src)
    report = src.drop()
    assert report.kept_parts and not report.log_deleted
    assert report.forks == [dev.location]
    assert len(report.parts) == 1
    with pytest.raises(ps.NoShard, match="dropped"):
        src.snapshot()
    with pytest.raises(ps.NoShard):
        src.append(rows([41]))
    assert contents(dev) == expected and dev.verify().ok
    # The fork moves off the source's parts: its gc releases the pin and finishes the drop.
    dev.compact()
    assert dev.gc(dry_run=False, retention_seconds=0).released_pins == [src_id]
    assert files_under(str(tmp_path / "src")) == set()
    assert contents(dev) == expected and dev.verify().ok


def test_gc_releases_a_dangling_pin_once_its_creation_is_over(tmp_path, clock):
    """A creation that died after its pin: no fork at the destination. The source's gc keeps
    the pin while the creation may still land, and releases it afterwards."""
    src = source_with_history(
        ps.open_shard(str(tmp_path / "src"), inline_bytes=0, clock=clock.now), 3
    )
    keys = tuple(sorted(src.inspect.state().stored_part_keys()))
    location = ps.open_shard(str(tmp_path / "ghost"), inline_bytes=0).location
    src._machine.commit(AddFork("ghost-id", location, keys, id=new_id()))
    src.compact()
    clock.advance(PIN_PENDING_MS // 2)
    report = src.gc(dry_run=False, retention_seconds=0)
    assert report.released_pins == [] and not set(keys) & set(report.parts)
    clock.advance(PIN_PENDING_MS)
    src.append(rows([99]))  # gc judges time by the newest commit (bounded clock lead)
    assert src.gc(dry_run=False, retention_seconds=0).released_pins == ["ghost-id"]
    assert set(keys) <= set(src.gc(dry_run=False, retention_seconds=0).parts) | set(
        src.gc(dry_run=True, retention_seconds=0).parts
    ) or not set(keys) & {f for f in files_under(str(tmp_path / "src"))}
    assert src.verify().ok


def test_a_fork_that_lost_the_race_with_a_compaction_forks_again(tmp_path, monkeypatch):
    """The source compacts and gc's between the fork's read and its pin: the pin is refused
    (its keys are no longer the shard's) and the fork starts again on the newest state."""
    from persistshard.core import fork as forks

    src = source_with_history(ps.open_shard(str(tmp_path / "src"), inline_bytes=0), 4)
    real = forks._plan
    calls = []

    def racing(state, as_of, source):
        if not calls:
            src.compact()
            src.gc(dry_run=False, retention_seconds=0)
        calls.append(state.version)
        return real(state, as_of, source)

    monkeypatch.setattr(forks, "_plan", racing)
    dev = src.fork(str(tmp_path / "dev"))
    assert len(calls) == 2 and calls[1] > calls[0]
    assert contents(dev) == contents(src) and dev.verify().ok
    assert len(src.inspect.state().forks) == 1


def test_cli_fork_and_drop(tmp_path, capsys):
    src = source_with_history(ps.open_shard(str(tmp_path / "src"), inline_bytes=0), 3)
    assert cli(["fork", str(tmp_path / "src"), str(tmp_path / "dev"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["as_of"] == src.upper - 1 and out["parts_written"] == 0 and out["parts_named"] > 0
    assert cli(["fork", str(tmp_path / "src"), str(tmp_path / "old"), "--as-of", "1"]) == 0
    assert "into" in capsys.readouterr().out
    assert contents(ps.open_shard(str(tmp_path / "old"), inline_bytes=0)) == contents(src, 1)
    assert cli(["drop", str(tmp_path / "dev")]) == 0
    assert "dry run" in capsys.readouterr().out
    assert ps.open_shard(str(tmp_path / "dev"), inline_bytes=0).upper == src.upper
    assert cli(["drop", str(tmp_path / "dev"), "--apply"]) == 0
    assert "deleted" in capsys.readouterr().out
    assert files_under(str(tmp_path / "dev")) == set()
    assert cli(["drop", str(tmp_path / "dev"), "--apply"]) == 2
    assert capsys.readouterr().err.startswith("NoShard")
    assert cli(["fork", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("NoShard")


# --- crash cuts and lost responses --------------------------------------------------------------


def _fresh() -> str:
    return f"memory://forks-{uuid.uuid4().hex}"


def _setup(url: str, consensus: str | None = None) -> tuple[list[dict[str, Any]], int]:
    src = ps.open_shard(url, consensus=consensus, maintenance=False, inline_bytes=0)
    for i in range(4):
        src.append(rows([i]))
    src.compact()
    src.append(rows([10]))
    return contents(src), src.upper


def _recover_and_check(
    url: str, dst: str, expected: list[dict[str, Any]], label: str, consensus: str | None = None
) -> None:
    """After a cut or a lost response: the source reads as before; a fork at ``dst`` either
    does not exist or reads the source's snapshot exactly, even after the source compacts and
    gc's at retention 0; then dropping whatever is at ``dst`` and a gc of the source past the
    pins' pending time leave no pin and no fork file behind."""
    src = ps.open_shard(url, consensus=consensus, maintenance=False, inline_bytes=0)
    assert contents(src) == expected, label
    assert src.verify().ok, label
    fork = ps.open_shard(dst, consensus=consensus, inline_bytes=0)
    exists = fork.inspect.state().version > 0 and not fork.inspect.state().dropped
    if exists:
        assert contents(fork) == expected, label
    src.compact()
    src.gc(dry_run=False, retention_seconds=0)
    if exists:
        assert contents(fork) == expected and fork.verify().ok, label
    try:
        fork.drop()
    except ps.NoShard:
        pass
    assert open_blob(dst).list("") == [], label
    later = src._machine.now_ms() + 2 * PIN_PENDING_MS
    src.append(rows([11]))  # the newest commit bounds gc's clock
    import persistshard.core.storage.layout as layout

    saved = layout.now_ms
    layout.now_ms = lambda: later  # type: ignore[assignment]
    try:
        src.append(rows([12]))
        src.gc(dry_run=False, retention_seconds=0)
    finally:
        layout.now_ms = saved  # type: ignore[assignment]
    assert not src.inspect.state().forks, label
    assert src.verify().ok, label


def _run_cut(
    op: Callable[[Shard, str], object], cut_at: int | None, consensus: str | None = None
) -> tuple[str, str, int]:
    url = _fresh()
    dst = f"{url}-dev"
    _setup(url, consensus)
    blob = CutBlob(open_blob(url), cut_at)
    shard = Shard(url, blob=blob, consensus=consensus, maintenance=False, inline_bytes=0)
    try:
        op(shard, dst)
    except Cut:
        pass
    return url, dst, blob.calls


def _fork(shard: Shard, dst: str) -> object:
    return shard.fork(dst)


def _fork_then_drop(shard: Shard, dst: str) -> object:
    return shard.fork(dst).drop()


@pytest.fixture(params=["blob-log", "sqlite-log"])
def log_url(request, tmp_path) -> str | None:
    """Where the logs of the cut runs are: next to the data (every store call is cut), or in
    SQLite (the markers, parts and the drop's marker are cut; the log's calls are not)."""
    return None if request.param == "blob-log" else f"sqlite:///{tmp_path / 'logs.db'}"


def test_a_fork_cut_before_every_store_call(log_url):
    _, _, steps = _run_cut(_fork, None, log_url)
    assert steps > (2 if log_url is None else 1)  # SQLite: only markers are store calls
    for cut_at in range(steps + 1):
        url, dst, _ = _run_cut(_fork, cut_at, log_url)
        expected = contents(ps.open_shard(url, consensus=log_url, inline_bytes=0))
        _recover_and_check(url, dst, expected, f"fork cut before call {cut_at}", log_url)


def test_a_drop_cut_before_every_store_call_finishes_when_run_again(log_url):
    """The fork is made whole, then its drop is cut before each store call: the fork either
    reads as before or as dropped, never half; running drop again deletes everything and
    releases the pin."""
    _, _, steps = _run_cut(_fork_then_drop, None, log_url)
    for cut_at in range(steps + 1):
        url, dst, _ = _run_cut(_fork_then_drop, cut_at, log_url)
        fork = ps.open_shard(dst, consensus=log_url, inline_bytes=0)
        expected = contents(ps.open_shard(url, consensus=log_url, inline_bytes=0))
        if open_blob(dst).get(DROPPING_KEY) is None and fork.inspect.state().version > 0:
            state = fork.inspect.state()
            if not state.dropped:
                assert contents(fork) == expected
        _recover_and_check(url, dst, expected, f"drop cut before call {cut_at}", log_url)


@pytest.mark.parametrize("op", [_fork, _fork_then_drop], ids=["fork", "fork-drop"])
def test_lost_responses_in_fork_and_drop(op):
    """The response to each store call is lost (a timeout, or "exists" for a conditional
    create), then the process goes on or dies: what returned is there, and the same recovery
    leaves everything consistent."""
    url = _fresh()
    _setup(url)
    counted = LoseBlob(open_blob(url))
    op(Shard(url, blob=counted, maintenance=False, inline_bytes=0), f"{url}-dev")
    checked = 0
    for lose_at, kind in enumerate(counted.kinds):
        for mode in ("lost", "exists") if kind == "put_if_absent" else ("lost",):
            for die_after in ENDINGS[:2]:  # goes on, dies at once (test_crash: all)
                url = _fresh()
                dst = f"{url}-dev"
                expected, _ = _setup(url)
                blob = LoseBlob(open_blob(url), lose_at, mode, die_after)
                try:
                    op(Shard(url, blob=blob, maintenance=False, inline_bytes=0), dst)
                except (Cut, OSError, Indeterminate, ps.StateConflict):
                    pass
                _recover_and_check(url, dst, expected, f"call {lose_at} ({kind}) {mode}")
                checked += 1
    assert checked > 10


# --- S3 and Spark ------------------------------------------------------------------------------


def test_fork_gc_and_drop_on_s3(s3_direct):
    base = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    src = source_with_history(ps.open_shard(f"{base}/src", **s3_direct, inline_bytes=0), 4)
    dev = src.fork(f"{base}/dev")
    expected = contents(dev)
    assert expected == contents(src)
    assert not open_blob(f"{base}/dev", **s3_direct).list("parts/")
    src.compact()
    src.gc(dry_run=False, retention_seconds=0)
    assert contents(dev) == expected and dev.verify().ok
    dev.append(rows([123]))
    dev.compact()
    assert dev.gc(dry_run=False, retention_seconds=0).released_pins == [identity(src)]
    assert src.verify().ok
    dev.drop()
    assert open_blob(f"{base}/dev", **s3_direct).list("") == []
    assert not src.inspect.state().forks


def test_spark_reads_a_fork(tmp_path, spark):
    src = source_with_history(ps.open_shard(str(tmp_path / "src"), inline_bytes=0), 4)
    dev = src.fork(str(tmp_path / "dev"))
    dev.append(rows([321]))
    got = spark.read.format("persistshard").load(str(tmp_path / "dev"))
    ids = sorted(r["id"] for r in got.collect())
    assert ids == sorted(r["id"] for r in contents(dev))


def test_a_fork_of_a_shard_with_inline_parts(tmp_path, opener_inline):
    """At the production default small appends travel inside the commits (inline parts): a
    fork carries those in its own state (nothing of the source's to pin) beside references
    to the source's part files; gc at retention 0 on both sides and a drop of the fork keep
    the source exact."""
    src = opener_inline("src")
    src.maintenance.auto.enabled = False
    big = pa.table({"id": pa.array(range(5000), pa.int64()), "v": [f"r{i}" for i in range(5000)]})
    src.append(big)  # a part file
    for i in range(3):
        src.append(rows([10_000 + i]))  # inline parts
    parts = src.inspect.state().parts()
    assert any(p.inline is not None for p in parts) and any(p.inline is None for p in parts)
    dev = src.fork(str(tmp_path / "dev"))
    expected = contents(src)
    assert contents(dev) == expected and dev.verify().ok
    inline = [p for p in dev.inspect.state().parts() if p.inline is not None]
    assert inline and all(p.source is None for p in inline)
    files = [p for p in dev.inspect.state().parts() if p.inline is None]
    assert files and all(p.source is not None for p in files)
    src.append(rows([20_000]))
    src.compact()
    src.gc(dry_run=False, retention_seconds=0)
    dev.gc(dry_run=False, retention_seconds=0)
    assert contents(dev) == expected and dev.verify().ok
    after = contents(src)
    assert len(after) == len(expected) + 1
    dev.drop()
    assert contents(src) == after and src.verify().ok


@pytest.fixture(params=["files", "sqlite"])
def opener_inline(request, tmp_path) -> Callable[[str], Shard]:
    """As `opener`, at the production inline default."""
    if request.param == "files":
        return lambda name: ps.open_shard(str(tmp_path / name))
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    return lambda name: ps.open_shard(str(tmp_path / name), consensus=url)
