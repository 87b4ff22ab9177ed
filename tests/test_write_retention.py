"""A write's retention lands in the write's own commit (``append_set_retention``), never on
its own before the write: `WriteTransaction.commit` with a `RetentionChange`.

What must hold: a commit that sets the retention is one log entry (its data and the
retention together); a refused commit changes neither; a retention equal to the stored one
makes a plain ``append`` (nothing about the retention changes); the combined commit's state
is exactly ``set_retention``'s then the append's; a reader that does not know the kind
refuses its entry (`CorruptData`), never replays it as a plain append.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.shard import write_transaction
from persistshard.core.statemachine.commits import KINDS, apply
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.append_set_retention import AppendSetRetention
from persistshard.core.statemachine.commits.set_retention import SetRetention
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.statemachine.retention import Retention, RetentionChange
from persistshard.core.statemachine.state import Batch, ShardState, check_transition
from persistshard.errors import CorruptData, InvalidOption, InvalidUpdates, UpperMismatch

SCHEMA = pa.schema([pa.field("id", pa.int64())])


def _shard(tmp_path, versions: int = 4) -> ps.Shard:
    """A shard of ``versions`` one-row appends (upper ``versions``), no retention."""
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    for i in range(versions):
        shard.append(pa.table({"id": pa.array([i], pa.int64())}))
    return shard


def _write(
    shard: ps.Shard, retention: RetentionChange | None, *, expected_upper: int | None = None
) -> ShardState:
    """One row committed at the upper through the write transaction, with ``retention``."""
    upper = shard.upper if expected_upper is None else expected_upper
    txn = write_transaction(shard)
    with txn:
        rows = pa.table(
            {
                "id": pa.array([100], pa.int64()),
                "_time": pa.array([upper], pa.int64()),
                "_diff": pa.array([1], pa.int64()),
            }
        )
        written = txn.write_updates(rows, lower=upper, new_upper=upper + 1, schema=SCHEMA)
        return txn.commit(
            written, expected_upper=upper, new_upper=upper + 1, schema=SCHEMA, retention=retention
        )


def _look(shard: ps.Shard) -> tuple:
    """Everything a failed write must leave as it was: retention, its marks, since, upper,
    the log's entries and the rows."""
    s = ps.open_shard(shard.location, maintenance=False)
    state = s.inspect.state()
    history = [(h["version"], h["commit"], h["id"]) for h in s.inspect.history()]
    rows = sorted(s.snapshot(s.upper - 1).column("id").to_pylist())
    return state.retention, state.retention_marks, state.since, state.upper, history, rows


def test_a_write_sets_the_retention_in_its_own_commit(tmp_path):
    shard = _shard(tmp_path)
    before = len(shard.inspect.history())
    state = _write(shard, RetentionChange(Retention(versions=2)))
    history = ps.open_shard(shard.location).inspect.history()
    assert len(history) == before + 1, "one new log entry: the data and the retention together"
    last = history[-1]
    assert last["commit"] == "append_set_retention"
    assert last["kind"] == "append"
    assert last["summary"].endswith("; also set the retention to 2 versions"), last["summary"]
    assert state.retention == Retention(versions=2)
    assert state.upper == 5
    # Since follows the new retention at once: the 2 newest data versions stay readable.
    assert state.since == 3
    assert sorted(shard.snapshot(4).column("id").to_pylist()) == [0, 1, 2, 3, 100]


def test_a_write_clears_the_retention_in_its_own_commit(tmp_path):
    shard = _shard(tmp_path)
    shard.set_retention(versions=2)
    state = _write(shard, RetentionChange(None))
    assert state.retention is None and state.retention_marks == ()
    last = shard.inspect.history()[-1]
    assert last["commit"] == "append_set_retention"
    assert last["summary"].endswith("; also cleared the retention"), last["summary"]


