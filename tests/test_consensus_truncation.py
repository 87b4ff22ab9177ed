"""A commit whose outcome is unknown must never be applied twice, even when the log was
truncated past it before the writer could look (issue 25, item 2).

After an ambiguous compare-and-set, the state machine looks for its commit's id in the log;
if gc truncated the log past the attempt in between, the id cannot be found either way, and
trying again could apply the same commit twice: the commit is reported `Indeterminate`.
"""

from __future__ import annotations

import pytest
from conformance_helpers import rows_of, updates

import persistshard as ps
from persistshard.core.storage.consensus import BlobConsensus
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
            other.gc(dry_run=False, now_ms=2**45)
            raise Indeterminate("timed out")
        return landed


def test_an_ambiguous_commit_truncated_past_is_indeterminate_not_applied_twice(tmp_path):
    location = str(tmp_path / "s")
    ps.open_shard(location).append(updates([(1, "a", 0, 1)]))
    shard = ps.open_shard(location)
    shard.machine.consensus = LandsThenTruncated(shard.blob, lambda: ps.open_shard(location))
    with pytest.raises(Indeterminate):
        shard.append(updates([(2, "mine", 1, 1)]))
    rows = rows_of(ps.open_shard(location).snapshot())
    assert rows[(2, "mine")] == 1  # it landed once, and only once


def test_a_state_read_gets_each_log_entry_once(tmp_path):
    """A fresh handle finds the head by probing up from the hint, then folds the entries
    after the newest rollup: the same entries (hint and rollups both every 16 versions). The
    scan takes them from the probe: one get per entry, not two (on S3, 15 requests fewer)."""
    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False)
    for t in range(ROLLUP_EVERY + 5):
        writer.append(updates([(t, "x", writer.upper, 1)]))
    reader = ps.open_shard(location)
    blob = reader.machine.consensus.blob
    gets: list[str] = []
    real = blob.get

    def counting(key: str):
        gets.append(key)
        return real(key)

    blob.get = counting
    assert reader.state().version == writer.state().version
    entries = [k for k in gets if k.startswith("consensus/v")]
    assert entries and len(entries) == len(set(entries)), entries
    assert rows_of(reader.snapshot()) == rows_of(writer.snapshot())
