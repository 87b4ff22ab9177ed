"""Metrics: what this process's shards did, and what one operation did.

Two things live here, both cheap enough to be always on:

- The per-process registry (`REGISTRY`, read with `snapshot`, exported as
  ``persistshard.metrics()``): counters (commits, retries, compactions, gc runs and deletions,
  store errors) and latency histograms per store operation (``blob.get``, ``blob.put``, ...,
  ``consensus.compare_and_set``, ...). Updating it takes one short lock held only around a few
  integer additions, never across I/O; reading it copies under the same lock, so a snapshot is
  consistent (every histogram's count equals the sum of its buckets).
- The *operation* scope (`operation`): a user-level operation (an append, a compaction, a gc,
  a Spark write's driver commit) opens one; every store request made while it is open, in its
  thread or in a thread started with a copy of its context (`run_in_context`), is counted
  into it. The state machine reads the scope when it builds a commit's entry and stores what
  the operation did in the commit (`commit_metrics`): ``shard.history()[i]["metrics"]``.

The counting happens in `CountingBlob` (a `BlobWrapper`) and `count_consensus`, which every
`persistshard.core.shard.Shard` puts around the stores it opens.

What ``store_requests`` counts: every blob request (get, get_range, size, put,
put_if_absent, delete, list), including those the blob consensus makes, plus every call to a
database consensus (each is one round trip); calls into the blob consensus are not counted
again (its blob requests are). An entry's count is taken when the entry is built, so it covers
the operation up to its final compare-and-set, which is counted as one request (the blob
consensus makes a few more: see `persistshard.core.storage.consensus`).

Old entries (written before metrics existed) have no ``metrics``; `commit_metrics` readers
must accept that (`history` shows ``None``).
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from persistshard.core.storage.blob import (
    Blob,
    BlobMeta,
    BlobWrapper,
    as_storage_error,
    is_certain_refusal,
)
from persistshard.errors import StorageError, import_extra

if TYPE_CHECKING:
    from persistshard.core.statemachine.state import ShardState
    from persistshard.core.storage.consensus import Consensus

log = logging.getLogger("persistshard.core.storage.metrics")

#: Upper bounds (seconds) of the latency histogram buckets; the last bucket is +Inf.
BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: The counters every snapshot reports (others appear once incremented).
COUNTERS = (
    "commits",
    "commit_retries",
    "commit_refusals",
    "compactions",
    "gc_runs",
    "gc_deleted_parts",
    "gc_deleted_entries",
    "store_errors",
)


@dataclass
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    count: int = 0
    sum: float = 0.0


class Registry:
    """Process-wide counters and latency histograms (thread-safe; see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._histograms: dict[str, _Histogram] = {}

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def observe(self, name: str, seconds: float) -> None:
        """Record one latency of ``name`` (a store operation such as ``blob.get``)."""
        i = 0
        while i < len(BUCKETS) and seconds > BUCKETS[i]:
            i += 1
        with self._lock:
            h = self._histograms.get(name)
            if h is None:
                h = self._histograms[name] = _Histogram()
            h.buckets[i] += 1
            h.count += 1
            h.sum += seconds

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy: ``{"counters": {name: n}, "latency": {op: {"count", "sum_seconds",
        "buckets": [[upper_bound_seconds, cumulative_count], ...]}}}``; the last bound is
        ``inf`` and its count equals ``count``."""
        with self._lock:
            counters = dict(self._counters)
            hists = {k: (list(h.buckets), h.count, h.sum) for k, h in self._histograms.items()}
        latency = {}
        for name, (buckets, count, total) in sorted(hists.items()):
            running, cumulative = 0, []
            for bound, n in zip((*BUCKETS, float("inf")), buckets, strict=True):
                running += n
                cumulative.append([bound, running])
            latency[name] = {"count": count, "sum_seconds": total, "buckets": cumulative}
        return {"counters": dict(sorted(counters.items())), "latency": latency}

    def reset(self) -> None:
        """Forget everything (tests and benchmarks start from zero)."""
        with self._lock:
            self._counters = dict.fromkeys(COUNTERS, 0)
            self._histograms = {}


REGISTRY = Registry()


def snapshot() -> dict[str, Any]:
    """This process's counters and latency histograms (`Registry.snapshot`)."""
    return REGISTRY.snapshot()


# --- operation scopes -------------------------------------------------------------------


class Operation:
    """What one user-level operation did so far: store requests and extra
    figures reported by others (a Spark write's tasks). Counts are thread-safe."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.requests = 0
        self.extra: dict[str, int] = {}
        #: Compare-and-sets this operation's commits tried (`attempting`): none means nothing
        #: it did can have been applied, so a storage error that ends it is determinate.
        self.attempts = 0

    def request(self) -> None:
        with self._lock:
            self.requests += 1

    def add(self, name: str, n: int) -> None:
        """Add ``n`` to the extra figure ``name`` (``rows_in``, ``task_store_requests``...)."""
        with self._lock:
            self.extra[name] = self.extra.get(name, 0) + n

    def attempting(self) -> None:
        """A commit of this operation is about to try its compare-and-set (it may land)."""
        with self._lock:
            self.attempts += 1

    def landed(self) -> None:
        """A commit of this operation landed: what follows is counted toward its next commit
        (an append that then compacts records each commit's own work)."""
        with self._lock:
            self.started = time.monotonic()
            self.requests = 0
            self.extra = {}

    def began_ago(self, seconds: float) -> None:
        """Count this operation as begun ``seconds`` ago, when its work started before its
        scope did (a Spark write's tasks run before the driver's commit opens the scope)."""
        with self._lock:
            self.started = min(self.started, time.monotonic() - max(0.0, seconds))

    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)


_CURRENT: contextvars.ContextVar[Operation | None] = contextvars.ContextVar(
    "persistshard_operation", default=None
)


def current() -> Operation | None:
    """The operation open in this context, if any."""
    return _CURRENT.get()


@contextmanager
def operation(name: str) -> Iterator[Operation]:
    """Open an operation scope named ``name`` (a nested call joins the open one: an append
    that compacts afterwards is one operation until it returns)."""
    open_ = _CURRENT.get()
    if open_ is not None:
        yield open_
        return
    op = Operation(name)
    token = _CURRENT.set(op)
    try:
        yield op
    finally:
        _CURRENT.reset(token)


F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def operation_method(name: str) -> Callable[[F], F]:
    """Decorate a method so that each call runs in its own operation scope (`operation`).
    A raw storage error escaping the operation is `StorageError` (`as_storage_error`), named
    after the operation and the object's ``location``, when it is determinate: a certain
    refusal (`persistshard.core.storage.blob.is_certain_refusal`: permission denied,
    read-only, disk full), or any storage error met before a commit of the operation tried
    its compare-and-set (a timeout reading the state a write plans on: nothing was applied).
    After such an attempt another storage error stays as it is (it may follow a landed
    commit). Every path that writes before it commits (parts, rollups, merged parts) refuses
    the same way; our own errors (a `StorageError` included) pass unchanged."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with operation(name) as op:
                try:
                    return fn(*args, **kwargs)
                except OSError as e:
                    if isinstance(e, StorageError) or (op.attempts and not is_certain_refusal(e)):
                        raise
                    location = getattr(args[0], "location", None) if args else None
                    translated = as_storage_error(e, location, name)
                    if translated is None:
                        raise
                    raise translated from e

        return inner  # type: ignore[return-value]

    return wrap


def run_in_context(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` for worker threads: each call runs in its own copy of the caller's context (a
    context can be entered by one thread at a time), so the requests it makes count into the
    caller's operation."""
    parent = contextvars.copy_context()

    def call(*args: Any, **kwargs: Any) -> T:
        return parent.copy().run(fn, *args, **kwargs)

    return call


def _done(name: str, started: float, failed: BaseException | None, counts: bool) -> None:
    REGISTRY.observe(name, time.perf_counter() - started)
    if counts:
        op = _CURRENT.get()
        if op is not None:
            op.request()
    # A StorageError is an OSError our code raised, its store error counted where it began.
    if isinstance(failed, OSError) and not isinstance(failed, StorageError):
        REGISTRY.inc("store_errors")
        log.warning("store error: %s failed: %s: %s", name, type(failed).__name__, failed)


class CountingBlob(BlobWrapper):
    """A blob that times and counts every request into `REGISTRY` and the open `Operation`;
    otherwise exactly its inner blob (same contract, capabilities and errors; other
    attributes, such as an fsspec blob's ``fs`` and ``root``, are the inner's)."""

    observes_only = True

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _timed(self, name: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        failed: BaseException | None = None
        try:
            return call()
        except BaseException as e:
            failed = e
            raise
        finally:
            _done(name, started, failed, True)

    def sibling(self, url: str) -> Blob:
        """The inner's sibling, counted too (a fork's reads of its source's parts)."""
        return counting_blob(self.inner.sibling(url))

    def get(self, key: str) -> bytes | None:
        return self._timed("blob.get", lambda: self.inner.get(key))  # type: ignore[no-any-return]

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self._timed(  # type: ignore[no-any-return]
            "blob.get", lambda: self.inner.get_range(key, offset, length)
        )

    def size(self, key: str) -> int | None:
        return self._timed("blob.size", lambda: self.inner.size(key))  # type: ignore[no-any-return]

    def put(self, key: str, data: bytes) -> None:
        self._timed("blob.put", lambda: self.inner.put(key, data))

    def put_hint(self, key: str, data: bytes) -> None:
        # Counted as a put, and still a hint below (unsynced): `BlobWrapper.put_hint` would
        # route it through `put`, which syncs.
        self._timed("blob.put", lambda: self.inner.put_hint(key, data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._timed(  # type: ignore[no-any-return]
            "blob.put", lambda: self.inner.put_if_absent(key, data)
        )

    def delete(self, key: str) -> None:
        self._timed("blob.delete", lambda: self.inner.delete(key))

    def list(self, prefix: str = "") -> builtins.list[BlobMeta]:
        return self._timed("blob.list", lambda: self.inner.list(prefix))  # type: ignore[no-any-return]

    def list_temporary(self) -> builtins.list[BlobMeta]:
        return self._timed("blob.list", self.inner.list_temporary)  # type: ignore[no-any-return]


def counting_blob(blob: Blob) -> Blob:
    """``blob`` with counting (`CountingBlob`), unless it counts already."""
    return blob if isinstance(blob, CountingBlob) else CountingBlob(blob)


_CONSENSUS_CALLS = ("head", "scan", "compare_and_set", "truncate")


def count_consensus(consensus: Consensus, *, requests: bool) -> Consensus:
    """Time ``consensus``'s calls (head, scan, compare_and_set, truncate) into `REGISTRY`, and
    when ``requests`` (a database consensus: each call is a round trip) count them into the
    open `Operation` too. Instruments the object itself (its type stays what it is, since
    callers ask ``isinstance(c, BlobConsensus)``); instrumenting twice is a no-op."""
    if getattr(consensus, "_persistshard_counted", False):
        return consensus
    for name in _CONSENSUS_CALLS:
        method = getattr(consensus, name)

        def timed(*args: Any, _m: Any = method, _n: str = f"consensus.{name}", **kw: Any) -> Any:
            started = time.perf_counter()
            failed: BaseException | None = None
            try:
                return _m(*args, **kw)
            except BaseException as e:
                failed = e
                raise
            finally:
                _done(_n, started, failed, requests)

        setattr(consensus, name, timed)
    consensus._persistshard_counted = True  # type: ignore[attr-defined]
    return consensus


# --- what a commit did --------------------------------------------------------------------


def commit_metrics(before: ShardState, after: ShardState, retries: int) -> dict[str, Any]:
    """What the commit from ``before`` to ``after`` did, for its entry: rows, bytes and parts
    added and removed (parts referenced by ``after`` and not ``before``, and back; batches
    both share are skipped by identity, so this costs the changed batches, not the state),
    the open operation's duration so far, its retries and store requests (see the module
    docstring; the compare-and-set about to be made counts as one), and any extra figures
    reported into it."""
    old_batches = {id(b) for b in (*before.trace, *before.unsealed)}
    new_batches = {id(b) for b in (*after.trace, *after.unsealed)}
    added = {
        p.key: p
        for b in (*after.trace, *after.unsealed)
        if id(b) not in old_batches
        for p in b.parts
    }
    removed = {
        p.key: p
        for b in (*before.trace, *before.unsealed)
        if id(b) not in new_batches
        for p in b.parts
    }
    for key in set(added) & set(removed):  # a batch rewritten around the same parts
        del added[key], removed[key]
    op = _CURRENT.get()
    out: dict[str, Any] = {
        "rows_added": sum(p.num_rows for p in added.values()),
        "rows_removed": sum(p.num_rows for p in removed.values()),
        "bytes_added": sum(p.size for p in added.values()),
        "bytes_removed": sum(p.size for p in removed.values()),
        "parts_added": len(added),
        "parts_removed": len(removed),
        "retries": retries,
        "duration_ms": op.elapsed_ms() if op is not None else 0,
        "store_requests": (op.requests if op is not None else 0) + 1,
    }
    if op is not None:
        out["operation"] = op.name
        out.update(sorted(op.extra.items()))
        out["store_requests"] += op.extra.get("task_store_requests", 0)
    return out


# --- Prometheus ---------------------------------------------------------------------------


def prometheus_collector() -> Any:
    """A ``prometheus_client`` collector of `REGISTRY` (needs the ``prometheus`` extra):
    every counter as ``persistshard_<name>_total`` and the store latencies as one histogram,
    ``persistshard_store_request_seconds``, labelled by ``operation`` (``blob.get``, ...,
    ``consensus.compare_and_set``). Each scrape reads one consistent `snapshot`. Register it
    with ``prometheus_client.REGISTRY.register(persistshard.metrics_collector())``."""
    import_extra("prometheus_client", "prometheus", "persistshard.metrics_collector()")
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import Collector

    class PersistShardCollector(Collector):
        def collect(self) -> Iterator[Any]:
            snap = snapshot()
            for name, value in snap["counters"].items():
                yield CounterMetricFamily(
                    f"persistshard_{name}", f"persistshard {name.replace('_', ' ')}", value=value
                )
            family = HistogramMetricFamily(
                "persistshard_store_request_seconds",
                "latency of persistshard's blob and consensus requests",
                labels=["operation"],
            )
            for op, h in snap["latency"].items():
                buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in h["buckets"]]
                family.add_metric([op], buckets, h["sum_seconds"])
            yield family

    return PersistShardCollector()
