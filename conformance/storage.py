"""The storage contract every Blob and Consensus must pass, as pytest test classes.

Subclass `BlobContract` / `ConsensusContract` and provide a ``location`` fixture (a fresh,
empty URL per test) to run the contract against a backend, the way fsspec's abstract tests
are reused by each filesystem. ``racers`` is how many racing workers contend for one key: they
are processes for backends shared between processes (local files, S3) and threads for
``memory://`` (which lives inside one process).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from persistshard.core.blob import Blob
from persistshard.core.consensus import BlobConsensus, Consensus

RACERS = 8


def _race_put_if_absent(url: str, key: str, payload: bytes, barrier: Any, out: Any) -> None:
    blob = Blob(url)
    barrier.wait()
    out.put(blob.put_if_absent(key, payload))


def _race_cas(url: str, expected: int | None, payload: bytes, barrier: Any, out: Any) -> None:
    consensus = BlobConsensus(Blob(url))
    barrier.wait()
    out.put((payload, consensus.compare_and_set(expected, payload)))


def race(url: str, target: Callable[..., None], payloads: list[Any], *extra: Any) -> list[Any]:
    """Run ``target`` in len(payloads) racing workers (processes unless memory://)."""
    if url.startswith("memory:"):
        barrier: Any = threading.Barrier(len(payloads))
        import queue

        out: Any = queue.Queue()
        workers: list[Any] = [
            threading.Thread(target=target, args=(url, *extra, p, barrier, out)) for p in payloads
        ]
    else:
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(len(payloads))
        out = ctx.Queue()
        workers = [
            ctx.Process(target=target, args=(url, *extra, p, barrier, out)) for p in payloads
        ]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in payloads]
    for w in workers:
        w.join(timeout=120)
    return results


class BlobContract:
    """Get, put, put-if-absent, delete and list, as `persistshard.core.blob` promises."""

    @pytest.fixture
    def blob(self, location: str) -> Blob:
        return Blob(location)

    def test_read_after_write(self, blob: Blob) -> None:
        blob.put("a/b", b"hello")
        assert blob.get("a/b") == b"hello"
        assert blob.size("a/b") == 5
        assert blob.get_range("a/b", 1, 3) == b"ell"

    def test_missing_key(self, blob: Blob) -> None:
        assert blob.get("nope") is None
        assert blob.size("nope") is None

    def test_put_replaces_whole(self, blob: Blob) -> None:
        blob.put("k", b"x" * 1000)
        blob.put("k", b"y" * 10)
        assert blob.get("k") == b"y" * 10

    def test_delete_is_idempotent(self, blob: Blob) -> None:
        blob.put("k", b"1")
        blob.delete("k")
        blob.delete("k")
        assert blob.get("k") is None

    def test_list_by_prefix(self, blob: Blob) -> None:
        for key in ["p/2", "p/1", "q/1", "p/sub/3"]:
            blob.put(key, key.encode())
        assert [m.key for m in blob.list("p/")] == ["p/1", "p/2", "p/sub/3"]
        assert [m.size for m in blob.list("q/")] == [3]
        assert [m.key for m in blob.list("zzz/")] == []

    def test_put_if_absent_once(self, blob: Blob) -> None:
        assert blob.put_if_absent("c/1", b"first")
        assert not blob.put_if_absent("c/1", b"second")
        assert blob.get("c/1") == b"first"

    def test_put_if_absent_race(self, location: str) -> None:
        """N workers race to create one key: exactly one wins, its bytes are whole."""
        payloads = [uuid.uuid4().bytes * 1000 for _ in range(RACERS)]
        results = race(location, _race_put_if_absent, payloads, "race/key")
        assert sorted(results) == [False] * (RACERS - 1) + [True]
        assert Blob(location).get("race/key") in payloads


class ConsensusContract:
    """Compare-and-set, head, scan and truncate, as `persistshard.core.consensus` promises."""

    @pytest.fixture
    def consensus(self, location: str) -> Consensus:
        return BlobConsensus(Blob(location))

    def test_empty(self, consensus: Consensus) -> None:
        assert consensus.head() is None
        assert consensus.scan(1) == []

    def test_cas_sequence(self, consensus: Consensus) -> None:
        assert consensus.compare_and_set(None, b"one")
        assert not consensus.compare_and_set(None, b"again")
        assert consensus.compare_and_set(1, b"two")
        assert not consensus.compare_and_set(1, b"stale")
        head = consensus.head()
        assert head is not None and (head.version, head.data) == (2, b"two")
        assert [(e.version, e.data) for e in consensus.scan(1)] == [(1, b"one"), (2, b"two")]

    def test_truncate_keeps_head(self, consensus: Consensus) -> None:
        for i in range(5):
            assert consensus.compare_and_set(i or None, str(i).encode())
        consensus.truncate(100)
        head = consensus.head()
        assert head is not None and head.version == 5
        assert [e.version for e in consensus.scan(1)] == [5]
        assert consensus.compare_and_set(5, b"six")

    def test_stale_cas_after_truncate(self, consensus: Consensus) -> None:
        """A writer that read version 1 before versions 1 and 2 were truncated cannot
        re-create version 2."""
        for i in range(4):
            assert consensus.compare_and_set(i or None, str(i).encode())
        consensus.truncate(4)
        assert not consensus.compare_and_set(1, b"ghost")
        assert not consensus.compare_and_set(2, b"ghost")
        assert [e.data for e in consensus.scan(1)] == [b"3"]

    def test_cas_race(self, location: str) -> None:
        """N workers race to append version 1: exactly one wins, and the log holds its bytes."""
        payloads = [f"writer-{i}".encode() for i in range(RACERS)]
        results = race(location, _race_cas, payloads, None)
        winners = [p for p, ok in results if ok]
        assert len(winners) == 1
        head = BlobConsensus(Blob(location)).head()
        assert head is not None and head.version == 1 and head.data == winners[0]
