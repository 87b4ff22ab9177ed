"""The command line's machine-readable output (--json on every command) and its progress
bars: shown on a terminal, silent otherwise, never on stdout."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.cli import main as cli


def make(tmp_path) -> str:
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    for t in range(6):
        shard.append(pa.table({"id": [t, 100 + t], "_time": [t, t], "_diff": [1, 1]}))
    shard.advance_since(4)
    return location


@pytest.mark.parametrize("command", ["inspect", "history", "verify", "compact", "gc"])
def test_json_on_every_command(tmp_path, capsys, command):
    location = make(tmp_path)
    assert cli([command, location, "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err == ""
    expected_key = {
        "inspect": "upper",
        "verify": "ok",
        "compact": "batches_after",
        "gc": "temporary",
    }.get(command)
    if command == "history":
        assert isinstance(doc, list) and doc[0]["version"] == 1
    else:
        assert expected_key in doc


class FakeTTY:
    """A stderr that says it is a terminal and keeps what was written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("command", [["verify"], ["compact"], ["gc", "--apply"]])
def test_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch, command):
    location = make(tmp_path)
    extra = ["--retention-seconds", "0"] if command[0] == "gc" else []
    assert cli([command[0], location, *command[1:], *extra]) == 0
    _, quiet_err = capsys.readouterr()
    assert quiet_err == ""  # not a terminal: no progress at all

    location = make(tmp_path / "again")
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    assert cli([command[0], location, *command[1:], *extra, "--json"]) == 0
    out = capsys.readouterr().out
    json.loads(out)  # stdout stays machine-readable
    assert command[0] in tty.text and "\r" in tty.text, tty.text


def test_conformance_json_on_local_files(tmp_path, capsys):
    """`persistshard conformance` runs the storage contract and the model on local files and
    reports each test in JSON."""
    code = cli(["conformance", str(tmp_path / "place"), "--json"])
    out = capsys.readouterr().out
    summary = json.loads(out)
    assert code == 0, summary
    assert summary["ok"] and summary["failed"] == 0 and summary["passed"] >= 15
    names = {t["test"] for t in summary["tests"]}
    assert {"TestBlob::test_put_if_absent_race", "TestConsensus::test_cas_race"} <= names
    assert "TestShardModel::test_model" in names


def test_conformance_prints_no_pytest_warnings(tmp_path):
    """`persistshard conformance`, in a fresh interpreter as a user runs it, prints the
    suite's results without pytest's warnings summary: the command must not import a module
    pytest loads as a plugin (hypothesis) before it starts pytest, which then could not
    rewrite its asserts (PytestAssertRewriteWarning)."""
    import subprocess

    run = "import sys; from persistshard.cli import main; sys.exit(main(sys.argv[1:]))"
    where = str(tmp_path / "place")
    out = subprocess.run(
        [sys.executable, "-c", run, "conformance", where, "-k", "atomic_create"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "passed" in out.stdout, out.stdout
    assert "Warning" not in out.stdout + out.stderr, out.stdout + out.stderr
