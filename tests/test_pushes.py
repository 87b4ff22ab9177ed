"""The push ledger (`persistshard.datasource.pushes`), without Spark."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from persistshard.core.filters import bind
from persistshard.datasource.pushes import claimed_by, record_push

SCHEMA = pa.schema([pa.field("k", pa.int64())])


def pred(value: int) -> Any:
    return bind("lt", "k", value, SCHEMA)


def test_a_push_applies_only_in_the_execution_that_claims_it(tmp_path: Any) -> None:
    root = str(tmp_path)
    push = record_push("rel", (pred(3), None), root=root)
    assert push.generation == 0 and push.entries == ((pred(3), None),)
    assert not claimed_by(push, None, root=root)  # outside any SQL execution: unfiltered
    assert claimed_by(push, "7", root=root)
    assert claimed_by(push, "7", root=root)  # another task of the same execution
    assert not claimed_by(push, "8", root=root)  # a later query that pushed nothing


def test_pushes_since_the_newest_claim_are_ored(tmp_path: Any) -> None:
    root = str(tmp_path)
    record_push("rel", (pred(3), None), root=root)
    second = record_push("rel", (pred(5), None), root=root)  # same query, not executed yet
    assert second.generation == 1
    assert second.entries == ((pred(3), None), (pred(5), None))
    assert claimed_by(second, "1", root=root)
    # the first push was never claimed (its scan ran the second push's read) and is dead now
    third = record_push("rel", (pred(9), None), root=root)
    assert third.entries == ((pred(9), None),)
    fourth = record_push("rel", (pred(1), None), root=root)  # third not executed yet
    assert fourth.entries == ((pred(9), None), (pred(1), None))
    assert record_push("other", (None, None), root=root).generation == 0


def test_a_push_not_recorded_on_this_host_never_applies(tmp_path: Any) -> None:
    push = record_push("rel", (pred(3), None), root=str(tmp_path / "planner"))
    assert not claimed_by(push, "1", root=str(tmp_path / "executor"))


def test_dead_records_are_pruned_and_numbers_never_reused(tmp_path: Any) -> None:
    import os

    root = str(tmp_path)
    first = record_push("rel", (pred(3), None), root=root)
    assert claimed_by(first, "1", root=root)
    second = record_push("rel", (pred(5), None), root=root)
    assert claimed_by(second, "2", root=root)
    third = record_push("rel", (pred(7), None), root=root)  # prunes the first record
    files = sorted(os.listdir(tmp_path / "rel"))
    assert "0.push" not in files and "1.push" in files and "2.push" in files
    assert "0.claim" in files  # claims stay
    # a re-run of the first plan finds no record: it reads unfiltered (Spark filters)
    assert not claimed_by(first, "1", root=root)
    # the newest claim's record stays, so its plan still filters when re-run
    assert claimed_by(second, "2", root=root)
    assert third.generation == 2
    # records gone (a cleared temp directory), claims left: numbers continue past the claims
    for name in os.listdir(tmp_path / "rel"):
        if name.endswith(".push"):
            os.unlink(tmp_path / "rel" / name)
    fourth = record_push("rel", (pred(1), None), root=root)
    assert fourth.generation == 2 and fourth.entries == ((pred(1), None),)
    assert claimed_by(fourth, "4", root=root)


def test_ledgers_of_relations_long_unused_are_swept(tmp_path: Any) -> None:
    import os
    import time

    from persistshard.datasource import pushes

    root = str(tmp_path)
    record_push("old", (pred(3), None), root=root)
    long_ago = time.time() - pushes.STALE_SECONDS - 60
    os.utime(tmp_path / "old", (long_ago, long_ago))
    record_push("recent", (pred(3), None), root=root)
    record_push("new", (pred(3), None), root=root)
    assert sorted(os.listdir(tmp_path)) == ["new", "recent"]
