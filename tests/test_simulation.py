"""Seeded simulation: several writers, a compactor, gc and readers on one memory shard, with
storage failures, stalls past truncation and crashed writers, checked against the reference
model (`persistshard.conformance.model.ReferenceShard`), after persist's Maelstrom checks.

One thread, one seeded random source: each step picks an actor and an action. Every actor
has its own shard handle over a `FaultyBlob` that fails calls before or after doing them and
sometimes *stalls*: in the middle of the call, other actors take steps (appends by the other
writers, compaction, gc and log truncation, reads), so a writer's compare-and-set meets a log
that moved on and lost its old versions. A writer whose append fails either finds out by
reading whether it landed (then retries or not) or *crashes*: it walks away and the outcome
stays unknown until the end.

Listeners (`Shard.listen`) subscribe at a random time at or above since and take a delivery
whenever the upper has moved past their frontier; their storage calls fail and stall like the
others' (a failed delivery is asked for again), and some crash (walk away without closing, so
their hold stays until its lease runs out) or close.

What must hold, checked at the end against the model built from the acknowledged appends
(each at the time its commit returned) plus the unknown ones that the final shard shows:
- every acknowledged append is in the shard exactly once, at its time; an unknown one at most
  once; nothing else is;
- every snapshot a reader took during the run equals the model's snapshot at that time;
- every listener saw each update exactly once and in order: its frontiers rise from
  ``as_of + 1``, each delivery holds only updates in ``[previous frontier, frontier)`` (the
  first: the snapshot at ``as_of``), an acknowledged append at its own time, and the sum of
  its deliveries up to each frontier ``f`` is the model's snapshot at ``f - 1``;
- errors are the typed ones of the error table, never `CorruptData`; the shard verifies.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from persistshard.conformance.faults import FaultyBlob
from persistshard.conformance.model import ReferenceShard, snapshot_counter
from persistshard.core.read.listen import Listen
from persistshard.core.shard import Shard
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.storage.blob import FsspecBlob
from persistshard.errors import (
    CorruptData,
    Indeterminate,
    InvalidUpdates,
    NoShard,
    NotSealed,
    SinceViolation,
    StateConflict,
    UpperMismatch,
)

Row = tuple[int, str]
WRITERS = 3
STEPS = 120
#: Open listeners at most at once.
LISTENERS = 2
#: The faults of every handle's storage: `FaultyBlob` keywords (a probability per call). A
#: mode FaultyBlob gains (a lost response, a duplicated request) joins the run by being named
#: here or passed as ``Simulation(seed, faults=...)``.
FAULTS: dict[str, float] = {"fail_before": 0.03, "fail_after": 0.03, "stall": 0.02}


@dataclass
class Listener:
    """One subscription and what it delivered: ``(frontier, [(row, time, diff)])`` each."""

    listen: Listen
    as_of: int
    deliveries: list[tuple[int, list[tuple[Row, int, int]]]] = field(default_factory=list)
    busy: bool = False
    open: bool = True

    @property
    def waiting_past(self) -> int:
        return self.deliveries[-1][0] if self.deliveries else self.as_of


class Simulation:
    def __init__(self, seed: int, faults: dict[str, float] | None = None) -> None:
        self.rng = random.Random(seed)
        self.faults = dict(FAULTS if faults is None else faults)
        self.location = f"memory://sim-{uuid.uuid4().hex}"
        # row id -> the time its append landed at (None: landed, at a time since passed)
        self.acked: dict[int, int | None] = {}
        self.unknown: set[int] = set()
        self.reads: list[tuple[int, Counter[Row]]] = []
        self.listeners: list[Listener] = []
        self.next_id = 0
        self.in_stall = False
        self.handles = [self.handle(seed * 100 + i) for i in range(WRITERS + 3)]

    def handle(self, seed: int) -> tuple[Shard, FaultyBlob]:
        blob = FaultyBlob(FsspecBlob(self.location), seed=seed, on_stall=self.stall, **self.faults)
        return Shard(self.location, blob=blob), blob

    def stall(self) -> None:
        """Other actors act while one is paused inside a storage call (not nested further)."""
        if self.in_stall:
            return
        self.in_stall = True
        try:
            for _ in range(self.rng.randint(1, 4)):
                self.step(stalled=True)
        finally:
            self.in_stall = False

    def quiet(self) -> Shard:
        """A handle without faults, for resolving outcomes."""
        return Shard(self.location, blob=FsspecBlob(self.location))

    def step(self, stalled: bool = False) -> None:
        action = self.rng.choice(
            ["append"] * 6 + ["compact", "truncate", "gc", "since"] + ["read"] * 4 + ["listen"] * 6
        )
        shard, _ = self.rng.choice(self.handles)
        # Acknowledged before this step began (a stall inside the step lets other writers
        # append: a step that read the log before those is right to find no shard).
        acked_before = bool(self.acked)
        try:
            getattr(self, action)(shard)
        except (OSError, Indeterminate, StateConflict, UpperMismatch):
            pass  # a failed maintenance or read step: nothing to check, nothing lost
        except NoShard:  # maintenance before the first commit; never after one was acked
            assert not acked_before, f"{action}: NoShard after an acknowledged append"

    def append(self, shard: Shard) -> None:
        row = self.next_id
        self.next_id += 1
        while True:
            try:
                upper = shard.upper
                shard.append(to_table([((row, "w"), upper, 1)]))
                # The returned state may be newer than the commit (after an ambiguous
                # attempt): read the time back.
                landed = self.landed(row)
                assert landed is not None, f"acknowledged append of {row} is not in the shard"
                self.acked[row] = landed if landed >= 0 else None
                return
            except InvalidUpdates as e:  # the upper moved between reading it and writing
                assert "below the write's lower" in str(e)
            except (OSError, Indeterminate, UpperMismatch):
                if self.rng.random() < 0.3:
                    self.unknown.add(row)  # the writer crashes: the outcome stays unknown
                    return
                landed = self.landed(row)
                if landed is not None:
                    self.acked[row] = landed if landed >= 0 else None
                    return

    def landed(self, row: int) -> int | None:
        """The time ``row`` landed at (None if it did not; -1 if it landed at a time since
        has passed, which logical compaction forwarded)."""
        shard = self.quiet()
        upper, since = shard.upper, shard.since
        if upper == 0 or snapshot_counter(shard.snapshot(upper - 1))[(row, "w")] == 0:
            return None
        for r, t, _ in updates_of(shard.updates(since + 1, upper)):
            if r == (row, "w"):
                return t
        return -1

    def compact(self, shard: Shard) -> None:
        shard._maybe_compact(2)

    def truncate(self, shard: Shard) -> None:
        """What gc does to the log: keep the versions from the head's rollup on."""
        head = shard._consensus.head()
        if head is not None:
            shard._consensus.truncate(Entry.decode(head.data).rollup_version)

    def gc(self, shard: Shard) -> None:
        shard.gc(dry_run=False)  # default retention: nothing in flight is that old

    def since(self, shard: Shard) -> None:
        upper = shard.upper
        if upper > 4:
            shard.advance_since(upper - 4)

    def read(self, shard: Shard) -> None:
        upper = shard.upper
        if upper == 0:
            return
        as_of = self.rng.randrange(max(0, shard.since, upper - 6), upper)
        for _ in range(3):  # a reader retries a failed read a few times
            try:
                self.reads.append((as_of, snapshot_counter(shard.snapshot(as_of))))
                return
            except SinceViolation:
                return
            except (OSError, Indeterminate):
                continue
            except NotSealed as e:
                raise AssertionError(f"snapshot at {as_of} below the upper {upper}") from e

    def listen(self, shard: Shard) -> None:
        """Subscribe (up to `LISTENERS` open), or let an open listener take its next delivery
        if the upper moved past its frontier, or (rarely) close or crash one."""
        ready = [x for x in self.listeners if x.open and not x.busy]
        if not ready or (len(ready) < LISTENERS and self.rng.random() < 0.25):
            upper, since = shard.upper, shard.since
            if upper > since:
                as_of = self.rng.randrange(since, upper)
                try:
                    listen = shard.listen(as_of, timeout=0)
                except SinceViolation:
                    return  # since moved on between reading it and registering
                self.listeners.append(Listener(listen, as_of))
            return
        x = self.rng.choice(ready)
        roll = self.rng.random()
        if roll < 0.02:
            x.open = False  # crashes: walks away holding since until its lease runs out
            return
        if roll < 0.05:
            x.open = False
            x.listen.close()
            return
        if self.quiet().upper <= x.waiting_past:
            return  # nothing new: a real listener would wait
        x.busy = True  # a stall inside this delivery lets others act, not this listener
        try:
            for attempt in range(5):  # a listener retries a failed delivery a few times
                try:
                    table, frontier = next(x.listen)
                    break
                except (OSError, Indeterminate):
                    if attempt == 4:
                        return
        except StopIteration as e:
            raise AssertionError(
                f"listener at {x.as_of} is at frontier {x.listen.frontier} but delivered only "
                f"up to {x.waiting_past}: a delivery was lost"
            ) from e
        finally:
            x.busy = False
        x.deliveries.append((frontier, updates_of(table)))

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def check(self) -> None:
        final = self.quiet()
        present = snapshot_counter(final.snapshot(final.upper - 1))
        rows = Counter({k: d for (k, _), d in present.items()})
        for row in self.acked:
            assert rows[row] == 1, (row, rows[row])
        for row in self.unknown:
            assert rows[row] in (0, 1), row
        assert set(rows) <= set(self.acked) | self.unknown
        # Times above since are exact: each acknowledged append is at the time it returned.
        for (row, _), t, _ in updates_of(final.updates(final.since + 1, final.upper)):
            if self.acked.get(row) is not None:
                assert self.acked[row] == t, (row, t, self.acked[row])
        # The model holds the appends whose time is known; a read may also hold the others
        # that landed (each once), and nothing else.
        model = ReferenceShard()
        known = {row: t for row, t in self.acked.items() if t is not None}
        for row, t in sorted(known.items(), key=lambda kv: kv[1]):
            model.upper = t
            model.compare_and_append([((row, "w"), t, 1)], t, t + 1)
        model.upper = max(model.upper, final.upper)
        for as_of, seen in self.reads:
            want = model.snapshot(as_of)
            extra = seen - want
            assert not (want - seen), (as_of, want - seen)
            assert all(d == 1 and r[0] not in known and rows[r[0]] for r, d in extra.items())
        for x in self.listeners:
            self.check_listener(x, model, known, rows)
        assert final.verify().ok

    def check_listener(
        self, x: Listener, model: ReferenceShard, known: dict[int, int], rows: Counter[int]
    ) -> None:
        """Exactly once, in order, equal to the model at every frontier (module docstring)."""
        total: Counter[Row] = Counter()
        lower = x.as_of
        for i, (frontier, updates) in enumerate(x.deliveries):
            assert frontier == x.as_of + 1 if i == 0 else frontier > lower, (x.as_of, frontier)
            for row, t, diff in updates:
                if i == 0:
                    assert t == x.as_of, (x.as_of, row, t)
                else:
                    assert lower <= t < frontier, (x.as_of, lower, frontier, row, t)
                    if row[0] in known:
                        assert t == known[row[0]], (row, t, known[row[0]])
                total[row] += diff
            assert all(d == 1 for d in total.values()), f"listener {x.as_of}: a row twice"
            want = model.snapshot(frontier - 1)
            extra = total - want
            assert not (want - total), (x.as_of, frontier, want - total)
            assert all(r[0] not in known and rows[r[0]] for r in extra), (x.as_of, extra)
            lower = frontier


