"""gc and the temporary files of puts that never finished (a process killed between writing
``.tmp-...`` and publishing it): collected once older than the retention floor, never before,
and never anything a version references."""

from __future__ import annotations

import os
import time

import pyarrow as pa
from conformance_helpers import tick

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.core.storage.blob import temporary_name, temporary_time_ms

HOUR = 3600


def test_leftover_temporary_files_are_collected_after_the_floor(tmp_path, capsys, clock):
    location = tmp_path / "shard"
    shard = ps.open_shard(str(location), clock=clock.now)
    for t in range(3):
        shard.append(pa.table({"id": [t], "_time": [t], "_diff": [1]}))
    part_dir = location / shard.inspect.state().trace[0].parts[0].key.rsplit("/", 1)[0]
    old_in_parts = part_dir / temporary_name()
    old_in_log = location / "consensus" / temporary_name()
    young = location / "rollups" / temporary_name()
    legacy = location / "consensus" / ".tmp-0123456789abcdef"  # an older naming: age from mtime
    for path in (old_in_parts, old_in_log, young, legacy):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    two_hours_ago = time.time() - 2 * HOUR
    for path in (old_in_parts, old_in_log, legacy):
        os.utime(path, (two_hours_ago, two_hours_ago))
    assert [m.key for m in shard._blob.list("consensus/")] == [
        m.key for m in shard._blob.list("consensus/") if ".tmp-" not in m.key
    ]
    snapshot = shard.snapshot()

    plan = shard.gc(dry_run=True)
    rel = {str(p.relative_to(location)) for p in (old_in_parts, old_in_log, legacy)}
    assert set(plan.temporary) == rel and plan.temporary_bytes == 3 * len(b"partial")
    assert all(p.exists() for p in (old_in_parts, old_in_log, young, legacy))

    assert cli(["gc", str(location), "--apply"]) == 0
    assert "3 temporary files" in capsys.readouterr().out
    assert not any(p.exists() for p in (old_in_parts, old_in_log, legacy))
    assert young.exists()
    assert ps.open_shard(str(location), clock=clock.now).snapshot() == snapshot
    assert ps.open_shard(str(location), clock=clock.now).verify().ok

    tick(shard, clock, 2 * HOUR * 1000)
    later = shard.gc(dry_run=False)
    assert later.temporary == [str(young.relative_to(location))] and not young.exists()


def test_temporary_names_carry_their_time():
    before = int(time.time() * 1000)
    name = temporary_name()
    assert name.startswith(".tmp-")
    assert before <= (temporary_time_ms(f"parts/x/{name}") or 0) <= int(time.time() * 1000)
    assert temporary_time_ms("parts/x/y.part") is None
    assert temporary_time_ms(".tmp-zzzz") is None


def test_a_put_that_fails_cleans_its_temporary_file(tmp_path, monkeypatch):
    blob = ps.open_shard(str(tmp_path / "s"))._blob

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    monkeypatch.setattr(os, "link", broken_replace)  # a put of a new key links first
    try:
        blob.put("parts/w/a.part", b"data")
    except OSError:
        pass
    monkeypatch.undo()
    assert blob.list_temporary() == [] and blob.get("parts/w/a.part") is None
