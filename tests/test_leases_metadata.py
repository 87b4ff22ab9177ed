"""Bounded metadata and retries: writer records expire and are pruned, the commit loop backs
off with jitter after lost races and gives up with `CommitDeadline` after its deadline."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conformance_helpers import updates

import persistshard as ps
from persistshard.core.statemachine import machine
from persistshard.core.statemachine import state as st
from persistshard.core.statemachine.commits import apply
from persistshard.core.statemachine.commits.advance_since import AdvanceSince
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.storage.layout import new_id
from persistshard.errors import CommitDeadline, WriterAlreadyCommitted

DAY_MS = 24 * 3600 * 1000


def stream_append(shard: ps.Shard, writer: str, batch: int) -> None:
    t = shard.upper
    shard.compare_and_append(updates([(batch, writer, t, 1)]), t, t + 1, writer=(writer, batch))


def test_writer_records_expire_after_the_record_period(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), clock=clock.now)
    stream_append(shard, "old", 0)
    clock.ms += st.WRITER_RECORD_MS // 2
    stream_append(shard, "recent", 0)
    assert set(shard.inspect.state().writers) == {"old", "recent"}
    clock.ms += st.WRITER_RECORD_MS // 2 + 1
    for _ in range(st.PRUNE_EVERY):  # a prune is due at least every PRUNE_EVERY versions
        shard.append(updates([(9, "plain", shard.upper, 1)]))
    assert shard.inspect.state().writers == {"recent": 0}
    assert set(shard.inspect.state().writers_seen_ms) == {"recent"}
    # A live record still makes a replay a no-op.
    version = shard.inspect.state().version
    with pytest.raises(WriterAlreadyCommitted):
        apply(
            shard.inspect.state(),
            Append(
                shard.upper,
                shard.upper,
                st.Batch("x", 0, 0, ()),
                writer=("recent", 0),
                id=new_id(),
            ),
        )
    assert shard.inspect.state().version == version


def test_writer_records_are_capped_least_recent_first(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(st, "MAX_WRITER_RECORDS", 5)
    shard = ps.open_shard(str(tmp_path / "s"), clock=clock.now)
    for i in range(8):
        clock.ms += 1
        stream_append(shard, f"w{i}", 0)
    writers = set(shard.inspect.state().writers)
    assert {f"w{i}" for i in range(3, 8)} <= writers and len(writers) <= 5 + 5 // 4
    assert not {"w0", "w1"} & writers  # the least recent went first
    # Folding the log from scratch prunes the same records.
    assert (
        ps.open_shard(shard.location, clock=clock.now).inspect.state().writers
        == shard.inspect.state().writers
    )


def test_records_written_before_commit_times_were_kept_expire_too(clock):
    old = st.ShardState(version=3, writers={"legacy": 4})
    stamped = st.prune_writers(old, clock.ms)
    assert stamped.writers_seen_ms == {"legacy": clock.ms}
    assert st.prune_writers(stamped, clock.ms + st.WRITER_RECORD_MS).writers == {}


class LosingConsensus:
    """Wraps a consensus; the first ``losses`` compare-and-sets report a lost race."""

    def __init__(self, inner, losses: int) -> None:
        self.inner, self.losses = inner, losses

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def compare_and_set(self, expected, data):
        if self.losses:
            self.losses -= 1
            return False
        return self.inner.compare_and_set(expected, data)


def test_lost_races_back_off_with_jitter_then_land(tmp_path, monkeypatch):
    import threading
    import time as real_time

    pauses: list[float] = []
    real_sleep = real_time.sleep
    caller = threading.current_thread()

    def sleep(seconds: float) -> None:  # time.sleep is process-wide: count only this thread's
        if threading.current_thread() is caller:
            pauses.append(seconds)
        else:
            real_sleep(seconds)  # the lease keeper thread of an earlier test

    monkeypatch.setattr(machine.time, "sleep", sleep)
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(updates([(1, "a", 0, 1)]))
    shard._machine.consensus = LosingConsensus(shard._machine.consensus, 12)  # type: ignore[assignment]
    shard.append(updates([(2, "b", shard.upper, 1)]))
    assert shard.upper == 2
    assert len(pauses) == 11  # the first retry is immediate
    assert all(0 <= p <= machine.MAX_BACKOFF_SECONDS for p in pauses)
    assert len(set(pauses)) > 1  # random, not lockstep
    # The cap of the n-th pause doubles: late pauses may be longer than any early cap.
    assert max(pauses[:2]) <= machine.RACE_BACKOFF_SECONDS * 2**3


def test_a_commit_that_keeps_losing_gives_up_at_its_deadline(tmp_path, monkeypatch):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(updates([(1, "a", 0, 1)]))
    before = shard.inspect.state()
    shard._machine.consensus = LosingConsensus(shard._machine.consensus, 10**9)  # type: ignore[assignment]
    with pytest.raises(CommitDeadline) as info:
        shard._machine.commit(AdvanceSince(1, id=new_id()), deadline_seconds=0.05)
    assert str(info.value).startswith("CommitDeadline: ") and "nothing landed" in str(info.value)
    assert ps.open_shard(shard.location).inspect.state() == before


def test_a_write_that_gives_up_deletes_its_parts(tmp_path, monkeypatch):
    shard = ps.open_shard(str(tmp_path / "s"), commit_deadline_seconds=0.05)
    shard.append(updates([(1, "a", 0, 1)]))
    keys = {m.key for m in shard._blob.list("parts/")}
    shard._machine.consensus = LosingConsensus(shard._machine.consensus, 10**9)  # type: ignore[assignment]
    with pytest.raises(CommitDeadline):
        shard.compare_and_append(updates([(2, "b", 1, 1)]), 1, 2)
    assert {m.key for m in shard._blob.list("parts/")} == keys


def test_remap_since_follows_its_outputs_since(tmp_path):
    """The remap shard's since advances with its outputs' since (never past either output's
    since nor to an upper), its bindings compact, and resuming and reclocking stay exact."""
    remap = ps.open_remap(str(tmp_path / "remap"))
    a = ps.open_shard(str(tmp_path / "a"))
    b = ps.open_shard(str(tmp_path / "b"))
    for offset in range(1, 9):
        t = remap.mint({"p:0": offset * 10})
        for out in (a, b):
            out.compare_and_append(updates([(offset, "x", t, 1)]), out.upper, t + 1)
    assert remap.shard.since == 0
    a.advance_since(6)
    b.advance_since(4)
    assert remap.follow_since([a, b]) == 4
    before = ps.resume_frontier(remap, [a, b])
    remap.shard.compact()
    fresh = ps.open_remap(remap.location)
    assert fresh.shard.since == 4
    assert ps.resume_frontier(fresh, [a, b]) == before == {"p:0": 80}
    # Records bound after since keep their times; older ones reclock to since.
    got = fresh.reclock(pa.array(["p:0", "p:0", "p:0"]), pa.array([5, 45, 75])).to_pylist()
    assert got == [4, 4, 7]
    assert len(fresh.shard.inspect.state().trace) < 8  # the bindings below since were compacted
    # An output at its upper cannot drag the since to it.
    c = ps.open_shard(str(tmp_path / "c"))
    c.compare_and_append(updates([(1, "x", 0, 1)]), 0, 8)
    c.advance_since(8)
    a.advance_since(8)
    b.advance_since(8)
    assert fresh.follow_since([a, b, c]) == 7


def test_spill_directories_of_killed_processes_are_swept(tmp_path):
    """A process killed mid-write leaves its spill directory; the next process that spills
    into the same place deletes it, and leaves a live process's directory alone."""
    import os
    import subprocess
    import sys

    from persistshard.core.write import correction as corr

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"{corr.SPILL_PREFIX}{dead_pid}-abc"
    stale.mkdir()
    (stale / "run-0.arrow").write_bytes(b"x" * 100)
    live = tmp_path / f"{corr.SPILL_PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "correction-no-pid"
    other.mkdir()
    schema = pa.schema([("k", pa.int64()), ("_time", pa.int64()), ("_diff", pa.int64())])
    c = corr.Correction(schema, budget_bytes=20_000, spill_dir=str(tmp_path))
    for i in range(20):
        n = range(i * 1000, i * 1000 + 1000)
        c.insert(pa.table({"k": list(n), "_time": [i] * 1000, "_diff": [1] * 1000}, schema=schema))
    assert c.stats["spilled_runs"] > 0
    assert not stale.exists() and live.exists() and other.exists()
    c.close()
