"""The storage contract every Blob and Consensus must pass, as pytest test classes.

Subclass `BlobContract` / `ConsensusContract` and provide a ``store`` fixture returning a
`Store` (a fresh, empty place per test) to run the contract against a backend, the way
fsspec's abstract tests are reused by each filesystem. The suites only use the interfaces
(`persistshard.core.storage.blob.Blob`, `persistshard.core.storage.consensus.Consensus`), so any
implementation runs them: the fsspec blob on local files, memory or S3, `BlobConsensus` over
any of them, `MemoryConsensus`, and the database consensus (`ConsensusAt` a URL).

``RACERS`` workers contend for one key or one version: processes when the store is shared
between processes (local files, S3; the store is pickled to them), threads otherwise
(``memory://``, `MemoryConsensus`, which live inside one process).

`probe_atomic_create` is the check `persistshard conformance` runs first: a backend that
accepts a second exclusive create of the same key (a server that ignores ``If-None-Match``)
is reported as `StorageUnsupported`, never as a passing store that would lose commits.
"""

from __future__ import annotations

import builtins
import logging
import multiprocessing as mp
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from persistshard.core.storage.blob import Blob, BlobMeta, BlobWrapper, open_blob
from persistshard.core.storage.consensus import BlobConsensus, Consensus, VersionedData
from persistshard.core.storage.consensus import probe_atomic_create as library_probe
from persistshard.core.storage.sqlconsensus import open_consensus, redact_url
from persistshard.errors import Indeterminate, StorageError

log = logging.getLogger("persistshard.conformance.storage")

RACERS = 8


@dataclass(frozen=True)
class Store:
    """How to build the storage under test: a blob, and a consensus over it.

    ``url`` and ``storage_options`` build the blob with `open_blob`; ``consensus`` (default
    `BlobConsensus`) builds the consensus from the blob. ``shared`` says whether other
    processes see the same data (then the store must be picklable: module-level callables).

    ``wrap`` (None: none) wraps every blob the suites open, the consensus's included: pass a
    `persistshard.conformance.faults.Faults` to run the shipped suites under a fault over
    your own store (``Store(url, options, wrap=Faults({"lose_response": 0.25}))``), or any
    module-level ``Callable[[Blob], Blob]``. A wrapped store's consensus is a `ReadBack` of
    it: a compare-and-set the wrapper made ambiguous (`Indeterminate`, an ``OSError``) is
    resolved by reading the log, as a caller must, so every answer the contract asserts is
    the consensus's own or read back, never assumed. Which `BlobContract` tests hold as they
    are under which fault: `BLOB_CONTRACT_UNDER`, `blob_contract_under`.
    """

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    consensus_factory: Callable[[Blob], Consensus] | None = None
    shared: bool = True
    wrap: Callable[[Blob], Blob] | None = None

    def blob(self) -> Blob:
        blob = open_blob(self.url, **self.storage_options)
        return self.wrap(blob) if self.wrap is not None else blob

    def consensus(self) -> Consensus:
        factory = self.consensus_factory or BlobConsensus
        consensus = factory(self.blob())
        return ReadBack(consensus) if self.wrap is not None else consensus

    def __repr__(self) -> str:  # storage options may hold credentials: names only
        wrap = "" if self.wrap is None else f", wrap={self.wrap!r}"
        return (
            f"Store({self.url!r}, options={sorted(self.storage_options)}, "
            f"shared={self.shared}{wrap})"
        )


#: How often `ReadBack` tries a call again before the fault wins (a test failure).
READ_BACK_ATTEMPTS = 60


