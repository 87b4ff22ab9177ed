"""What a new user of the command line sees: help for each command, the version, counts in
the right number, and storage failures as one `StorageError` line (exit 2), never a raw
`OSError` or botocore traceback."""

from __future__ import annotations

import errno
import re
from unittest import mock

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard import errors
from persistshard.cli import COMMANDS, cmd_conformance, main, plural
from persistshard.core.storage.blob import FsspecBlob


def make(tmp_path, appends: int = 3, **options: int) -> str:
    """A shard of ``appends`` one-row appends; ``options`` go to `open_shard`."""
    location = str(tmp_path / "s")
    shard = ps.open_shard(location, **options)
    for t in range(appends):
        shard.append(pa.table({"id": [t], "_time": [t], "_diff": [1]}))
    return location


def test_help_describes_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for name in [*COMMANDS, "conformance"]:
        line = re.search(rf"^\s+{name}\s*\n?\s+(\S.*)$", out, re.MULTILINE)
        assert line is not None and len(line.group(1)) > 20, f"{name} has no help:\n{out}"
    assert "--version" in out


@pytest.mark.parametrize("name", [*COMMANDS, "conformance"])
def test_each_command_help_says_what_it_does(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    doc = " ".join((COMMANDS.get(name) or cmd_conformance).__doc__.split())
    assert doc.split(":")[0] in " ".join(out.split())
    assert "--storage-option" in out and "--json" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"persistshard {ps.__version__}"


def test_plural():
    assert [plural(n, "part") for n in (0, 1, 2)] == ["0 parts", "1 part", "2 parts"]
    assert plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "log entry", "log entries") == "3 log entries"


#: A count of 1 followed by a plural noun: "1 parts", "1 batches", "1 updates".
ONE_PLURAL = re.compile(
    r"(?<![\d.])1 (parts|batches|updates|merges|nulls|problems|entries|files)\b"
)


def test_counts_of_one_are_singular(tmp_path, capsys):
    location = make(tmp_path, appends=1)
    assert main(["inspect", location]) == 0
    out = capsys.readouterr().out
    assert "1 batch, 1 part, 1 update" in out
    assert main(["verify", location]) == 0
    assert main(["compact", location]) == 0
    assert main(["gc", location]) == 0
    out += capsys.readouterr().out
    assert "1 part," in out
    assert not ONE_PLURAL.search(out), out


def test_no_shard_is_a_persistshard_error(tmp_path, capsys):
    from persistshard import cli

    assert cli.NoShard is errors.NoShard and issubclass(errors.NoShard, errors.PersistShardError)
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("NoShard: no shard at") and out == ""


def _refuse_writes(self, key, data):
    raise PermissionError(errno.EACCES, "Permission denied", key)


@pytest.mark.parametrize(("command", "doing"), [("compact", "compact"), ("gc", "collect")])
def test_maintenance_on_a_read_only_shard_is_a_storage_error(tmp_path, capsys, command, doing):
    """Writes refused as on a read-only directory (simulated: the tests may run as root, who
    may write anywhere): one line naming the cause and the fix, exit 2, shard unchanged."""
    location = make(tmp_path, inline_bytes=0)  # part files, for gc to be refused deleting
    if command == "gc":
        ps.open_shard(location).compact()  # so that gc has parts to delete
    before = ps.open_shard(location).inspect.state()
    args = [command, location] + (
        ["--apply", "--retention-seconds", "0"] if command == "gc" else []
    )
    with (
        mock.patch.object(FsspecBlob, "put", _refuse_writes),
        mock.patch.object(FsspecBlob, "put_if_absent", _refuse_writes),
        mock.patch.object(FsspecBlob, "delete", lambda self, key: _refuse_writes(self, key, b"")),
    ):
        code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith(f"StorageError: cannot {doing}"), err
    assert "PermissionError: Permission denied" in err and "grant write access" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert ps.open_shard(location).inspect.state() == before


def test_missing_credentials_are_a_storage_error(tmp_path, capsys):
    botocore = pytest.importorskip("botocore.exceptions")
    location = make(tmp_path)

    def no_credentials(self, key):
        raise botocore.NoCredentialsError()

    with mock.patch.object(FsspecBlob, "get", no_credentials):
        assert main(["inspect", location]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("StorageError: cannot read the shard at"), err
    assert "NoCredentialsError: Unable to locate credentials" in err
    assert "--storage-option" in err and "Traceback" not in err and out == ""


def test_a_bug_is_not_disguised_as_a_storage_error(tmp_path):
    location = make(tmp_path)
    with mock.patch.object(FsspecBlob, "get", lambda self, key: 1 / 0):
        with pytest.raises(ZeroDivisionError):
            main(["inspect", location])


def test_compact_on_a_really_read_only_directory(tmp_path, capsys):
    """The same on a directory the process cannot write (mode bits, or immutable as root)."""
    from ux_helpers import probe_read_only, read_only

    location = make(tmp_path)
    probe_read_only(location)
    before = ps.open_shard(location).inspect.state()
    with read_only(location):
        assert main(["inspect", location]) == 0  # reading needs read access only
        capsys.readouterr()
        assert main(["compact", location]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("StorageError: cannot compact the shard at"), err
    assert "grant write access" in err and "Traceback" not in err
    assert ps.open_shard(location).inspect.state() == before


def test_a_commit_refused_by_a_read_only_directory_is_not_indeterminate(tmp_path, capsys):
    """Dropping a hold is a commit; refused for lack of access it did not land, so the CLI
    says StorageError and what to fix, not Indeterminate's "may have been applied"."""
    from ux_helpers import probe_read_only, read_only

    location = make(tmp_path)
    ps.open_shard(location).register_reader("dash")
    probe_read_only(location)
    before = ps.open_shard(location).inspect.state()
    with read_only(location):
        assert main(["holds", location, "--expire", "dash"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("StorageError: cannot change the shard's holds at"), err
    assert "Indeterminate" not in err and "grant write access" in err
    assert ps.open_shard(location).inspect.state() == before
