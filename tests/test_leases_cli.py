"""The command line around leases and cleanup: `persistshard conformance` removes what it
wrote and refuses to run inside a shard; `persistshard inspect` shows the metadata of a shard
whose part is damaged."""

from __future__ import annotations

import json
import os

from conformance_helpers import updates

import persistshard as ps
from persistshard.cli import main as cli


def test_conformance_cleans_up_after_itself(tmp_path, capsys):
    """Only what was there before is left at the location, and nothing in Hypothesis's home
    directory (by default ``.hypothesis`` where the user ran the command: its example database
    and caches), which is the same afterwards."""
    from hypothesis import configuration

    place = tmp_path / "place"
    (place / "conformance-someone-else").mkdir(parents=True)
    (place / "notes.txt").write_text("mine")
    before = configuration.storage_directory(intent_to_write=False).home_directory
    home = tmp_path / "where-the-user-ran-it" / ".hypothesis"
    configuration.set_hypothesis_home_dir(home)
    try:
        code = cli(["conformance", str(place), "--json"])
        assert configuration.storage_directory(intent_to_write=False).home_directory == home
    finally:
        configuration.set_hypothesis_home_dir(before)
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["ok"], summary
    assert summary["passed"] >= 15
    # Only what was there before: the suite's sub-locations (30 or so) are gone.
    assert sorted(os.listdir(place)) == ["conformance-someone-else", "notes.txt"]
    assert not home.exists(), sorted(str(p) for p in home.rglob("*"))


def test_conformance_refuses_to_run_inside_a_shard(tmp_path, capsys):
    location = str(tmp_path / "shard")
    shard = ps.open_shard(location)
    shard.append(updates([(1, "a", 0, 1)]))
    before = sorted(os.listdir(location))
    for where in (location, os.path.join(location, "parts")):
        assert cli(["conformance", where]) == 2
        err = capsys.readouterr().err
        assert "refusing to run the conformance suite" in err and "is a shard" in err, err
    assert sorted(os.listdir(location)) == before
    assert shard.verify().ok


def test_inspect_shows_the_metadata_when_a_part_is_damaged(tmp_path, capsys):
    location = str(tmp_path / "shard")
    shard = ps.open_shard(location, inline_bytes=0)  # a part file to damage
    shard.append(updates([(1, "a", 0, 1), (2, "b", 0, 1)]))
    shard.append(updates([(3, "c", 1, 1)]))
    key = shard.inspect.state().trace[0].parts[0].key
    path = os.path.join(location, key)
    data = bytearray(open(path, "rb").read())
    del data[-20:]  # a truncated part: its footer is gone
    open(path, "wb").write(bytes(data))
    assert cli(["inspect", location]) == 0
    out = capsys.readouterr().out
    assert "upper     2" in out and "damaged" in out and "persistshard verify" in out, out
    assert cli(["inspect", location, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["upper"] == 2 and info["trace_batches"] == 2 and info["problems"]