class ReadBack(Consensus):
    """A consensus whose ambiguous answers are resolved by reading back, the way a careful
    caller (the state machine) resolves them: the harness that runs `ConsensusContract` over
    a store whose calls fail or lose their responses.

    - ``head``, ``scan``, ``truncate`` and ``oldest_stored`` are idempotent: an ``OSError``
      or `Indeterminate` is retried (up to `READ_BACK_ATTEMPTS` calls).
    - A ``compare_and_set`` that raises is resolved by the log: the entry at ``expected + 1``
      holding these bytes is True (it landed), other bytes False (another writer's); no entry
      there while the head is still ``expected``: nothing landed, so the call is made again.
      No entry and a head past ``expected``: the entry was truncated, which in the contract's
      tests happens only *before* the call (they truncate between calls), so the call was
      stale: False. Contract payloads are distinct within a test, so bytes identify a call.
    - An answer the inner consensus gives is passed on unchanged: a False for a commit that
      landed (what trusting a retried create's "exists" gives) fails the contract.
    """

    def __init__(self, inner: Consensus) -> None:
        self.inner = inner
        self.resolved = 0  # ambiguous compare-and-sets resolved by reading back

    @property
    def shared(self) -> bool:
        return self.inner.shared

    @property
    def certain_lost_races(self) -> bool:
        return self.inner.certain_lost_races

    @property
    def cache_key(self) -> str | None:
        return self.inner.cache_key

    def entry_name(self, version: int) -> str:
        return self.inner.entry_name(version)

    def _retry(self, call: Callable[[], Any]) -> Any:
        for attempt in range(READ_BACK_ATTEMPTS):
            try:
                return call()
            except (OSError, Indeterminate) as e:
                if attempt == READ_BACK_ATTEMPTS - 1:
                    raise
                log.debug("read-back harness: %s failed (%s); again", call, e)
        raise AssertionError("unreachable")  # pragma: no cover

    def head(self) -> VersionedData | None:
        result: VersionedData | None = self._retry(self.inner.head)
        return result

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        result: list[VersionedData] = self._retry(lambda: self.inner.scan(from_version, limit))
        return result

    def truncate(self, below: int) -> int:
        result: int = self._retry(lambda: self.inner.truncate(below))
        return result

    def oldest_stored(self) -> int | None:
        result: int | None = self._retry(self.inner.oldest_stored)
        return result

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        base = expected or 0
        for _ in range(READ_BACK_ATTEMPTS):
            try:
                return self.inner.compare_and_set(expected, data)
            except StorageError:
                raise  # refused for certain: nothing to read back
            except (OSError, Indeterminate) as e:
                log.debug("read-back harness: compare-and-set on %d ambiguous (%s)", base, e)
            self.resolved += 1
            at = self.scan(base + 1, 1)
            if at and at[0].version == base + 1:
                return at[0].data == data
            head = self.head()
            if (head.version if head is not None else 0) != base:
                return False  # truncated before the call (module docstring): stale
        raise AssertionError(
            f"compare-and-set on version {base} stayed ambiguous {READ_BACK_ATTEMPTS} times"
        )


#: Which `BlobContract` tests hold *as they are* under each fault, by the fault's name
#: (`persistshard.conformance.faults.FaultyBlob` modes; the `persistshard.conformance.proxy`
#: actions in front of S3, where the client library retries): the set of tests that do
#: NOT apply, or None when the blob contract does not apply at all. A blob's answers are
#: exact only where the fault leaves the caller an answer: a request delivered twice
#: answers the first delivery; a lost response that the client retries gives the retry's
#: answer, which is the right one for put, get and delete (idempotent) but is "exists" for
#: a put-if-absent that created the key (so `test_put_if_absent_once` and the race cannot
#: hold; the library reads that answer back, which the consensus contract checks under the
#: same fault). A failure or a lost response that reaches the caller (``fail_before``,
#: ``fail_after``, ``lose_response``) is an error from any call: only the consensus
#: contract, whose callers resolve errors by reading back, applies under those.
BLOB_CONTRACT_UNDER: dict[str, frozenset[str] | None] = {
    "duplicate": frozenset(),
    "twice": frozenset(),
    "retry_after_lost": frozenset({"test_put_if_absent_once", "test_put_if_absent_race"}),
    "drop": frozenset({"test_put_if_absent_once", "test_put_if_absent_race"}),
    "error500": frozenset({"test_put_if_absent_once", "test_put_if_absent_race"}),
    "lose_response": None,
    "fail_before": None,
    "fail_after": None,
}


@dataclass(frozen=True)
class ConsensusAt:
    """A consensus factory for a database consensus at ``url`` (`open_consensus`), keyed by
    the blob's URL: picklable, so racing processes each open their own connection. ``repr``
    shows the URL without its secrets."""

    url: str

    def __call__(self, blob: Blob) -> Consensus:
        return open_consensus(self.url, blob.url)

    def __repr__(self) -> str:
        return f"ConsensusAt({redact_url(self.url)!r})"


