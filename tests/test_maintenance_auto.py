"""History retention (since follows the upper minus it) and the maintenance a writer runs
after its own commits (`persistshard.core.maintenance.auto`, issue 26 item 3).

Times are judged by the one clock `persistshard.core.storage.layout.now_ms`; the window tests
set it by hand (no sleeps).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.cli import main
from persistshard.core.maintenance import auto
from persistshard.core.statemachine import retention as ret
from persistshard.core.statemachine.state import ShardState
from persistshard.core.storage import layout
from persistshard.core.storage.layout import ROLLUP_EVERY
from persistshard.errors import StateConflict


def _rows(ids: list[int], tag: str = "v") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids]})


class Clock:
    """A settable clock for a shard's configuration (``open_shard(path, clock=clock)``)."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> Clock:
    return Clock(layout.now_ms())


def _parts_on_disk(shard: ps.Shard) -> int:
    return sum(1 for _ in shard._blob.list("parts/"))


# --- retention ---------------------------------------------------------------------------


def test_versions_retention_moves_since_on_every_commit(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    uppers = []
    for i in range(4):
        uppers.append(shard.append(_rows([i])).upper)
    assert shard.since == 0  # no retention: history is kept
    shard.set_retention(versions=3)
    assert shard.since == 0  # only the newest version is known to the retention yet
    for i in range(4, 9):
        uppers.append(shard.append(_rows([i])).upper)
        state = shard.inspect.state()
        if i == 4:  # versions are counted from the one current when the retention was set
            assert state.since == 0
            continue
        # The 3 newest data versions stay readable, older snapshots do not.
        assert state.since == uppers[-3] - 1
        assert shard.snapshot(as_of=uppers[-3] - 1).num_rows == i - 1
        with pytest.raises(ps.SinceViolation):
            shard.snapshot(as_of=uppers[-3] - 2)
        assert len(state.retention_marks) <= 3
    shard.set_retention(versions=1)  # applies at once, never to the upper
    assert shard.since == shard.upper - 1
    assert shard.snapshot().num_rows == 9


def test_window_retention_follows_the_clock(tmp_path, clock: Clock):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, clock=clock)
    shard.set_retention(seconds=60)
    t0 = clock.ms
    at: list[tuple[int, int]] = []
    for i in range(6):  # one commit every 20 s
        clock.ms = t0 + i * 20_000
        at.append((clock.ms, shard.append(_rows([i])).upper))
        cutoff = clock.ms - 60_000
        older = [u for t, u in at if t <= cutoff]
        # since = the upper of the newest version committed at or before now - 60 s, minus 1
        assert shard.since == (older[-1] - 1 if older else 0)
    assert shard.since > 0
    shard.set_retention(seconds=None, versions=None)  # cleared: since stays, marks go
    state = shard.inspect.state()
    assert state.retention is None and state.retention_marks == ()
    clock.ms += 3_600_000
    since = shard.since
    shard.append(_rows([99]))
    assert shard.since == since


def test_both_rules_keep_what_either_wants(tmp_path, clock: Clock):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, clock=clock)
    shard.set_retention(seconds=3600, versions=1)
    for i in range(3):
        shard.append(_rows([i]))
    assert shard.since == 0  # the window still wants everything
    clock.ms += 7200_000
    shard.append(_rows([9]))
    assert shard.since == shard.upper - 2  # the window's answer: the version an hour ago


def test_retention_never_passes_a_live_hold(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    shard.append(_rows([0]))
    shard.append(_rows([1]))
    hold = shard.register_reader("r1")
    held = hold.since
    shard.set_retention(versions=1)
    for i in range(2, 6):
        shard.append(_rows([i]))
        assert shard.since == held
    shard.maintenance.expire_reader("r1")
    shard.append(_rows([6]))
    assert shard.since == shard.upper - 1


def test_retention_survives_reopen_and_rollups(tmp_path):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, maintenance=False)
    shard.set_retention(seconds=7 * 86400, versions=5)
    for i in range(ROLLUP_EVERY + 3):
        shard.append(_rows([i]))
    state = shard.inspect.state()
    assert state.since == 0  # the week's window still wants every version
    assert len(state.retention_marks) == ROLLUP_EVERY + 3
    again = ps.open_shard(location)  # a new handle: folds from the rollup plus the log
    reopened = again.inspect.state()
    assert reopened.retention == ret.Retention(ms=7 * 86400 * 1000, versions=5)
    assert reopened.retention_marks == state.retention_marks
    assert ShardState.from_json(json.loads(json.dumps(state.to_json()))) == state
    assert again.inspect.retention() == reopened.retention
    assert again.history()[0]["kind"] == "set_retention"
    assert "retention 7d and 5 versions" in again.history()[0]["summary"]


