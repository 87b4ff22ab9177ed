"""The command line: every subcommand on a small shard, and its exit codes."""

from __future__ import annotations

import json

import pyarrow as pa

import persistshard as ps
from persistshard.cli import main
from persistshard.core.shard import Inspect


def make(tmp_path, **options) -> str:
    """A shard of four appends, since 3; ``options`` go to `open_shard` (``inline_bytes=0``:
    every append writes a part file)."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, **options)
    for t in range(4):
        shard.append(pa.table({"id": [t, 100], "_time": [t, t], "_diff": [1, 1]}))
    shard.advance_since(3)
    return location


def test_inspect_history_verify(tmp_path, capsys):
    location = make(tmp_path)
    assert main(["inspect", location, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["upper"], info["since"], info["trace_batches"]) == (4, 3, 4)
    assert main(["history", location]) == 0
    out = capsys.readouterr().out.splitlines()[1:]  # under the column titles
    assert len(out) == 5 and "advance_since" in out[-1] and "upper 0 -> 1" in out[0]
    assert main(["verify", location]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")


def test_verify_fails_on_a_missing_part(tmp_path, capsys):
    location = make(tmp_path, inline_bytes=0)
    shard = ps.open_shard(location)
    shard._blob.delete(shard.inspect.state().trace[0].parts[0].key)
    assert main(["verify", location]) == 1
    assert "is missing" in capsys.readouterr().out


def test_compact_then_gc(tmp_path, capsys):
    location = make(tmp_path, inline_bytes=0)  # the compacted parts are files for gc
    assert main(["compact", location]) == 0
    assert "1 merge committed" in capsys.readouterr().out
    assert main(["gc", location]) == 0
    assert "dry run: nothing deleted" in capsys.readouterr().out
    before = {m.key for m in ps.open_shard(location)._blob.list("parts/")}
    assert main(["gc", location, "--apply", "--retention-seconds", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    after = {m.key for m in ps.open_shard(location)._blob.list("parts/")}
    assert set(report["parts"]) == before - after and report["parts"]
    snap = {r["id"]: r["_diff"] for r in ps.open_shard(location).snapshot().to_pylist()}
    assert snap == {0: 1, 1: 1, 2: 1, 3: 1, 100: 4}


def test_errors_exit_2_with_the_class_name(tmp_path, capsys, monkeypatch):
    location = make(tmp_path)

    def boom(self):
        raise ps.CorruptData("bad footer", file="x.part")

    monkeypatch.setattr(Inspect, "describe", boom)
    assert main(["inspect", location]) == 2
    assert capsys.readouterr().err.startswith("CorruptData: bad footer")


def test_holds_listed_and_expired_by_hand(tmp_path, capsys):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(pa.table({"id": [1], "_time": [0], "_diff": [1]}))
    shard.register_reader("dash", lease_seconds=600)
    assert main(["inspect", location]) == 0
    assert "hold      dash: since 0, lease" in capsys.readouterr().out
    assert main(["holds", location, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["readers"]["dash"]["since"] == 0
    assert main(["holds", location, "--expire", "nobody"]) == 1
    assert "no hold named 'nobody'" in capsys.readouterr().err
    assert main(["holds", location, "--expire", "dash"]) == 0
    assert "no reader holds" in capsys.readouterr().out
    assert shard.readers() == {}


def test_holds_lists_consumers_and_drops_one_inspect_shows_their_age(tmp_path, capsys, monkeypatch):
    from persistshard.core.storage import layout

    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    for t in range(3):
        shard.append(pa.table({"id": [t], "_time": [t], "_diff": [1]}))
    shard.register_reader("dash", lease_seconds=600)
    shard.consumer("nightly-etl").advance(2, expected=0)
    moved = shard.inspect.state().consumers["nightly-etl"].moved_ms
    monkeypatch.setattr(layout, "now_ms", lambda: moved + 3 * 3600 * 1000)  # 3 hours on
    assert main(["holds", location]) == 0
    out = capsys.readouterr().out
    assert "hold      dash: since 0" in out
    assert (
        "consumer  nightly-etl: position 2 (holds since below it, no lease), last moved "
        "3.0 h ago" in out
    )
    assert main(["inspect", location]) == 0
    assert "consumer  nightly-etl: position 2" in capsys.readouterr().out
    assert main(["inspect", location, "--json"]) == 0
    described = json.loads(capsys.readouterr().out)["consumers"]["nightly-etl"]
    assert described == {"position": 2, "moved_ms": moved, "age_ms": 3 * 3600 * 1000}
    assert main(["holds", location, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert set(listed["readers"]) == {"dash"} and set(listed["consumers"]) == {"nightly-etl"}
    assert main(["holds", location, "--drop", "nobody"]) == 1
    assert "no consumer named 'nobody'" in capsys.readouterr().err
    assert main(["holds", location, "--drop", "nightly-etl", "--expire", "dash"]) == 0
    assert "no reader holds or consumers" in capsys.readouterr().out
    assert shard.consumers() == {} and shard.readers() == {}