def one_consensus(consensus: Consensus) -> Callable[[Blob], Consensus]:
    """A consensus factory that always returns ``consensus`` (an in-process implementation)."""
    return lambda _blob: consensus


class _Under(BlobWrapper):
    """``inner`` seen from ``prefix`` down: every key is ``prefix + key`` in ``inner`` (what
    `probe_atomic_create` uses to probe inside a scratch sub-location)."""

    def __init__(self, inner: Blob, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = prefix
        self.url = f"{inner.url.rstrip('/')}/{prefix.strip('/')}"

    def get(self, key: str) -> bytes | None:
        return self.inner.get(self.prefix + key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self.inner.get_range(self.prefix + key, offset, length)

    def size(self, key: str) -> int | None:
        return self.inner.size(self.prefix + key)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(self.prefix + key, data)

    def put_hint(self, key: str, data: bytes) -> None:
        self.inner.put_hint(self.prefix + key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(self.prefix + key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(self.prefix + key)

    def list(self, prefix: str = "") -> list[BlobMeta]:
        n = len(self.prefix)
        return [
            BlobMeta(m.key[n:], m.size, m.modified_ms)
            for m in self.inner.list(self.prefix + prefix)
        ]

    def list_temporary(self) -> builtins.list[BlobMeta]:
        n = len(self.prefix)
        return [
            BlobMeta(m.key[n:], m.size, m.modified_ms)
            for m in self.inner.list_temporary()
            if m.key.startswith(self.prefix)
        ]


def probe_atomic_create(blob: Blob, prefix: str = "") -> None:
    """Raise `StorageUnsupported` unless a second exclusive create of a key is refused and
    leaves the first bytes in place (what the default consensus relies on).

    The library's own probe (`persistshard.core.storage.consensus.probe_atomic_create`), under
    ``prefix`` (a sub-location such as the conformance run's scratch place; "" for the
    blob's root): its key is a temporary name inside ``consensus/``, so a probe cut short by
    a crash leaves neither a foreign file nor anything a shard reads, and lost responses or
    the client's own retries of its creates are read back, not reported as a lying store."""
    library_probe(_Under(blob, prefix) if prefix else blob)


def _race_put_if_absent(store: Store, key: str, payload: bytes, barrier: Any, out: Any) -> None:
    blob = store.blob()
    barrier.wait()
    out.put(blob.put_if_absent(key, payload))


def _race_cas(store: Store, expected: int | None, payload: bytes, barrier: Any, out: Any) -> None:
    consensus = store.consensus()
    barrier.wait()
    out.put((payload, consensus.compare_and_set(expected, payload)))


def process_context() -> Any:
    """Fresh processes for racing workers: forked from a server that imported this module
    once (each spawned worker would import pyarrow and persistshard again, about 3 s of CPU
    apiece); spawn where there is no forkserver. Never a fork of this process: it may hold
    threads and open connections."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def race(store: Store, target: Callable[..., None], payloads: list[Any], *extra: Any) -> list[Any]:
    """Run ``target`` in len(payloads) racing workers (processes when the store is shared)."""
    workers: list[Any]
    if not store.shared:
        barrier: Any = threading.Barrier(len(payloads))
        out: Any = queue.Queue()
        workers = [
            threading.Thread(target=target, args=(store, *extra, p, barrier, out)) for p in payloads
        ]
    else:
        ctx = process_context()
        barrier = ctx.Barrier(len(payloads))
        out = ctx.Queue()
        workers = [
            ctx.Process(target=target, args=(store, *extra, p, barrier, out)) for p in payloads
        ]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in payloads]
    for w in workers:
        w.join(timeout=120)
    return results


class BlobContract:
    """Get, put, put-if-absent, delete and list, as `persistshard.core.storage.blob` promises."""

    @pytest.fixture
    def blob(self, store: Store) -> Blob:
        return store.blob()

    def test_read_after_write(self, blob: Blob) -> None:
        blob.put("a/b", b"hello")
        assert blob.get("a/b") == b"hello"
        assert blob.size("a/b") == 5
        assert blob.get_range("a/b", 1, 3) == b"ell"

    def test_read_after_write_other_handle(self, store: Store) -> None:
        """A write through one handle is visible through another (a separate client)."""
        store.blob().put("w/k", b"seen")
        other = store.blob()
        assert other.get("w/k") == b"seen"
        assert [m.key for m in other.list("w/")] == ["w/k"]

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

    def test_list_after_delete(self, blob: Blob) -> None:
        blob.put("d/1", b"1")
        blob.put("d/2", b"2")
        assert [m.key for m in blob.list("d/")] == ["d/1", "d/2"]
        blob.delete("d/1")
        assert [m.key for m in blob.list("d/")] == ["d/2"]

    def test_put_if_absent_once(self, blob: Blob) -> None:
        assert blob.put_if_absent("c/1", b"first")
        assert not blob.put_if_absent("c/1", b"second")
        assert blob.get("c/1") == b"first"

    def test_probe_atomic_create(self, blob: Blob) -> None:
        probe_atomic_create(blob)
        assert blob.list("") == []

    def test_put_if_absent_race(self, store: Store) -> None:
        """N workers race to create one key: exactly one wins, its bytes are whole."""
        payloads = [uuid.uuid4().bytes * 1000 for _ in range(RACERS)]
        results = race(store, _race_put_if_absent, payloads, "race/key")
        assert sorted(results) == [False] * (RACERS - 1) + [True]
        assert store.blob().get("race/key") in payloads


def blob_contract_under(fault: str) -> type[BlobContract]:
    """A `BlobContract` with exactly the tests that hold under ``fault``
    (`BLOB_CONTRACT_UNDER`; the others are left out, not skipped). Subclass it with a
    ``store`` fixture whose ``wrap`` injects that fault. ``KeyError`` for a fault the table
    does not know, ``ValueError`` for one under which the blob contract does not apply."""
    excluded = BLOB_CONTRACT_UNDER[fault]
    if excluded is None:
        raise ValueError(
            f"under {fault!r} every blob call may raise: only the consensus contract applies"
        )
    return type(
        f"BlobContractUnder_{fault}", (BlobContract,), dict.fromkeys(sorted(excluded), None)
    )


class ConsensusContract:
    """Compare-and-set, head, scan and truncate, as `persistshard.core.storage.consensus`
    promises."""

    @pytest.fixture
    def consensus(self, store: Store) -> Consensus:
        return store.consensus()

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

    def test_read_after_cas_other_handle(self, store: Store) -> None:
        """A version set through one handle is the head seen through a new one."""
        assert store.consensus().compare_and_set(None, b"one")
        head = store.consensus().head()
        assert head is not None and (head.version, head.data) == (1, b"one")

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

    def test_stale_writer_after_deep_truncation(self, store: Store) -> None:
        """A writer that read version 1, stalled while another handle appended up to version
        4 and truncated everything below it, must not be told its append of version 2
        succeeded, and no reader may see that append (the re-created version 2 is below
        the retained log)."""
        stale, other = store.consensus(), store.consensus()
        assert other.compare_and_set(None, b"1")
        head = stale.head()
        assert head is not None and head.version == 1
        for version in (1, 2, 3):
            assert other.compare_and_set(version, str(version + 1).encode())
        other.truncate(4)
        try:
            ok = stale.compare_and_set(1, b"ghost")
        except Indeterminate:
            ok = False
        assert not ok
        for reader in (store.consensus(), other, stale):
            head = reader.head()
            assert head is not None and (head.version, head.data) == (4, b"4")
            assert b"ghost" not in [e.data for e in reader.scan(1)]
        assert store.consensus().compare_and_set(4, b"5")

    def test_cas_race(self, store: Store) -> None:
        """N workers race to append version 1: exactly one wins, and the log holds its bytes."""
        payloads = [f"writer-{i}".encode() for i in range(RACERS)]
        results = race(store, _race_cas, payloads, None)
        winners = [p for p, ok in results if ok]
        assert len(winners) == 1
        head = store.consensus().head()
        assert head is not None and head.version == 1 and head.data == winners[0]
