"""Consensus entries keep their bytes (issue 37, item 1: typed commits change no stored byte).

``tests/golden/entries-v1.json`` holds one log entry per commit kind (and per shape of an
append and a compaction), written by the code before commits were typed, with the history
kind and summary that code gave each. Every entry must decode, encode back to exactly the
same bytes, and be described the same way in `Shard.history`.
"""

from __future__ import annotations

import json
import os

import pytest

from persistshard.core.shard import history_kind
from persistshard.core.statemachine.state import Entry

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "entries-v1.json")
CASES = json.load(open(GOLDEN))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_stored_entry_decodes_and_encodes_to_the_same_bytes(case):
    data = case["entry"].encode()
    entry = Entry.decode(data)
    assert entry.encode() == data
    assert Entry.decode(entry.encode()) == entry


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_stored_entry_is_described_as_before(case):
    from persistshard.core import shard

    commit = Entry.decode(case["entry"].encode()).commit
    assert history_kind(commit) == case["history_kind"]
    assert shard._summarize(commit) == case["summary"]


def test_every_commit_kind_has_a_golden_entry():
    kinds = {json.loads(c["entry"].split("\n", 1)[1])["commit"]["kind"] for c in CASES}
    assert kinds == {
        "append",
        "compact",
        "advance_since",
        "register_reader",
        "downgrade_since",
        "heartbeat",
        "expire_reader",
        "renew_lease",
        "sweep_leases",
        "set_retention",
    }