def test_a_write_whose_retention_is_the_stored_one_is_a_plain_append(tmp_path):
    shard = _shard(tmp_path)
    shard.set_retention(versions=2)
    kept = shard.inspect.state()
    state = _write(shard, RetentionChange(Retention(versions=2)))
    assert shard.inspect.history()[-1]["commit"] == "append"
    assert state.retention == kept.retention
    # The marks moved only as every append moves them (one for the new upper).
    assert state.retention_marks[:-1] == kept.retention_marks
    assert state.retention_marks[-1][1] == 5
    # And without the option: a plain append, the retention left as it was.
    state = _write(shard, None)
    assert shard.inspect.history()[-1]["commit"] == "append"
    assert state.retention == Retention(versions=2)


def test_a_refused_write_leaves_the_retention_as_it_was(tmp_path):
    shard = _shard(tmp_path)
    shard.set_retention(seconds=3600)
    before = _look(shard)
    with pytest.raises(UpperMismatch):
        _write(shard, RetentionChange(Retention(versions=1)), expected_upper=2)
    assert _look(shard) == before
    assert shard.inspect.retention() == Retention(ms=3_600_000)


def test_an_invalid_retention_is_refused_with_nothing_applied(tmp_path):
    shard = _shard(tmp_path)
    before = _look(shard)
    with pytest.raises(InvalidOption, match="append_set_retention: retention of 5000 versions"):
        _write(shard, RetentionChange(Retention(versions=5000)))
    assert _look(shard) == before


def test_the_combined_commit_is_set_retention_then_the_append(tmp_path):
    """The state after ``append_set_retention`` is the state after ``set_retention`` and then
    the append, at the same commit time (but for the version, one step instead of two)."""
    shard = _shard(tmp_path)
    shard.set_retention(seconds=1)  # marks to carry over, some older than the new window
    base = shard.inspect.state()
    at = base.retention_marks[-1][0] + 10_000
    batch = Batch("b-t", base.upper, base.upper + 1, ())
    for retention in (Retention(versions=2), Retention(ms=5_000, versions=3), None):
        append = Append(base.upper, base.upper + 1, batch, id="a", at_ms=at)
        one = apply(base, AppendSetRetention.of(append, retention))
        two = apply(apply(base, SetRetention(retention, id="r", at_ms=at)), append)
        assert one == replace(two, version=one.version), retention
        check_transition(base, one, AppendSetRetention.of(append, retention))
    # A plain append may not change the retention: only the kinds that say so.
    changed = replace(apply(base, append), retention=Retention(versions=9))
    with pytest.raises(InvalidUpdates, match="only set_retention and append_set_retention"):
        check_transition(base, changed, append)


def test_only_a_plain_append_also_sets_the_retention(tmp_path):
    batch = Batch("b-t", 0, 1, ())
    combined = AppendSetRetention.of(Append(0, 1, batch, id="a"), None)
    with pytest.raises(TypeError, match="cannot also set the retention"):
        AppendSetRetention.of(combined, Retention(versions=1))


def test_a_reader_that_does_not_know_the_kind_refuses_its_entry(monkeypatch):
    """A reader older than ``append_set_retention`` would ignore an unknown argument of
    ``append`` and replay a state without the retention; an unknown kind is refused."""
    commit = AppendSetRetention.of(
        Append(0, 1, Batch("b-t", 0, 1, ()), id="a", at_ms=1), Retention(versions=3)
    )
    data = Entry(commit, 0, None, at_ms=1).encode()
    assert Entry.decode(data).commit == commit
    monkeypatch.delitem(KINDS, "append_set_retention")
    with pytest.raises(CorruptData, match="unknown commit kind 'append_set_retention'"):
        Entry.decode(data)


def test_an_entry_without_its_retention_argument_is_corrupt():
    commit = AppendSetRetention.of(Append(0, 1, Batch("b-t", 0, 1, ()), id="a"), None)
    stored = commit.to_json()
    del stored["args"]["retention"]
    from persistshard.core.statemachine.commits import Commit

    with pytest.raises(KeyError):
        Commit.from_json(stored)
    stored["args"]["retention"] = "7d"
    with pytest.raises(TypeError, match="is not an object"):
        Commit.from_json(stored)
