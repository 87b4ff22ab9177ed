"""Deterministic interleavings of the blob consensus: writers, a truncating gc and a reader.

A scheduler runs each actor in its own thread but lets exactly one run at a time: every store
operation (get, put, put-if-absent, delete, list) is a scheduling point where the actor parks
until the scheduler picks it. Schedules are enumerated depth first (stateless model checking:
each schedule is replayed from a fresh store), every one of them up to a bound on preemptions
(switching away from an actor that could go on), so the tests are deterministic and cover
every interleaving with few context switches, where such races live.

Each run's history (the calls with the steps they started and ended at, and their results) is
checked for linearizability against a sequential log: some order of the calls, consistent
with their real-time order, in which each call's result is what the sequential log gives
(`Indeterminate` may or may not have applied). On top: the log a fresh reader sees at the end
is that order's log, and a reader never sees the head go backwards.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from persistshard.core.storage.blob import Blob, BlobMeta, BlobWrapper, FsspecBlob
from persistshard.core.storage.consensus import BlobConsensus
from persistshard.errors import Indeterminate

WAIT_SECONDS = 30.0  # a safety net against a scheduler bug, never reached by a passing run


class Scheduler:
    """Runs actors one store operation at a time, in the order a schedule prescribes."""

    def __init__(self, prefix: list[str]) -> None:
        self.prefix = prefix
        self.trace: list[tuple[str, tuple[str, ...]]] = []  # (chosen, enabled) per step
        self._cv = threading.Condition()
        self._parked: set[str] = set()
        self._running: str | None = None
        self._done: set[str] = set()
        self._local = threading.local()
        self.errors: list[BaseException] = []

    @property
    def step(self) -> int:
        return len(self.trace)

    def point(self) -> None:
        """Called by an actor before each store operation: park until picked."""
        name = getattr(self._local, "name", None)
        if name is None:
            return  # set-up code outside any actor
        with self._cv:
            self._parked.add(name)
            self._running = None
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: self._running == name, WAIT_SECONDS):
                raise TimeoutError(f"actor {name} was never scheduled")

    def run(self, actors: dict[str, Callable[[], None]]) -> None:
        def body(name: str, fn: Callable[[], None]) -> None:
            self._local.name = name
            try:
                self.point()
                fn()
            except BaseException as e:  # reported by the test
                self.errors.append(e)
            finally:
                with self._cv:
                    self._done.add(name)
                    self._parked.discard(name)
                    self._running = None
                    self._cv.notify_all()

        threads = [
            threading.Thread(target=body, args=(n, f), daemon=True) for n, f in actors.items()
        ]
        for t in threads:
            t.start()
        names = list(actors)
        while True:
            with self._cv:
                ok = self._cv.wait_for(
                    lambda: (
                        self._running is None
                        and all(n in self._parked or n in self._done for n in names)
                    ),
                    WAIT_SECONDS,
                )
                assert ok, "scheduler stuck"
                enabled = tuple(n for n in names if n in self._parked)
                if not enabled:
                    break
                i = self.step
                if i < len(self.prefix):
                    chosen = self.prefix[i]
                    assert chosen in enabled, "replay diverged: the code is not deterministic"
                else:  # default: no preemption, keep running the last actor if it can
                    last = self.trace[-1][0] if self.trace else None
                    chosen = last if last in enabled else enabled[0]
                self.trace.append((chosen, enabled))
                self._parked.discard(chosen)
                self._running = chosen
                self._cv.notify_all()
        for t in threads:
            t.join(WAIT_SECONDS)


class SteppedBlob(BlobWrapper):
    """A blob whose every operation is a scheduling point."""

    def __init__(self, inner: Blob, sched: Scheduler) -> None:
        super().__init__(inner)
        self.sched = sched

    def get(self, key: str) -> bytes | None:
        self.sched.point()
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.sched.point()
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.sched.point()
        return self.inner.put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self.sched.point()
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[BlobMeta]:
        self.sched.point()
        return self.inner.list(prefix)


def preemptions(trace: list[tuple[str, tuple[str, ...]]]) -> int:
    """Switches away from an actor that could have gone on."""
    count = 0
    for (prev, _), (chosen, enabled) in itertools.pairwise(trace):
        if chosen != prev and prev in enabled:
            count += 1
    return count


def schedules(run_one: Callable[[list[str]], list[tuple[str, tuple[str, ...]]]], bound: int):
    """Depth-first enumeration of every schedule with at most ``bound`` preemptions; yields
    each run's trace (``run_one`` runs a schedule prefix and returns the full trace)."""
    stack: list[list[str]] = [[]]
    while stack:
        prefix = stack.pop()
        trace = run_one(prefix)
        yield trace
        for i in range(len(prefix), len(trace)):
            chosen, enabled = trace[i]
            for alt in enabled:
                if alt == chosen:
                    continue
                candidate = [c for c, _ in trace[:i]] + [alt]
                steps = [*trace[:i], (alt, enabled)]
                if preemptions(steps) <= bound:
                    stack.append(candidate)