def test_bad_retention_values_are_refused(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    for kwargs in ({"seconds": 0}, {"seconds": -1}, {"versions": 0}, {"versions": 10**6}):
        with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: retention"):
            shard.set_retention(**kwargs)
    assert shard.inspect.state().version == 0


def test_window_marks_stay_bounded_and_never_move_since_too_far():
    """The pure rule: thousands of commits inside one window keep a bounded list of marks,
    and the since they allow is never past the exact answer (only later, by thinning)."""
    kept = ret.Retention(ms=400_000)
    marks: tuple[ret.Mark, ...] = ()
    for i in range(1200):  # one commit a second, 400 in every window: thinning is needed
        now = i * 1000
        marks = ret.add_mark(kept, marks, now, i + 1)
        assert len(marks) <= 1 + ret.MAX_WINDOW_MARKS
        assert ret.check_marks(kept, marks, i + 1) is None
        target = ret.since_target(kept, marks, now)
        cutoff = now - kept.ms
        if cutoff < 0:
            assert target is None
            continue
        truth = cutoff // 1000 + 1  # the upper of the newest commit at or before the cutoff
        # Never past the exact answer; behind it by at most about two gaps of evenly spread
        # marks.
        lag_versions = 2 * kept.ms // ret.MAX_WINDOW_MARKS // 1000 + 1
        assert target is not None and truth - 1 - lag_versions <= target <= truth - 1


# --- maintenance after commits ---------------------------------------------------------------


def test_forty_appends_leave_a_logarithmic_trace(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"))
    for i in range(40):
        shard.append(_rows([i]))
    state = shard.inspect.state()
    assert len(state.trace) <= 8  # 40 = 5 * 8: five level-1 batches, no manual call
    assert shard.snapshot().num_rows == 40
    assert shard.verify().ok


def test_maintenance_false_leaves_every_batch(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    for i in range(40):
        shard.append(_rows([i]))
    assert len(shard.inspect.state().trace) == 40
    assert shard._maintain(0) is None


def test_a_maintenance_error_does_not_fail_the_commit(tmp_path, monkeypatch, caplog):
    shard = ps.open_shard(str(tmp_path / "s"))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk on fire")

    monkeypatch.setattr(auto, "maybe_compact", broken)
    with caplog.at_level(logging.WARNING, logger="persistshard.core.maintenance.auto"):
        for i in range(9):
            shard.append(_rows([i]))
    assert shard.snapshot().num_rows == 9
    assert any("disk on fire" in r.getMessage() for r in caplog.records)

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise StateConflict("another compaction won")

    monkeypatch.setattr(auto, "maybe_compact", lost)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="persistshard.core.maintenance.auto"):
        shard.append(_rows([9]))
    assert shard.snapshot().num_rows == 10
    assert not caplog.records  # a lost race is skipped silently


def test_retention_and_maintenance_bound_storage_by_distinct_rows(tmp_path, clock: Clock):
    """Rewriting the same 4 keys 24 times: with a retention, compaction consolidates what
    since passed, and gc (run by the writer once since moved and the floor passed) deletes
    the replaced parts; no manual call."""
    shard = ps.open_shard(str(tmp_path / "s"), clock=clock)
    shard.set_retention(versions=1)
    for r in range(24):
        shard.upsert(_rows([0, 1, 2, 3], f"r{r}-"), "id")
    state = shard.inspect.state()
    stored_rows = sum(b.num_rows for b in state.trace)
    assert stored_rows < 24 * 4 // 2
    clock.ms += 2 * 3600_000  # past gc's retention floor
    shard.upsert(_rows([0], "last"), "id")
    assert _parts_on_disk(shard) == len(shard.inspect.state().parts())
    assert shard.snapshot().num_rows == 4
    assert shard.verify().ok


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_retention_shows_and_sets(tmp_path, capsys):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    for i in range(3):
        shard.append(_rows([i]))
    assert main(["retention", location]) == 0
    assert "retention none" in capsys.readouterr().out
    assert main(["retention", location, "--versions", "1", "--seconds", "86400"]) == 0
    out = capsys.readouterr().out
    assert "retention 1d and 1 version" in out
    assert main(["retention", location, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["seconds"] == 86400 and shown["versions"] == 1
    assert main(["retention", location, "--versions", "0"]) == 2
    assert "InvalidOption" in capsys.readouterr().err
    assert main(["retention", location, "--clear"]) == 0
    assert ps.open_shard(location).inspect.retention() is None


def test_retention_option_syntax():
    from persistshard.datasource.options import parse_retention

    assert parse_retention({}) is None
    assert parse_retention({"retention": "7d"}) == (7 * 86400, None)
    assert parse_retention({"retention": "12h"}) == (12 * 3600, None)
    assert parse_retention({"retention": "3600s"}) == (3600, None)
    assert parse_retention({"retention": "100 versions"}) == (None, 100)
    assert parse_retention({"retention": "1 version"}) == (None, 1)
    assert parse_retention({"retention": "7d and 100 versions"}) == (7 * 86400, 100)
    assert parse_retention({"retention": "none"}) == (None, None)
    for bad in ("7", "7 days", "0d", "0 versions", "-1h", "7d and 8d", "5000 versions"):
        with pytest.raises(ps.InvalidOption, match=r"^InvalidOption: option retention"):
            parse_retention({"retention": bad})