def to_table(updates: list[tuple[Row, int, int]]) -> pa.Table:
    return pa.table(
        {
            "k": [r[0] for r, _, _ in updates],
            "v": [r[1] for r, _, _ in updates],
            "_time": [t for _, t, _ in updates],
            "_diff": [d for _, _, d in updates],
        }
    )


def updates_of(table: pa.Table) -> list[tuple[Row, int, int]]:
    return [((r["k"], r["v"]), r["_time"], r["_diff"]) for r in table.to_pylist()]


#: The faults of real networks, each run once beside the defaults: a response lost after the
#: store applied the request, the client library's own retry after one (a conditional create
#: then answers "exists"), and a request delivered twice.
NETWORK_FAULTS = ("lose_response", "retry_after_lost", "duplicate")


@pytest.mark.parametrize(
    ("seed", "extra"),
    [
        *((seed, None) for seed in range(3)),
        *((3 + i, fault) for i, fault in enumerate(NETWORK_FAULTS)),
    ],
)
def test_seeded_simulation_matches_the_model(seed, extra):
    sim = Simulation(seed, faults=None if extra is None else {**FAULTS, extra: 0.04})
    try:
        sim.run(STEPS)
        assert len(sim.acked) > 20 and len(sim.reads) > 3
        assert sum(b.stalls for _, b in sim.handles) > 5
        assert sum(len(x.deliveries) for x in sim.listeners) > 5
        sim.check()
    except CorruptData as e:  # never: a slow or failing writer must not damage the shard
        raise AssertionError(f"seed {seed}, faults {sim.faults}: {e}") from e
    except AssertionError as e:  # the seed reproduces it
        raise AssertionError(f"seed {seed}, faults {sim.faults}: {e}") from e
    finally:
        FsspecBlob(sim.location).fs.rm(FsspecBlob(sim.location).root, recursive=True)