# --- history and the sequential model -----------------------------------------------------


@dataclass
class Call:
    actor: str
    kind: str  # "cas", "head", "truncate"
    args: tuple[Any, ...]
    start: int
    end: int = -1
    result: Any = None  # cas: True / False / "indeterminate"; head: (version, data) | None


@dataclass
class History:
    sched: Scheduler
    calls: list[Call] = field(default_factory=list)

    def record(self, actor: str, kind: str, args: tuple[Any, ...], fn: Callable[[], Any]) -> Any:
        call = Call(actor, kind, args, self.sched.step)
        self.calls.append(call)
        try:
            result = fn()
        except Indeterminate:
            result = "indeterminate"
        if kind == "head":
            result = None if result is None else (result.version, result.data)
        call.result = result
        call.end = self.sched.step
        return result


def _apply(log: tuple[bytes, ...], call: Call, applied: bool) -> tuple[bytes, ...] | None:
    """The log after ``call`` in a sequential execution, or None if its result is impossible."""
    head = len(log)
    if call.kind == "cas":
        expected, data = call.args
        fits = head == (expected or 0)
        if call.result is True:
            return (*log, data) if fits else None
        if call.result is False:
            return None if fits else log
        return (*log, data) if (applied and fits) else (log if not applied else None)
    if call.kind == "head":
        want = (head, log[-1]) if head else None
        return log if call.result == want else None
    return log  # truncate: the head and every entry's bytes stay


