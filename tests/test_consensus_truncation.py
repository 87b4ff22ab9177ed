"""A commit whose outcome is unknown must never be applied twice, even when the log was
truncated past it before the writer could look (issue 25, item 2).

After an ambiguous compare-and-set, the state machine looks for its commit's id in the log;
if gc truncated the log past the attempt in between, the id cannot be found either way, and
trying again could apply the same commit twice: the commit is reported `Indeterminate`.
"""

from __future__ import annotations

import shutil

import pytest
from conformance_helpers import rows_of, updates

import persistshard as ps
from persistshard.core.statemachine import machine as machine_mod
from persistshard.core.statemachine.machine import SHARED_STATES, SharedStates
from persistshard.core.storage.consensus import BlobConsensus, VersionedData
from persistshard.core.storage.layout import ROLLUP_EVERY
from persistshard.errors import Indeterminate


class LandsThenTruncated(BlobConsensus):
    """The first compare-and-set lands; then other writers commit past a rollup and gc
    truncates the log behind it, and only then does the call fail (a timeout)."""

    def __init__(self, blob, others) -> None:
        super().__init__(blob)
        self.others = others
        self.armed = True

    def compare_and_set(self, expected, data):
        landed = super().compare_and_set(expected, data)
        if self.armed and landed:
            self.armed = False
            other = self.others()
            for t in range(ROLLUP_EVERY + 1):
                other.append(updates([(100 + t, "other", other.upper, 1)]))
            other.gc(dry_run=False, retention_seconds=0)
            raise Indeterminate("timed out")
        return landed


def test_an_ambiguous_commit_truncated_past_is_indeterminate_not_applied_twice(tmp_path):
    location = str(tmp_path / "s")
    ps.open_shard(location).append(updates([(1, "a", 0, 1)]))
    shard = ps.open_shard(location)
    shard._machine.consensus = LandsThenTruncated(shard._blob, lambda: ps.open_shard(location))
    with pytest.raises(Indeterminate):
        shard.append(updates([(2, "mine", 1, 1)]))
    rows = rows_of(ps.open_shard(location).snapshot())
    assert rows[(2, "mine")] == 1  # it landed once, and only once


def test_a_state_read_gets_each_log_entry_once(tmp_path):
    """A fresh handle finds the head by probing up from the hint, then folds the entries
    after the newest rollup, the probe's among them (the hint is at or above the rollup). The
    scan takes those from the probe: one get per entry, not two."""
    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False)
    for t in range(ROLLUP_EVERY + 5):
        writer.append(updates([(t, "x", writer.upper, 1)]))
    SHARED_STATES.clear()  # as in a fresh process: else the writer's state is shared
    reader = ps.open_shard(location)
    blob = reader._machine.consensus.blob
    gets: list[str] = []
    real = blob.get

    def counting(key: str):
        gets.append(key)
        return real(key)

    blob.get = counting
    assert reader.inspect.state().version == writer.inspect.state().version
    entries = [k for k in gets if k.startswith("consensus/v")]
    assert entries and len(entries) == len(set(entries)), entries
    assert rows_of(reader.snapshot()) == rows_of(writer.snapshot())


def _no_state_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail("the state was rebuilt from the log")

    monkeypatch.setattr(machine_mod.StateMachine, "load_rollup", refuse)
    monkeypatch.setattr(machine_mod.encoding, "fold", refuse)


def test_handles_share_the_state_at_an_unchanged_head(tmp_path, monkeypatch):
    """A fresh handle whose head read finds the entry this process last committed or read
    takes that state: no rollup loaded and no entry folded, however long the log. A commit
    by one handle is shared with the others the same way."""
    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False)
    for t in range(ROLLUP_EVERY + 5):
        writer.append(updates([(t, "x", writer.upper, 1)]))
    expected = rows_of(writer.snapshot())
    with monkeypatch.context() as m:
        _no_state_rebuilt(m)
        reader = ps.open_shard(location)
        assert reader.inspect.state() is writer.inspect.state()
        assert rows_of(reader.snapshot()) == expected
        writer.append(updates([(99, "y", writer.upper, 1)]))
        assert rows_of(ps.open_shard(location).snapshot())[(99, "y")] == 1
    SHARED_STATES.clear()
    with monkeypatch.context() as m:
        _no_state_rebuilt(m)
        with pytest.raises(pytest.fail.Exception, match="rebuilt"):
            ps.open_shard(location).inspect.state()
    assert ps.open_shard(location).inspect.state() == writer.inspect.state()


def test_a_log_written_anew_at_the_same_location_is_read_anew(tmp_path):
    """Another log at the same location and the same version (the shard deleted and written
    again behind this process's back) has other bytes at its head: the shared state is not
    taken for it."""
    here, there = str(tmp_path / "here"), str(tmp_path / "there")
    for location, name in ((here, "first"), (there, "second")):
        shard = ps.open_shard(location, maintenance=False)
        for t in range(3):
            shard.append(updates([(t, name, t, 1)]))
    assert {r for r, _ in rows_of(ps.open_shard(here).snapshot())} == {0, 1, 2}
    assert (
        ps.open_shard(here).inspect.state().version == ps.open_shard(there).inspect.state().version
    )
    shutil.rmtree(here)
    shutil.copytree(there, here)
    assert rows_of(ps.open_shard(here).snapshot()) == rows_of(ps.open_shard(there).snapshot())
    assert {n for _, n in rows_of(ps.open_shard(here).snapshot())} == {"second"}


def test_shared_states_keep_the_newest_of_the_most_recent_logs():
    """Only an exact (version, digest) match is shared; an older state never replaces a
    newer one; the least recently used log is dropped beyond the capacity; a consensus
    without a cache key shares nothing."""

    class Named(BlobConsensus):
        def __init__(self, key: str | None) -> None:
            self.key = key

        @property
        def cache_key(self) -> str | None:
            return self.key

    shared = SharedStates(capacity=2)
    a, b, c, none = Named("a"), Named("b"), Named("c"), Named(None)
    s1 = ps.open_shard("memory://shared-states-1").inspect.state()
    v5, v6 = VersionedData(5, b"five"), VersionedData(6, b"six")
    shared.put(a, v5, s1, (0, None))
    assert shared.get(a, v5) == (s1, (0, None))
    assert shared.get(a, VersionedData(5, b"other")) is None
    assert shared.get(a, v6) is None
    shared.put(a, v6, s1, (0, None))
    shared.put(a, v5, s1, (0, None))  # older: ignored
    assert shared.get(a, v5) is None and shared.get(a, v6) is not None
    shared.put(b, v5, s1, (0, None))
    shared.get(a, v6)  # a is now the most recently used
    shared.put(c, v5, s1, (0, None))
    assert shared.get(b, v5) is None and shared.get(a, v6) and shared.get(c, v5)
    shared.put(none, v5, s1, (0, None))
    assert shared.get(none, v5) is None
