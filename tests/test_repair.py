"""`persistshard repair`: a shard whose newest consensus entries are unreadable (0 bytes, torn,
crc damage) is restored to its last valid version; nothing readable is ever dropped; every
error that meets such an entry names the command.

The damaged entries are made by hand here (what a disk that lied about a sync, or damaged the
bytes, leaves); `tests/test_crash.py` shows a crash on a store that honours fsync never leaves
one.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.cli import main
from persistshard.core.maintenance.repair import repair


def _shard(tmp_path, appends: int = 3) -> tuple[str, ps.Shard]:
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    for i in range(appends):
        shard.append(pa.table({"id": [i]}))
    return location, shard


def _entry(location: str, version: int) -> str:
    return os.path.join(location, "consensus", f"v{version:020d}.json")


def _damage(path: str, how: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    if how == "empty":
        data = b""
    elif how == "torn":
        data = data[: len(data) // 2]
    else:  # crc: flip one byte of the body, keep the length
        i = len(data) - 5
        data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["empty", "torn", "crc"])
def test_damaged_newest_entry_is_named_then_dropped(tmp_path, capsys, how):
    """Reads fail with CorruptData naming `persistshard repair`; the dry run names the entry
    and changes nothing (exit 1); --apply drops it, and the shard reads as of version 2 and
    takes new commits."""
    location, _ = _shard(tmp_path)
    before = ps.open_shard(location).snapshot(1)
    _damage(_entry(location, 3), how)
    with pytest.raises(ps.CorruptData, match="persistshard repair") as err:
        ps.open_shard(location).snapshot()
    assert err.value.file == "consensus/v00000000000000000003.json"
    assert main(["inspect", location]) == 2
    assert "persistshard repair" in capsys.readouterr().err

    assert main(["repair", location]) == 1
    out = capsys.readouterr().out
    assert "would drop version 3" in out and "restores  version 2 (upper 2)" in out
    assert "dry run" in out
    assert os.path.getsize(_entry(location, 3)) < 10_000  # still there

    assert main(["repair", location, "--apply", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["applied"] and [d["version"] for d in report["dropped"]] == [3]
    assert report["valid_version"] == 2
    fresh = ps.open_shard(location)
    assert fresh.inspect.state().version == 2 and fresh.upper == 2
    assert fresh.snapshot(1).equals(before)
    assert fresh.verify().ok
    fresh.append(pa.table({"id": [7]}))
    assert fresh.inspect.state().version == 3 and fresh.upper == 3
    assert main(["repair", location]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_several_unreadable_newest_entries_go_newest_first(tmp_path):
    location, _ = _shard(tmp_path, appends=5)
    _damage(_entry(location, 5), "empty")
    _damage(_entry(location, 4), "torn")
    report = repair(ps.open_shard(location)._machine, apply=True)
    assert [d.version for d in report.dropped] == [5, 4]
    assert all("header" in d.problem or "bytes" in d.problem for d in report.dropped)
    assert ps.open_shard(location).inspect.state().version == 3


def test_damage_below_a_readable_entry_is_refused_and_changes_nothing(tmp_path, capsys):
    """An unreadable entry under a readable newest one is not a torn write: repair drops
    nothing (a readable, possibly acknowledged commit is never dropped) and says to restore
    from a backup."""
    location, _ = _shard(tmp_path)
    _damage(_entry(location, 2), "crc")
    listing = sorted(os.listdir(os.path.join(location, "consensus")))
    with pytest.raises(ps.CorruptData, match="backup"):
        repair(ps.open_shard(location)._machine, apply=True)
    assert sorted(os.listdir(os.path.join(location, "consensus"))) == listing
    assert main(["repair", location, "--apply"]) == 2
    assert "backup" in capsys.readouterr().err


def test_a_healthy_shard_needs_nothing_and_an_empty_place_is_no_shard(tmp_path, capsys):
    _, shard = _shard(tmp_path)
    report = repair(shard._machine, apply=True)
    assert not report.needed and not report.applied and report.valid_version == 3
    assert main(["repair", str(tmp_path / "nothing")]) == 2
    assert "NoShard" in capsys.readouterr().err


def test_every_reader_of_the_log_names_repair(tmp_path):
    """history, gc and verify meet the damaged entry through the state machine."""
    location, _ = _shard(tmp_path)
    _damage(_entry(location, 3), "torn")
    fresh = ps.open_shard(location)
    for call in (fresh.history, fresh.gc, fresh.verify, lambda: fresh.upper):
        with pytest.raises(ps.CorruptData, match="persistshard repair"):
            call()


def test_a_whole_entry_of_a_kind_this_version_does_not_know_is_never_dropped(tmp_path):
    """The newest entry's bytes are whole (its checksum holds) but its commit is of a kind
    this version cannot read (a newer library's commit kind): reading fails, and repair must
    refuse rather than drop what may be an acknowledged commit of that newer writer."""
    from persistshard.core.statemachine.encoding import ENTRY_MAGIC, seal, unseal

    location, _ = _shard(tmp_path)
    path = _entry(location, 3)
    with open(path, "rb") as f:
        header, _, sealed = f.read().partition(b"\n")
    body = json.loads(unseal(ENTRY_MAGIC, sealed, "entry", path, None))
    body["commit"]["kind"] = "a_kind_from_a_newer_version"
    with open(path, "wb") as f:
        f.write(header + b"\n" + seal(ENTRY_MAGIC, json.dumps(body).encode()))
    listing = sorted(os.listdir(os.path.join(location, "consensus")))
    with pytest.raises(ps.CorruptData):
        ps.open_shard(location).snapshot()
    with pytest.raises(ps.CorruptData, match="newer persistshard"):
        repair(ps.open_shard(location)._machine, apply=True)
    assert sorted(os.listdir(os.path.join(location, "consensus"))) == listing
