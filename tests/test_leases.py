"""Write leases: gc never deletes the parts of a live write, a write whose lease ran out is
refused with `LeaseExpired` (never `CorruptData` later), and gc's fence stops a stalled commit.

Every test drives the shard's clock (`persistshard.core.storage.layout.now_ms`) by hand; nothing
depends on how fast the machine is. Leases protect part files, so the writers here write every
part as a file (``inline_bytes=0``).
"""

from __future__ import annotations

import time
import uuid

import pytest
from conformance_helpers import rows_of, tick, updates

import persistshard as ps
from persistshard.core.shard import write_transaction
from persistshard.core.statemachine import leases
from persistshard.core.statemachine.commits.renew_lease import RenewLease
from persistshard.core.storage.blob import BlobWrapper
from persistshard.core.storage.consensus import Consensus, MemoryConsensus, VersionedData
from persistshard.core.storage.layout import new_id
from persistshard.errors import LeaseExpired

HOUR_MS = 3600 * 1000


def part_files(shard: ps.Shard) -> set[str]:
    return {m.key for m in shard._blob.list("parts/")}


def pending_write(shard: ps.Shard, item: str = "slow") -> tuple[str, ps.shard.WrittenUpdates]:
    """Parts of a write at the current upper, written but not committed (its id minted at
    the shard's clock)."""
    write_id = shard._machine.new_write_id()
    written = write_transaction(shard, write_id).write_updates(
        updates([(7, item, shard.upper, 1)]),
        lower=shard.upper,
        new_upper=shard.upper + 1,
        schema=shard.schema,
    )
    return write_id, written


def commit(shard: ps.Shard, written: ps.shard.WrittenUpdates, expected: int) -> None:
    write_transaction(shard).commit(
        written, expected_upper=expected, new_upper=expected + 1, schema=None
    )


def test_write_outliving_retention_with_gc_in_between_is_refused(tmp_path, clock):
    """A write takes two hours (longer than gc's retention and its implicit lease) and gc runs
    meanwhile. Before leases, gc deleted its parts and the commit then landed: every later
    read was CorruptData. Now the commit is refused with LeaseExpired and the shard stays
    readable and verifiable."""
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    expected = shard.upper
    write_id, written = pending_write(shard)
    tick(shard, clock, 2 * HOUR_MS)
    report = shard.gc(dry_run=False, now_ms=clock.ms)
    assert set(report.orphaned_parts) == set(written.keys())
    with pytest.raises(LeaseExpired) as info:
        commit(shard, written, expected)
    assert str(info.value).startswith("LeaseExpired: ") and write_id in str(info.value)
    fresh = ps.open_shard(shard.location, clock=clock.now)
    assert rows_of(fresh.snapshot()) == {(1, "a"): 1}
    assert fresh.verify().ok
    assert part_files(fresh) == fresh.inspect.state().part_keys()


