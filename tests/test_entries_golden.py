"""Consensus entries keep their bytes, and commit kinds are typed (issue 37, item 1).

``tests/golden/entries-v1.json`` holds one log entry per commit kind (and per shape of an
append and a compaction), written by the code before commits were typed (dictionaries of
arguments), with the history kind and summary that code gave each. Every entry must decode,
encode back to exactly the same bytes, and be described the same way in `Shard.history`; the
same commits built with the typed kinds must encode to the same bytes; every kind round-trips
through its stored form; and a kind is registered by declaring its class alone. Kinds added
since (``fork``, ``add_fork``, ``release_fork``, ``drop``, and the transactions' kinds
``register_txns``, ``unregister_txns``, ``stage_txn``, ``release_txn``, ``apply_txn``, and
``append_set_retention``) have entries written by their first typed code, held to the same
bytes from then on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

import crc32c
import pyarrow as pa
import pytest

from persistshard.core.statemachine.commits import KINDS, Commit, apply
from persistshard.core.statemachine.commits.add_fork import AddFork
from persistshard.core.statemachine.commits.advance_consumer import AdvanceConsumer
from persistshard.core.statemachine.commits.advance_since import AdvanceSince
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.append_set_retention import AppendSetRetention
from persistshard.core.statemachine.commits.apply_txn import ApplyTxn
from persistshard.core.statemachine.commits.compact import Compact
from persistshard.core.statemachine.commits.create_consumer import CreateConsumer
from persistshard.core.statemachine.commits.downgrade_since import DowngradeSince
from persistshard.core.statemachine.commits.drop import Drop
from persistshard.core.statemachine.commits.drop_consumer import DropConsumer
from persistshard.core.statemachine.commits.expire_reader import ExpireReader
from persistshard.core.statemachine.commits.fork import Fork
from persistshard.core.statemachine.commits.heartbeat import Heartbeat
from persistshard.core.statemachine.commits.register_reader import RegisterReader
from persistshard.core.statemachine.commits.register_txns import RegisterTxns
from persistshard.core.statemachine.commits.release_fork import ReleaseFork
from persistshard.core.statemachine.commits.release_txn import ReleaseTxn
from persistshard.core.statemachine.commits.renew_lease import RenewLease
from persistshard.core.statemachine.commits.set_retention import SetRetention
from persistshard.core.statemachine.commits.stage_txn import StageTxn
from persistshard.core.statemachine.commits.sweep_leases import SweepLeases
from persistshard.core.statemachine.commits.unregister_txns import UnregisterTxns
from persistshard.core.statemachine.encoding import Entry, fold
from persistshard.core.statemachine.retention import Retention
from persistshard.core.statemachine.state import (
    Batch,
    BatchIdentity,
    PartRef,
    ShardState,
    SourceRef,
    WriterBatch,
)
from persistshard.errors import CorruptData

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "entries-v1.json")
CASES = json.load(open(GOLDEN))
AT = 1_700_000_000_000
METRICS = {"rows_added": 3, "bytes_added": 120, "parts_added": 1, "retries": 0, "seconds": 0.25}


def typed_commits() -> dict[str, tuple[Commit, tuple[int, str | None]]]:
    """The golden entries' commits, built with the typed kinds as callers build them."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    p1 = PartRef("parts/0190a1b2c3d4aaaa/p0.part", 1234, 3, 0, 0)
    p2 = PartRef("parts/0190a1b2c3d4aaaa/p1.part", 99, 1, 7, 9)
    pr = PartRef("parts/0190a1b2c3d4bbbb/p0.part", 55, 2, 4, 4, rewrite_time=4)
    inline = PartRef(
        "parts/0190a1b2c3d4cccc/i0.part",
        5,
        1,
        2,
        2,
        inline=b"hello",
        inline_crc=crc32c.crc32c(b"hello"),
    )
    t = Batch("c1-t", 0, 1, (p1,))
    u = Batch("c1-u", 7, 10, (p2,))
    out = Batch("o1-r", 0, 8, (p1, p2), level=2, since=3)
    stream = WriterBatch("w1", 3, BatchIdentity("v1:2:abc", "q-1"))
    src = SourceRef("0190a1b2c3d4ffff", "s3://bucket/orders")
    none: tuple[int, str | None] = (0, None)
    return {
        "append": (Append(0, 1, t, None, schema, id="c1"), none),
        "append-unsealed-stream": (
            Append(1, 5, Batch("c2-t", 1, 5, (pr,)), u, schema, stream, id="c2"),
            none,
        ),
        "append-writer-no-identity": (
            Append(5, 6, Batch("c3-t", 5, 6, ()), writer=("w2", 0), id="c3"),
            none,
        ),
        "append-rebase-inline": (
            Append(2, 3, Batch("c4-t", 2, 3, (inline,)), rebase=True, id="c4"),
            none,
        ),
        "append-overwrite-label": (
            Append(6, 8, Batch("c5-t", 6, 8, (p1,)), label="overwrite", id="c5"),
            (16, "rollups/v00000000000000000016.json"),
        ),
        "seal": (Append(8, 12, Batch("c6-t", 8, 12, ()), id="c6"), none),
        "compact": (Compact(("c1-t", "c2-t"), out, id="c7"), none),
        "compact-unsealed": (
            Compact(("o1-r",), out, ("c1-u",), (Batch("o2-u", 9, 10, (pr,)),), id="c8"),
            none,
        ),
        "compact-unsealed-empty": (Compact(("o1-r",), out, ("c1-u",), (), id="c8b"), none),
        "advance_since": (AdvanceSince(4, id="c9"), none),
        "register_reader": (RegisterReader("r1", 900_000, id="c10"), none),
        "downgrade_since": (DowngradeSince("r1", 6, id="c11"), none),
        "heartbeat": (Heartbeat("r1", id="c12"), none),
        "expire_reader": (ExpireReader("r1", id="c13"), none),
        "renew_lease": (RenewLease("0190a1b2c3d4aaaa", 3_600_000, id="c14"), none),
        "sweep_leases": (SweepLeases(1_699_999_999_000, id="c15"), none),
        "set_retention": (SetRetention(Retention(ms=60_000, versions=10), id="c16"), none),
        "set_retention-window": (SetRetention(Retention(ms=5000), id="c17"), none),
        "set_retention-clear": (SetRetention(None, id="c18"), none),
        "old-append-no-metrics-no-time": (Append(0, 1, t, None, schema, id="c19"), none),
        "old-advance-since-no-time": (AdvanceSince(2, id="c20"), none),
        "create_consumer": (CreateConsumer("nightly-etl", id="c21"), none),
        "advance_consumer": (AdvanceConsumer("nightly-etl", 3, 9, id="c22"), none),
        "drop_consumer": (DropConsumer("nightly-etl", id="c23"), none),
        "fork": (
            Fork(
                3,
                schema,
                (Batch("c1-t", 0, 4, (PartRef(p1.key, 1234, 3, 0, 0, source=src), inline)),),
                (Batch("c1-u", 2, 3, (replace(p2, min_time=2, max_time=2, source=src),)),),
                (("0190a1b2c3d4ffff", "s3://bucket/orders"),),
                id="c21",
            ),
            none,
        ),
        "add_fork": (
            AddFork("0190a1b2c3d4eeee", "s3://bucket/orders_dev", (p1.key, p2.key), id="c22"),
            none,
        ),
        "release_fork": (ReleaseFork("0190a1b2c3d4eeee", id="c23"), none),
        "drop": (Drop(id="c24"), none),
        "register_txns": (RegisterTxns("0190a1b2c3d4dddd", "s3://bucket/_txns", 7, id="c25"), none),
        "stage_txn": (StageTxn("0190a1b2c3d4aaaa", (p1.key, p2.key), id="c26"), none),
        "apply_txn": (
            ApplyTxn(5, 8, Batch("t1-t", 5, 8, (p1,)), schema=schema, txn="t1", id="c27"),
            none,
        ),
        "release_txn": (ReleaseTxn("t1", id="c28"), none),
        "unregister_txns": (UnregisterTxns("0190a1b2c3d4dddd", 9, id="c29"), none),
        "append_set_retention": (
            AppendSetRetention(
                3, 4, Batch("c30-t", 3, 4, (p1,)), retention=Retention(ms=604_800_000), id="c30"
            ),
            none,
        ),
        "append_set_retention-clear-overwrite-stream": (
            AppendSetRetention(
                4,
                5,
                Batch("c31-t", 4, 5, (p1,)),
                schema=schema,
                writer=stream,
                label="overwrite",
                retention=None,
                id="c31",
            ),
            none,
        ),
    }


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_stored_entry_decodes_and_encodes_to_the_same_bytes(case):
    data = case["entry"].encode()
    entry = Entry.decode(data)
    assert entry.encode() == data
    assert Entry.decode(entry.encode()) == entry


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_stored_entry_is_described_as_before(case):
    commit = Entry.decode(case["entry"].encode()).commit
    assert commit.history_kind() == case["history_kind"]
    assert commit.summary() == case["summary"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_typed_commit_stores_the_bytes_the_dictionaries_stored(case):
    commit, rollup = typed_commits()[case["name"]]
    old = case["name"].startswith("old-")
    stamped = commit if old else replace(commit, at_ms=AT, metrics=METRICS)
    entry = Entry(stamped, rollup[0], rollup[1], at_ms=None if old else AT)
    assert entry.encode() == case["entry"].encode()
    assert Entry.decode(entry.encode()).commit == stamped


def test_every_commit_kind_has_a_golden_entry():
    kinds = {json.loads(c["entry"].split("\n", 1)[1])["commit"]["kind"] for c in CASES}
    assert (
        kinds
        == set(KINDS)
        == {
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
            "create_consumer",
            "advance_consumer",
            "drop_consumer",
            "fork",
            "add_fork",
            "release_fork",
            "drop",
            "register_txns",
            "unregister_txns",
            "stage_txn",
            "release_txn",
            "apply_txn",
            "append_set_retention",
        }
    )
    assert {type(c).kind for c, _ in typed_commits().values()} == set(KINDS)


@pytest.mark.parametrize("name", sorted(typed_commits()))
def test_each_commit_round_trips_through_its_stored_form(name):
    commit, _ = typed_commits()[name]
    for c in (commit, replace(commit, at_ms=AT), replace(commit, at_ms=AT, metrics=METRICS)):
        assert Commit.from_json(c.to_json()) == c
        assert Commit.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_an_unknown_kind_or_foreign_arguments_are_corrupt_data():
    good = Entry(AdvanceSince(1, id="x", at_ms=AT), 0, None, at_ms=AT).encode()
    body = json.loads(good.split(b"\n", 1)[1])
    from persistshard.core.statemachine.encoding import ENTRY_MAGIC, seal

    for commit in (
        {**body["commit"], "kind": "teleport"},
        {**body["commit"], "args": {"reader_id": "r"}},
        {**body["commit"], "args": ["since", 1]},
    ):
        forged = seal(ENTRY_MAGIC, json.dumps({**body, "commit": commit}).encode())
        with pytest.raises(CorruptData, match="unreadable consensus entry"):
            Entry.decode(forged)


@pytest.fixture
def scratch_kind():
    """A kind declared by a test: registered by its class alone, and removed afterwards."""
    before = dict(KINDS)

    @dataclass(frozen=True)
    class Relabel(Commit):
        """A test kind: renames the newest trace batch."""

        kind = "test_relabel"

        name: str

        def args_json(self) -> dict[str, Any]:
            return {"name": self.name}

        @classmethod
        def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
            return {"name": str(args["name"])}

        def apply(self, state: ShardState, location: str | None) -> ShardState:
            *rest, last = state.trace
            return replace(state, trace=(*rest, replace(last, id=self.name)))

        def summary(self) -> str:
            return f"newest batch renamed {self.name}"

    yield Relabel
    KINDS.clear()
    KINDS.update(before)


def test_a_new_kind_needs_only_its_class(scratch_kind):
    """Declaring the class registers the kind: it is stored, decoded, applied and replayed
    (`fold`) and summarised with no other module touched."""
    assert KINDS["test_relabel"] is scratch_kind
    state = apply(ShardState(), Append(0, 1, Batch("b", 0, 1, ()), id="c0", at_ms=AT))
    commit = scratch_kind("renamed", id="c1", at_ms=AT)
    entry = Entry.decode(Entry(commit, 0, None, at_ms=AT).encode())
    assert entry.commit == commit
    after = fold(state, [entry.commit])
    assert after.trace[-1].id == "renamed" and after.version == 2
    assert entry.commit.history_kind() == "test_relabel"
    assert entry.commit.summary() == "newest batch renamed renamed"


def test_a_kind_name_is_declared_once(scratch_kind):
    with pytest.raises(TypeError, match="declared twice"):

        @dataclass(frozen=True)
        class Another(Commit):
            kind = "test_relabel"


def test_every_module_of_the_commits_package_is_imported_and_registers_its_kind():
    """The package imports each of its modules, so a kind's module is all a new kind needs."""
    import pkgutil

    from persistshard.core.statemachine import commits

    modules = {f"{commits.__name__}.{m.name}" for m in pkgutil.iter_modules(commits.__path__)} - {
        f"{commits.__name__}.base"
    }
    assert {cls.__module__ for cls in KINDS.values()} == modules
    assert all(cls.__module__.rsplit(".", 1)[1] == kind for kind, cls in KINDS.items())
