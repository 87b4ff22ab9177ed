"""The shard time of a wall-clock instant (`persistshard.core.read.instant`), what SQL's
``TIMESTAMP AS OF`` reads through the companion's session catalog (the bridge's ``time_at``):
the newest time readable after the newest retained commit recorded at or before the instant;
before the oldest retained commit `SinceViolation`; in the future ``upper - 1``."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.read.instant import commit_uppers, time_at_instant
from persistshard.datasource import bridge
from persistshard.errors import InvalidOption, SinceViolation


def _row(i: int) -> pa.Table:
    return pa.table({"id": [i], "_time": [i], "_diff": [1]})


def test_an_instant_is_the_upper_after_the_newest_commit_recorded_by_then(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, clock=clock.now)
    times = []
    for i in range(3):
        clock.advance(1000)
        shard.append(_row(i), new_upper=i + 1)
        times.append(clock.ms)
    clock.advance(1000)
    shard.register_reader("r")  # a commit that moves no upper: the time stays
    held = clock.ms
    us = 1000
    assert commit_uppers(shard)[:3] == [(t, i + 1) for i, t in enumerate(times)]
    assert time_at_instant(shard, times[0] * us) == 0  # exactly at the commit: included
    assert time_at_instant(shard, times[1] * us - 1) == 0  # a microsecond before: not
    assert time_at_instant(shard, times[1] * us + 999) == 1
    assert time_at_instant(shard, held * us) == 2
    assert time_at_instant(shard, (held + 10**9) * us) == shard.upper - 1  # the future
    with pytest.raises(SinceViolation, match="before the oldest commit"):
        time_at_instant(shard, times[0] * us - 1)


def test_an_instant_before_any_data_or_compacted_away_is_an_error(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, clock=clock.now)
    shard.register_reader("early")  # creates the log before any data
    first = clock.ms
    clock.advance(1000)
    for i in range(3):
        shard.append(_row(i), new_upper=i + 1)
        clock.advance(1000)
    with pytest.raises(InvalidOption, match="nothing was written"):
        time_at_instant(shard, first * 1000)


def test_a_truncated_log_answers_from_its_oldest_retained_commit(tmp_path, clock):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, clock=clock.now)
    for i in range(40):
        clock.advance(1000)
        shard.append(_row(i), new_upper=i + 1)
    shard.advance_since(39)
    clock.advance(10**7)
    shard.gc(dry_run=False, retention_seconds=0)
    kept = commit_uppers(shard)
    assert kept and kept[0][1] > 1, "gc truncated nothing: the test needs a truncated log"
    # The oldest retained entry's state is its own rollup: it counts too.
    assert kept[0][1] == shard._machine.entries(1)[0][0]
    oldest_ms, oldest_upper = kept[0]
    assert [u for _, u in kept] == sorted(u for _, u in kept)
    with pytest.raises(SinceViolation, match="before the oldest commit"):
        time_at_instant(shard, oldest_ms * 1000 - 1)
    # Retained, but its time is compacted away: the reader's own error.
    assert oldest_upper - 1 < shard.since
    with pytest.raises(SinceViolation, match="before the shard's since"):
        time_at_instant(shard, oldest_ms * 1000)
    assert time_at_instant(shard, kept[-1][0] * 1000) == 39


def test_the_bridge_answers_time_at_and_plan_requests_on_one_server(tmp_path, clock):
    loc = str(tmp_path / "s")
    shard = ps.open_shard(loc, maintenance=False, clock=clock.now)
    for i in range(2):
        clock.advance(1000)
        shard.append(_row(i), new_upper=i + 1)
    requests = [
        {"kind": "time_at", "options": {"path": loc}, "micros": (clock.ms - 1000) * 1000},
        {"kind": "time_at", "options": {"path": loc}, "micros": 0},
        {"kind": "time_at", "options": {}, "micros": 0},
    ]
    sink = io.StringIO()
    bridge.serve(io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), sink)
    answers = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert answers[0] == {"as_of": 0}
    assert answers[1]["error"].startswith("SinceViolation: ")
    assert answers[2]["error"].startswith("InvalidOption: no shard location")
