"""Parts a process just wrote are kept decoded for its own compaction
(`persistshard.core.storage.recent`): merges take them from memory, give the same output as
merges that read storage, stay within their bounds, and forget what a commit replaced.
Reads never use them. Only parts stored as files are kept, so the shards here write every part
as a file (``inline_bytes=0``)."""

from __future__ import annotations

import os

import pytest
from conformance_helpers import updates

import persistshard as ps
from persistshard.core.maintenance import compact as cm
from persistshard.core.storage import recent
from persistshard.errors import CorruptData


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(recent, "RECENT", recent.RecentParts())
    monkeypatch.setattr(cm, "RECENT", recent.RECENT)
    from persistshard.core.storage import parts as parts_mod

    monkeypatch.setattr(parts_mod, "RECENT", recent.RECENT)


def _kept() -> recent.RecentParts:
    return recent.RECENT


def _appends(shard: ps.Shard, n: int, rows: int = 50, offset: int = 0) -> None:
    for i in range(n):
        t = shard.upper
        shard.append(updates([((offset + i) * 1000 + r, f"name-{r}", t, 1) for r in range(rows)]))


def _part_files(root) -> list[str]:
    return [
        os.path.join(d, f) for d, _, files in os.walk(root / "parts") for f in files if ".part" in f
    ]


def test_merge_takes_the_inputs_this_process_wrote_from_memory(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    _appends(shard, 8)
    expected = shard.snapshot()
    inputs = [p.key for b in shard.inspect.state().trace for p in b.parts]
    assert all(
        _kept().held(shard._blob.url, p, 1 << 20)
        for b in shard.inspect.state().trace
        for p in b.parts
    )
    for path in _part_files(tmp_path / "s"):  # storage no longer has the inputs
        os.remove(path)
    report = shard._maybe_compact()
    assert report is not None and report.committed == 1
    assert shard.snapshot().equals(expected)  # the output part is read from storage
    assert len(shard.inspect.state().trace) == 1
    # Replaced inputs are forgotten; the output is kept for the next level's merge.
    assert not any(_kept()._memo.get((shard._blob.url, k)) for k in inputs)
    (out,) = shard.inspect.state().trace[0].parts
    assert _kept().held(shard._blob.url, out, 1 << 20) is not None


def test_without_the_kept_parts_the_same_merge_reads_storage(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    _appends(shard, 8)
    _kept().clear()
    for path in _part_files(tmp_path / "s"):
        os.remove(path)
    with pytest.raises(CorruptData, match="missing"):
        shard._maybe_compact()


def test_output_is_byte_for_byte_the_output_of_a_merge_that_read_storage(tmp_path):
    outputs = []
    for name, keep in (("kept", True), ("read", False)):
        shard = ps.open_shard(str(tmp_path / name), maintenance=False, inline_bytes=0)
        _appends(shard, 8)
        if not keep:
            _kept().clear()
        shard._maybe_compact()
        (part,) = shard.inspect.state().trace[0].parts
        outputs.append(shard._blob.get(part.key))
    assert outputs[0] == outputs[1]


def test_a_rebased_append_is_read_at_its_new_time_from_memory(tmp_path):
    """A plain append that lost its race lands at a later time without being rewritten (its
    reference rewrites the time); the kept copy holds the old time and is read as stored."""
    import pyarrow as pa

    location = str(tmp_path / "s")
    mine = ps.open_shard(location, maintenance=False, inline_bytes=0)
    mine.append(pa.table({"id": [1], "name": ["a"]}))
    other = ps.open_shard(location, maintenance=False, inline_bytes=0)
    other.append(pa.table({"id": [2], "name": ["b"]}))
    mine.append(pa.table({"id": [3], "name": ["c"]}))  # planned on a stale upper: rebased
    rebased = [p for b in mine.inspect.state().trace for p in b.parts if p.rewrite_time is not None]
    assert rebased and _kept().held(mine._blob.url, rebased[0], 1 << 20) is not None
    before = mine.updates(0, mine.upper).to_pylist()
    mine.compact()
    assert len(mine.inspect.state().trace) == 1
    assert mine.updates(0, mine.upper).to_pylist() == before


def test_a_large_part_is_not_kept_and_the_total_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(
        recent, "RECENT", recent.RecentParts(part_bytes=4 << 10, total_bytes=10 << 10)
    )
    monkeypatch.setattr(cm, "RECENT", recent.RECENT)
    from persistshard.core.storage import parts as parts_mod

    monkeypatch.setattr(parts_mod, "RECENT", recent.RECENT)
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    shard.append(updates([(r, "x" * 40, 0, 1) for r in range(2000)]))  # far over 4 KiB
    assert len(_kept()) == 0
    _appends(shard, 20, rows=20, offset=10)
    assert 0 < _kept().bytes <= 10 << 10
    assert len(_kept()) < 20  # the least recently used went first


def test_a_held_part_is_read_in_chunks_of_the_merges_chunk_size(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    shard.append(updates([(r, "n", 0, 1) for r in range(1000)]))
    (ref,) = shard.inspect.state().trace[0].parts
    held = _kept().held(shard._blob.url, ref, 4 << 10)
    assert held is not None and len(held.chunks) > 4
    assert sum(c.num_rows for c in held.chunks) == 1000
    rows = [held.read_chunk(i).num_rows for i in range(len(held.chunks))]
    assert rows == [c.num_rows for c in held.chunks]
    assert all(c.min_time == 0 and c.max_time == 0 for c in held.chunks)


def test_a_lost_merge_forgets_the_parts_it_wrote(tmp_path, monkeypatch):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    _appends(shard, 8)
    written: list[str] = []
    real = cm.run_merge

    def run_then_lose(*args, **kwargs):
        result = real(*args, **kwargs)
        if not written:
            written.extend(result.written_keys)
            other = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
            other.compact()  # another compactor replaces the inputs first
        return result

    monkeypatch.setattr(cm, "run_merge", run_then_lose)
    report = shard._maybe_compact()
    assert report is not None and report.committed == 0
    assert written and not any(_kept()._memo.get((shard._blob.url, k)) for k in written)


def test_reads_never_use_kept_parts(tmp_path):
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    _appends(shard, 2)
    (path, *_) = _part_files(tmp_path / "s")
    os.remove(path)
    with pytest.raises(CorruptData, match="missing"):
        shard.snapshot()
    with pytest.raises(CorruptData, match="missing"):
        ps.open_shard(str(tmp_path / "s")).scan().to_arrow()


def test_spark_and_other_writers_keep_nothing(tmp_path):
    """Only the Python write path and compaction keep parts: a plain `write_part` does not."""
    from persistshard.core.storage.layout import new_id
    from persistshard.core.storage.parts import write_part

    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False, inline_bytes=0)
    write_part(shard._blob, new_id(), updates([(1, "a", 0, 1)]), config=shard.config)
    assert len(_kept()) == 0
