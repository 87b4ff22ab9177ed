"""Small helpers shared by the tests."""

from __future__ import annotations

import time

import pyarrow as pa


def examples(ci: int) -> int:
    """``max_examples`` for a test that runs ``ci`` examples under the "ci" Hypothesis profile
    (tests/conftest.py), scaled to the profile loaded: a quarter under "dev", never fewer
    than min(ci, 3). Write ``settings(max_examples=examples(60))``, never a bare number,
    which would ignore the profile."""
    from hypothesis import settings

    scaled = ci * settings().max_examples // settings.get_profile("ci").max_examples
    return max(min(ci, 3), scaled)


class Clock:
    """A settable wall clock for the shard's code (ids, commit times, leases): what the
    ``clock`` fixture (tests/conftest.py) puts in place of
    `persistshard.core.storage.layout.now_ms`, in ms since the epoch."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def now(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


def rows_of(table: pa.Table) -> dict[tuple, int]:
    """A snapshot as {row tuple: diff}; fails if a row appears twice (not consolidated)."""
    out: dict[tuple, int] = {}
    names = [n for n in table.column_names if n != "_diff"]
    for r in table.to_pylist():
        key = tuple(r[n] for n in names)
        assert key not in out, f"row {key} appears twice"
        out[key] = r["_diff"]
    return out


def updates(rows: list[tuple[int, str, int, int]]) -> pa.Table:
    """Updates with columns ``id BIGINT, item STRING`` from (id, item, time, diff) tuples."""
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "item": pa.array([r[1] for r in rows], pa.string()),
            "_time": pa.array([r[2] for r in rows], pa.int64()),
            "_diff": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def tick(shard, clock: Clock, ms: int) -> None:  # type: ignore[no-untyped-def]
    """Let ``ms`` pass on ``clock`` and record it in the shard with a commit that changes
    nothing else (expiring a hold nobody has): gc judges time by at most
    `persistshard.core.storage.layout.CLOCK_LEAD_MS` past the newest commit, so an idle
    shard's clock only moves for gc when something commits."""
    clock.advance(ms)
    shard.maintenance.expire_reader("nobody")