def linearization(calls: list[Call], initial: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
    """The final log of some order of ``calls`` that respects real time and every result, or
    None if there is none (a linearizability violation)."""
    n = len(calls)

    def search(done: frozenset[int], log: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        if len(done) == n:
            return log
        pending = [i for i in range(n) if i not in done]
        for i in pending:
            # i may go next only if no pending call ended before it started.
            if any(calls[j].end <= calls[i].start for j in pending if j != i):
                continue
            options = [True, False] if calls[i].result == "indeterminate" else [True]
            for applied in options:
                nxt = _apply(log, calls[i], applied)
                if nxt is not None:
                    found = search(done | {i}, nxt)
                    if found is not None:
                        return found
        return None

    return search(frozenset(), initial)


# --- the scenarios ------------------------------------------------------------------------


def fresh_blob() -> FsspecBlob:
    return FsspecBlob(f"memory://interleave-{uuid.uuid4().hex}")


def seed_log(blob: Blob, entries: list[bytes]) -> None:
    c = BlobConsensus(blob)
    for i, data in enumerate(entries):
        assert c.compare_and_set(i or None, data)


def run_scenario(
    prefix: list[str],
    initial: list[bytes],
    actors: Callable[[BlobConsensus, Callable[[], BlobConsensus], History], dict[str, Any]],
    stale_reader_at: int | None = None,
) -> tuple[Scheduler, History, FsspecBlob]:
    inner = fresh_blob()
    seed_log(inner, initial)
    sched = Scheduler(prefix)
    blob = SteppedBlob(inner, sched)
    history = History(sched)

    def make() -> BlobConsensus:
        return BlobConsensus(blob)

    stale = make()
    if stale_reader_at is not None:
        # A writer that read the head long ago, before the others ran (outside any actor, so
        # these reads are not scheduling points).
        head = stale.head()
        assert head is not None and head.version == stale_reader_at
    sched.run(actors(stale, make, history))
    return sched, history, inner


def check_run(history: History, inner: FsspecBlob, initial: list[bytes], sched: Scheduler):
    assert not sched.errors, sched.errors
    final = linearization(history.calls, tuple(initial))
    assert final is not None, f"not linearizable: {history.calls}"
    # A fresh reader sees the head of that log, and every retained entry is the original one.
    fresh = BlobConsensus(inner)
    head = fresh.head()
    assert head is not None and (head.version, head.data) == (len(final), final[-1]), (
        head,
        final,
        history.calls,
    )
    for e in fresh.scan(1):
        assert final[e.version - 1] == e.data, (e, final, history.calls)
    # No read sees the head go backwards: a read that starts after another ended sees at
    # least the same version.
    reads = [c for c in history.calls if c.kind == "head" and c.result]
    for a, b in itertools.product(reads, reads):
        if a.end <= b.start:
            assert a.result[0] <= b.result[0], history.calls


def stale_writer_scenario(
    stale: BlobConsensus, make, history: History, commits: int = 2
) -> dict[str, Any]:
    """A writer that read version 1 long ago appends; another writer appends ``commits``
    times; gc truncates below the head it will reach; a reader reads the head twice."""

    def w1() -> None:
        history.record("w1", "cas", (1, b"w1"), lambda: stale.compare_and_set(1, b"w1"))

    def w2() -> None:
        c = make()
        for v in range(1, commits + 1):
            data = f"w2-{v}".encode()
            history.record("w2", "cas", (v, data), lambda v=v, d=data: c.compare_and_set(v, d))

    def gc() -> None:
        c = make()
        below = commits + 1
        history.record("gc", "truncate", (below,), lambda: c.truncate(below))

    def reader() -> None:
        c = make()
        history.record("r", "head", (), c.head)
        history.record("r", "head", (), c.head)

    return {"w1": w1, "w2": w2, "gc": gc, "r": reader}


def test_the_known_fork_schedule_is_refused():
    """The schedule of the reported fork: the stale writer stalls while the other commits
    twice and gc truncates, then appends version 2 again; it must not be told it won."""
    inner = fresh_blob()
    seed_log(inner, [b"v1"])
    sched = Scheduler([])
    blob = SteppedBlob(inner, sched)
    history = History(sched)
    stale = BlobConsensus(blob)
    assert stale.head() is not None  # the stale writer read version 1 before anything ran
    # Three commits: the stale writer's version 2 and the next one are both truncated.
    actors = stale_writer_scenario(stale, lambda: BlobConsensus(blob), history, commits=3)
    # Actors one after another (no preemption at all): w2, gc, w1, r.
    for name in ["w2", "gc", "w1", "r"]:
        sched.run({name: actors[name]})
    check_run(history, inner, [b"v1"], sched)
    w1 = next(c for c in history.calls if c.actor == "w1")
    assert w1.result in (False, "indeterminate")


def explore(scenario, initial: list[bytes], bound: int, stale_at: int | None) -> Iterator[int]:
    def run_one(prefix: list[str]):
        sched, history, inner = run_scenario(prefix, initial, scenario, stale_at)
        try:
            check_run(history, inner, initial, sched)
        finally:
            inner.fs.rm(inner.root, recursive=True)
        return sched.trace

    for trace in schedules(run_one, bound):
        yield len(trace)


def test_every_interleaving_of_stale_writer_gc_and_reader_is_linearizable():
    """Every schedule with up to one preemption of the four actors above (711 schedules; two
    preemptions give 12,681, about a minute: run with ``PERSISTSHARD_INTERLEAVING_BOUND=2``)."""
    bound = int(os.environ.get("PERSISTSHARD_INTERLEAVING_BOUND", "1"))
    runs = sum(1 for _ in explore(stale_writer_scenario, [b"v1"], bound, 1))
    assert runs > 100  # the enumeration really branched


def racing_writers_scenario(stale: BlobConsensus, make, history: History) -> dict[str, Any]:
    """Two fresh writers race for version 3 over a log at 2 while gc truncates below 2."""

    def writer(name: str) -> Callable[[], None]:
        def body() -> None:
            c = make()
            head = history.record(name, "head", (), c.head)
            expected = head[0] if head else None
            data = name.encode()
            history.record(name, "cas", (expected, data), lambda: c.compare_and_set(expected, data))

        return body

    def gc() -> None:
        c = make()
        history.record("gc", "truncate", (2,), lambda: c.truncate(2))

    return {"a": writer("a"), "b": writer("b"), "gc": gc}


def test_every_interleaving_of_racing_writers_and_gc_is_linearizable():
    """Every schedule with up to two preemptions (1,806 schedules)."""
    runs = sum(1 for _ in explore(racing_writers_scenario, [b"v1", b"v2"], 2, None))
    assert runs > 100
