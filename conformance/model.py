"""Shard semantics against a reference model: random operation sequences, identical answers.

`ReferenceShard` is the plainest possible shard: a list of (row, time, diff) tuples and two
integers. `make_shard_machine` builds a hypothesis state machine that drives a real shard and
the reference through the same appends (including stale, racing ones), seals, since advances,
unsealed writes, snapshots and change reads, and requires the same answers and the same errors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from persistshard.core.shard import Shard
from persistshard.errors import (
    InvalidUpdates,
    NoShard,
    NotSealed,
    SinceViolation,
    UpperMismatch,
)

Row = tuple[int, str]

ROW_SCHEMA = pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.string())])


class ReferenceShard:
    """The model: every update kept as is; reads sum diffs by row. Before its first commit
    (``created``) the location holds no shard: reads are `NoShard`."""

    def __init__(self) -> None:
        self.updates: list[tuple[Row, int, int]] = []
        self.upper = 0
        self.since = 0
        self.created = False

    def compare_and_append(
        self, updates: list[tuple[Row, int, int]], expected: int, new_upper: int
    ) -> None:
        if expected != self.upper:
            raise UpperMismatch(expected, self.upper)
        if any(t < expected for _, t, _ in updates):
            raise InvalidUpdates("time below lower")
        self.updates.extend(updates)
        self.upper = new_upper
        self.created = True

    def seal(self, upper: int) -> None:
        if upper > self.upper:  # sealing at the upper itself commits nothing
            self.upper = upper
            self.created = True

    def advance_since(self, since: int) -> None:
        if since > self.upper:
            raise NotSealed(since, self.upper)
        self.since = max(self.since, since)

    def snapshot(self, as_of: int) -> Counter[Row]:
        if not self.created:
            raise NoShard("no shard")
        if as_of < self.since:
            raise SinceViolation(as_of, self.since)
        if as_of >= self.upper:
            raise NotSealed(as_of, self.upper)
        out: Counter[Row] = Counter()
        for row, t, d in self.updates:
            if t <= as_of:
                out[row] += d
        return Counter({r: d for r, d in out.items() if d != 0})

    def changes(self, lo: int, hi: int) -> dict[tuple[Row, int], int]:
        if not self.created:
            raise NoShard("no shard")
        if hi > self.upper:
            raise NotSealed(hi - 1, self.upper)
        if 0 < lo <= self.since:
            raise SinceViolation(lo, self.since)
        out: dict[tuple[Row, int], int] = {}
        for row, t, d in self.updates:
            t2 = max(t, self.since)
            if lo <= t2 < hi:
                out[(row, t2)] = out.get((row, t2), 0) + d
        return {k: v for k, v in out.items() if v != 0}


def to_table(updates: list[tuple[Row, int, int]]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([r[0] for r, _, _ in updates], pa.int64()),
            "v": pa.array([r[1] for r, _, _ in updates], pa.string()),
            "_time": pa.array([t for _, t, _ in updates], pa.int64()),
            "_diff": pa.array([d for _, _, d in updates], pa.int64()),
        }
    )


def snapshot_counter(table: pa.Table) -> Counter[Row]:
    out: Counter[Row] = Counter()
    for r in table.to_pylist():
        assert (r["k"], r["v"]) not in out, "snapshot() did not consolidate"
        assert r["_diff"] != 0, "snapshot() kept a zero diff"
        out[(r["k"], r["v"])] = r["_diff"]
    return out


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except (UpperMismatch, NotSealed, SinceViolation, InvalidUpdates, NoShard) as e:
        return type(e).__name__, None


rows = hs.tuples(hs.integers(0, 4), hs.sampled_from(["a", "b", "c"]))
diffs = hs.integers(-2, 2).filter(lambda d: d != 0)


def make_shard_machine(
    new_location: Callable[[], str], storage_options: dict[str, Any] | None = None
) -> type[RuleBasedStateMachine]:
    """A state machine comparing `Shard` at fresh locations from ``new_location`` (opened
    with ``storage_options``) to the model."""
    options = dict(storage_options or {})

    class ShardMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            location = new_location()
            self.shard = Shard(location, **options)
            self.other = Shard(location, **options)  # a second handle, for racing writers
            self.model = ReferenceShard()

        @rule(
            data=hs.lists(hs.tuples(rows, hs.integers(0, 3), diffs), max_size=6),
            width=hs.integers(0, 3),
            offset=hs.integers(-1, 1),
        )
        def append(self, data: list[tuple[Row, int, int]], width: int, offset: int) -> None:
            expected = self.model.upper + offset if offset < 0 else self.model.upper
            expected = max(expected, 0)
            updates = [(r, self.model.upper + dt, d) for r, dt, d in data]
            new_upper = expected + width
            got = _outcome(
                lambda: self.shard.compare_and_append(to_table(updates), expected, new_upper)
            )
            want = _outcome(lambda: self.model.compare_and_append(updates, expected, new_upper))
            if got[0] == "InvalidUpdates" and want[0] == "ok" and not updates:
                raise AssertionError("an empty append was refused")
            assert got[0] == want[0], (got, want)

        @precondition(lambda self: self.model.upper > 0)
        @rule(data=hs.lists(hs.tuples(rows, diffs), min_size=1, max_size=3))
        def racing_append(self, data: list[tuple[Row, int]]) -> None:
            """The other handle appends first; ours, with the same expected upper, must lose."""
            expected = self.model.upper
            updates = [(r, expected, d) for r, d in data]
            self.other.compare_and_append(to_table(updates), expected, expected + 1)
            self.model.compare_and_append(updates, expected, expected + 1)
            got = _outcome(
                lambda: self.shard.compare_and_append(to_table(updates), expected, expected + 1)
            )
            assert got[0] == "UpperMismatch"

        @rule(step=hs.integers(0, 3))
        def seal(self, step: int) -> None:
            target = self.model.upper + step
            self.shard.seal(target)
            self.model.seal(target)

        @rule(back=hs.integers(0, 3))
        def advance_since(self, back: int) -> None:
            target = max(self.model.upper - back, 0)
            self.shard.advance_since(target)
            self.model.advance_since(target)

        @rule(delta=hs.integers(-2, 2))
        def snapshot(self, delta: int) -> None:
            as_of = self.model.upper - 1 + delta
            got = _outcome(lambda: snapshot_counter(self.shard.snapshot(as_of)))
            want = _outcome(lambda: self.model.snapshot(as_of))
            assert got == want, (as_of, got, want)

        @rule(lo=hs.integers(0, 12), width=hs.integers(0, 6))
        def changes(self, lo: int, width: int) -> None:
            hi = lo + width

            def read() -> dict[tuple[Row, int], int]:
                t = self.shard.updates(lo, hi)
                out: dict[tuple[Row, int], int] = {}
                for r in t.to_pylist():
                    key = ((r["k"], r["v"]), r["_time"])
                    assert key not in out, "updates() did not consolidate"
                    out[key] = r["_diff"]
                return out

            got = _outcome(read)
            want = _outcome(lambda: self.model.changes(lo, hi))
            assert got == want, (lo, hi, got, want)

        @invariant()
        def frontiers_agree(self) -> None:
            state = self.shard.inspect.state()
            assert (state.upper, state.since) == (self.model.upper, self.model.since)
            state.check()

    return ShardMachine
