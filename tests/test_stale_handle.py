"""A handle whose state is older than a truncation gets a determinate answer for a commit
that certainly did not land (issue 36, item 7's first sentence).

The handle last wrote version v; others committed past a rollup and gc truncated the log
below it, deleting v and v + 1. The handle's compare-and-set on v re-creates v + 1 (a stale
re-creation): before the fix it skipped the floor read before its put (it builds on its own
last entry), found the floor above v + 1 only afterwards, no successor to tell, and answered
`Indeterminate`, though nothing landed.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from conformance_helpers import rows_of

from persistshard.core.shard import Shard
from persistshard.core.statemachine.machine import SHARED_STATES
from persistshard.core.storage import consensus as consensus_module
from persistshard.core.storage.layout import ROLLUP_EVERY
from persistshard.errors import UpperMismatch


def row(i: int, t: int) -> pa.Table:
    return pa.table({"id": [i], "_time": [t], "_diff": [1]})


def stale_handle(tmp_path) -> tuple[Shard, str, int]:
    location = str(tmp_path / "s")
    mine = Shard(location, maintenance=False)
    mine.compare_and_append(row(0, 0), 0, 1)
    mine_version = mine._machine.known().version
    other = Shard(location, maintenance=False)
    for t in range(1, ROLLUP_EVERY + 3):
        other.compare_and_append(row(t, t), t, t + 1)
    other.gc(dry_run=False, retention_seconds=0)
    assert other._consensus.oldest_stored() > mine_version + 1  # truncated past v + 1
    SHARED_STATES.clear()  # the handle's own view only
    time.sleep(getattr(consensus_module, "TRUST_OWN_ENTRY_SECONDS", 0.5) + 0.05)
    return mine, location, mine_version


def test_stale_compare_and_set_is_a_determinate_refusal(tmp_path):
    mine, _, version = stale_handle(tmp_path)
    assert mine._consensus.compare_and_set(version, b"stale") is False
    assert mine._consensus.blob.get(f"consensus/v{version + 1:020d}.json") is None


def test_stale_compare_and_append_is_upper_mismatch(tmp_path):
    mine, location, _ = stale_handle(tmp_path)
    with pytest.raises(UpperMismatch):
        mine.compare_and_append(row(99, 1), 1, 2)
    clean = Shard(location)
    assert (99,) not in rows_of(clean.snapshot())
    assert clean.verify().ok