def test_commit_after_the_lease_ran_out_is_refused_even_without_gc(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    before = shard.inspect.state()
    _, written = pending_write(shard)
    clock.advance(HOUR_MS + 1)
    with pytest.raises(LeaseExpired):
        commit(shard, written, before.upper)
    assert ps.open_shard(shard.location, clock=clock.now).inspect.state() == before
    assert not (set(written.keys()) & part_files(shard))  # a refused commit deletes its parts


def test_gc_keeps_parts_of_a_live_write_and_a_renewed_write_commits(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    expected = shard.upper
    write_id, written = pending_write(shard)
    lease = leases.WriteLease(shard._machine, write_id)  # renewed by hand: no thread here
    for _ in range(4):  # four hours, renewed every 50 minutes, gc every 50 minutes
        clock.advance(50 * 60 * 1000)
        lease.renew()
        report = shard.gc(dry_run=False, now_ms=clock.ms)
        assert not set(written.keys()) & set(report.parts)
        assert report.leased_parts == len(written.keys())
    assert shard.inspect.state().leases == {write_id: lease.expires_ms}
    commit(shard, written, expected)
    assert rows_of(shard.snapshot()) == {(1, "a"): 1, (7, "slow"): 1}
    assert shard.inspect.state().leases == {}  # the commit released the lease
    assert shard.verify().ok


def test_a_lease_never_comes_back(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    write_id, _ = pending_write(shard)
    clock.advance(HOUR_MS + 1)
    with pytest.raises(LeaseExpired):
        leases.renew(shard._machine, write_id, 600)


class GcBeforeCas(Consensus):
    """A consensus whose next compare-and-set first lets gc run to completion: the committer
    stamped and checked its commit, then stalled past its lease while gc swept."""

    def __init__(self, inner: Consensus) -> None:
        self.inner = inner
        self.before_cas: list = []

    def head(self) -> VersionedData | None:
        return self.inner.head()

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        while self.before_cas:
            self.before_cas.pop(0)()
        return self.inner.compare_and_set(expected, data)

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        return self.inner.scan(from_version, limit)

    def truncate(self, below: int) -> int:
        return self.inner.truncate(below)


def test_gc_fence_refuses_a_commit_that_stalled_before_its_compare_and_set(clock):
    """The write's lease is live when its commit is checked; the committer then stalls for
    two hours, during which gc deletes the parts. gc's fence makes the stalled
    compare-and-set lose, and the retry is refused: never a state that names deleted parts."""
    inner = MemoryConsensus()
    location = f"memory://leases-{uuid.uuid4().hex}"
    shard = ps.open_shard(location, consensus=GcBeforeCas(inner), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    expected = shard.upper
    _, written = pending_write(shard)
    other = ps.open_shard(location, consensus=inner, clock=clock.now)

    def stall_then_gc() -> None:
        tick(other, clock, 2 * HOUR_MS)
        report = other.gc(dry_run=False, now_ms=clock.ms)
        assert report.fence_version and set(written.keys()) <= set(report.parts)

    shard._consensus.before_cas.append(stall_then_gc)
    with pytest.raises(LeaseExpired):
        commit(shard, written, expected)
    fresh = ps.open_shard(location, consensus=inner, clock=clock.now)
    assert rows_of(fresh.snapshot()) == {(1, "a"): 1}
    assert fresh.verify().ok


class CommitAfterListing(BlobWrapper):
    """Runs ``hook`` right after the first listing of ``parts/`` (gc's plan)."""

    def __init__(self, inner, hook) -> None:
        super().__init__(inner)
        self.hook = hook

    def list(self, prefix: str = ""):
        out = list(self.inner.list(prefix))
        if prefix == "parts/" and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return out


def test_an_orphan_adopted_before_the_fence_is_kept(tmp_path, clock):
    """gc's clock runs ahead of the writer's (by less than it may judge past the newest
    commit): gc plans to delete a write's parts, but the write commits (its own clock says
    the lease is live) before gc's fence. gc reads the log again after the fence and keeps
    them."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    expected = shard.upper
    start = clock.ms
    _, written = pending_write(shard)  # its lease runs out at about start + 1 h
    tick(shard, clock, HOUR_MS - 30_000)  # the newest commit: 30 s before that
    writer_now, gc_now = clock.ms + 10_000, start + HOUR_MS + 10_000

    def writer_commits() -> None:
        clock.ms = writer_now
        commit(shard, written, expected)
        clock.ms = gc_now

    blob = CommitAfterListing(shard._blob, writer_commits)
    clock.ms = gc_now
    report = ps.Shard(location, blob=blob, clock=clock.now).gc(dry_run=False)
    assert report.fence_version and not report.orphaned_parts and not report.parts
    assert set(written.keys()) <= part_files(shard)
    fresh = ps.open_shard(location, clock=clock.now)
    assert rows_of(fresh.snapshot()) == {(1, "a"): 1, (7, "slow"): 1}
    assert fresh.verify().ok


def test_a_dry_run_commits_no_fence(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    _, written = pending_write(shard)
    tick(shard, clock, 2 * HOUR_MS)
    version = shard.inspect.state().version
    report = shard.gc(now_ms=clock.ms)
    assert set(report.orphaned_parts) == set(written.keys()) and report.fence_version == 0
    assert shard.inspect.state().version == version


def test_a_write_that_started_after_the_fence_commits(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    pending_write(shard)
    tick(shard, clock, 2 * HOUR_MS)
    assert shard.gc(dry_run=False, now_ms=clock.ms).fence_version
    shard.append(updates([(2, "b", shard.upper, 1)]))
    assert rows_of(shard.snapshot()) == {(1, "a"): 1, (2, "b"): 1}


def test_a_compaction_that_outlived_its_lease_is_refused_and_cleans_up(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    for t in range(4):
        shard.append(updates([(t, "x", t, 1)]))
    before = shard.inspect.state()
    real_merge = ps.core.maintenance.compact.run_merge

    def slow_merge(*args, **kwargs):
        out = real_merge(*args, **kwargs)
        clock.advance(HOUR_MS + 1)  # the merge took longer than the lease; nobody renewed
        return out

    ps.core.maintenance.compact.run_merge = slow_merge
    try:
        report = shard.compact()
    finally:
        ps.core.maintenance.compact.run_merge = real_merge
    assert report.merges and not any(m.committed for m in report.merges)
    assert shard.inspect.state().trace == before.trace
    assert part_files(shard) == before.part_keys()


def test_explicit_leases_are_bounded(tmp_path, clock):
    """Leases of writes that never commit are dropped once they run out; they do not pile
    up in the state."""
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    for _ in range(5):
        leases.renew(shard._machine, new_id(), 60)
    assert len(shard.inspect.state().leases) == 5
    clock.advance(2 * HOUR_MS)
    shard.append(updates([(2, "b", shard.upper, 1)]))
    assert shard.inspect.state().leases == {}


def test_lease_of_an_overwrite_covers_its_delta_writes(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    base = new_id()
    leases.renew(shard._machine, base, 3 * 3600)
    state = shard.inspect.state()
    clock.advance(2 * HOUR_MS)
    assert leases.live(state, f"{base}-d3", clock.ms)
    assert not leases.live(state, f"{base}x", clock.ms)  # a different write, same prefix


def test_write_lease_thread_renews_a_long_write(tmp_path):
    """A write whose lease is shorter than the write: the background thread renews it (real
    clock; the test waits for the renewal, however long that takes)."""
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0)
    shard.append(updates([(1, "a", 0, 1)]))
    with leases.WriteLease(shard._machine, new_id(), lease_seconds=0.3) as lease:
        while lease.renewals < 2:
            time.sleep(0.05)
    assert shard.inspect.state().leases[lease.write_id] == lease.expires_ms


def test_a_lease_that_runs_out_while_renewals_fail_is_lost_and_left_alone(tmp_path, clock):
    """Storage trouble is retried while the lease lives; once it ran out, renewing stops (a
    keeper retrying forever would burn a core for the rest of the process)."""
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    lease = leases.WriteLease(shard._machine, new_id(), lease_seconds=60)
    attempts = []

    def failing_renew() -> None:
        attempts.append(clock.ms)
        raise OSError("store down")

    lease.renew = failing_renew  # type: ignore[method-assign]
    lease._renew_quietly()
    assert not lease.lost and lease.due_ms() > clock.ms  # retried later, not at once
    clock.advance(61_000)
    lease._renew_quietly()
    assert lease.lost and len(attempts) == 2


def test_a_commit_planned_on_a_stale_state_sees_renewals_made_elsewhere(tmp_path, clock):
    """A handle commits on the state it last knew (no head read); when that state predates a
    renewal committed by another handle (the lease keeper's own machine), the lease check
    must not refuse on the stale state: the commit is judged again on the newest state."""
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    write_id, written = pending_write(shard)
    clock.advance(50 * 60 * 1000)
    leases.renew(
        ps.open_shard(shard.location, clock=clock.now)._machine, write_id, 3600
    )  # another handle
    clock.advance(20 * 60 * 1000)  # the implicit lease ran out; the renewed one lives
    commit(shard, written, shard._machine.known().upper)
    assert rows_of(ps.open_shard(shard.location, clock=clock.now).snapshot()) == {
        (1, "a"): 1,
        (7, "slow"): 1,
    }


def test_a_short_write_commits_nothing_extra(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0)
    shard.append(updates([(1, "a", 0, 1)]))
    version = shard.inspect.state().version
    shard.append(updates([(2, "b", shard.upper, 1)]))
    assert shard.inspect.state().version == version + 1
    assert [h["kind"] for h in shard.history()][-1] != "renew_lease"
    kinds = {e.commit.kind for _, e in shard._machine.entries(1)}
    assert "renew_lease" not in kinds and "sweep_leases" not in kinds


def test_renewal_is_a_commit_kind_gc_and_history_understand(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0, clock=clock.now)
    shard.append(updates([(1, "a", 0, 1)]))
    shard._machine.commit(RenewLease(new_id(), 5, id=new_id()))
    clock.advance(2 * HOUR_MS)
    shard.gc(dry_run=False, now_ms=clock.ms)
    assert len(shard.history()) >= 2
    assert ps.open_shard(shard.location, clock=clock.now).verify().ok
