"""One configuration per shard (`persistshard.core.config`): every route gives the same knobs,
storage options carry storage options only, the environment is read when a configuration is
built (never at import), the clock is injected, and the conformance command passes its target
without the environment."""

from __future__ import annotations

import os
import pickle
import re
import sys
from typing import Any

import pyarrow as pa
import pytest
from conformance_helpers import Clock

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.core.config import INLINE_BYTES_ENV, KNOBS, ShardConfig
from persistshard.core.shard import ShardAddress
from persistshard.core.storage.layout import id_time_ms
from persistshard.core.storage.parts import open_part
from persistshard.datasource.options import ReadOptions, WriteOptions
from persistshard.errors import InvalidOption

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_knob_has_a_default_a_doc_and_a_readme_row():
    """A knob is declared once, with its doc; the README's table lists exactly the knobs."""
    assert KNOBS and all(doc and default is not None for default, doc in KNOBS.values())
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = readme[readme.index("| knob | meaning | default |") :]
    table = table[: table.index("\n\n")]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(KNOBS)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"chunk_bytes": 4096}, 4096),  # Python argument
        ({"chunk_bytes": "4096"}, 4096),  # Spark, SQL, CLI: strings
        ({"CHUNK_BYTES": " 4096 "}, 4096),  # Spark lower-cases; names are case-insensitive
        ({"chunk_bytes": None}, ShardConfig().chunk_bytes),  # None: the default
        ({}, ShardConfig().chunk_bytes),
    ],
)
def test_one_parser_for_every_route(options, expected):
    assert ShardConfig.from_options(options, env=False).chunk_bytes == expected


@pytest.mark.parametrize("value", ["", "2k", "1e3", "10_000", "1.5", True, 1.5, -1, "-1", 0])
def test_a_bad_value_is_invalid_option_naming_the_knob(value):
    with pytest.raises(InvalidOption, match=r"^InvalidOption: option chunk_bytes "):
        ShardConfig.from_options({"chunk_bytes": value}, prefix="option ", env=False)


def test_seconds_take_fractions_and_integers_refuse_them():
    config = ShardConfig.from_options({"commit_backoff_seconds": "0.5"}, env=False)
    assert config.commit_backoff_seconds == 0.5
    assert ShardConfig.from_options({"commit_deadline_seconds": 3}).commit_deadline_seconds == 3.0
    with pytest.raises(InvalidOption, match=r"commit_backoff_seconds '-0\.5' must not be negative"):
        ShardConfig.from_options({"commit_backoff_seconds": "-0.5"})
    assert ShardConfig(inline_bytes=1).replace(inline_cap=7) == ShardConfig(
        inline_bytes=1, inline_cap=7
    )
    with pytest.raises(InvalidOption, match="clock 5 is not callable"):
        ShardConfig().replace(clock=5)


def test_the_environment_is_read_when_a_configuration_is_built(tmp_path, monkeypatch):
    """``PERSISTSHARD_INLINE_BYTES`` is read by the parser, each time: setting it after the
    package was imported changes the next shard, and a configuration built by hand, or a
    knob given explicitly, does not read it."""
    monkeypatch.setenv(INLINE_BYTES_ENV, "123")
    assert ps.open_shard(str(tmp_path / "a")).config.inline_bytes == 123
    assert ps.open_shard(str(tmp_path / "b"), inline_bytes=7).config.inline_bytes == 7
    assert ShardConfig().inline_bytes == 4096
    assert ps.open_shard(str(tmp_path / "c"), config=ShardConfig()).config.inline_bytes == 4096
    monkeypatch.delenv(INLINE_BYTES_ENV)
    assert ps.open_shard(str(tmp_path / "d")).config.inline_bytes == 4096
    monkeypatch.setenv(INLINE_BYTES_ENV, "many")
    with pytest.raises(InvalidOption, match=f"environment variable {INLINE_BYTES_ENV}"):
        ps.open_shard(str(tmp_path / "e"))


def test_storage_options_carry_storage_options_only(tmp_path):
    """Knobs and the consensus URL travel beside the storage options, never inside them."""
    url = f"sqlite:///{tmp_path}/log.db"
    shard = ps.open_shard(
        str(tmp_path / "s"), consensus=url, inline_bytes=0, chunk_bytes=4096, auto_mkdir=True
    )
    assert shard.address.storage_options == {"auto_mkdir": True}
    assert (shard.address.consensus, shard.config.chunk_bytes) == (url, 4096)
    shard.append(pa.table({"id": list(range(3000))}))
    again = pickle.loads(pickle.dumps(shard.address)).open()  # as a Spark task gets it
    assert again.config == shard.config and again.snapshot().num_rows == 3000
    (ref,) = again.inspect.state().parts()
    assert ref.inline is None and len(open_part(again._blob, ref).chunks) > 1


def test_spark_and_sql_options_give_the_configuration_and_the_storage_options_apart():
    options = {
        "path": "options-only/s",
        "chunk_bytes": "4096",
        "consensus": "sqlite:///x.db",
        "storage.anon": "true",
    }
    for parsed in (WriteOptions.parse(options), ReadOptions.parse(options)):
        assert parsed.storage_options == {"anon": True}
        assert parsed.address.consensus == "sqlite:///x.db"
        assert parsed.address.config.chunk_bytes == 4096
    with pytest.raises(InvalidOption, match=r"^InvalidOption: option chunk_bytes '0' must be"):
        WriteOptions.parse({**options, "chunk_bytes": "0"})


def test_an_address_never_shows_secrets():
    address = ShardAddress(
        "s3://b/t", {"secret": "hunter2"}, "postgresql://u:pw@db/x", ShardConfig()
    )
    assert "hunter2" not in repr(address) and "pw@" not in repr(address)
    assert "secret" in repr(address)


def test_the_injected_clock_stamps_ids_commits_and_leases(tmp_path):
    """Every time a shard handle reads is its configuration's clock: write ids, commit
    times, rollup keys and reader holds. (Without the injection, all of them would carry
    the wall clock, a day away.)"""
    clock = Clock()
    clock.ms -= 24 * 3600 * 1000
    shard = ps.open_shard(str(tmp_path / "s"), clock=clock.now, maintenance=False)
    for i in range(16):  # up to the first rollup
        shard.append(pa.table({"id": [i]}))
        clock.advance(1)
    assert id_time_ms(shard._machine.new_write_id()) == clock.ms
    entry_times = [h["at_ms"] for h in shard.history()]
    assert entry_times and all(clock.ms - 20 <= t <= clock.ms for t in entry_times)
    rollups = [m.key for m in shard._blob.list("rollups/")]
    assert rollups and all(
        abs(id_time_ms(k.rsplit("-", 1)[1][:-5]) - clock.ms) < 20 for k in rollups
    )
    hold = shard.register_reader("r", lease_seconds=60)
    assert hold.expires_ms == clock.ms + 60_000


def test_cli_set_reaches_the_configuration(tmp_path, capsys):
    """``--set`` is the CLI's route to the knobs: a compaction with small chunks writes
    parts of many chunks; an unknown knob or a bad value is refused in one line."""
    location = str(tmp_path / "s")
    writer = ps.open_shard(location, maintenance=False, inline_bytes=0)
    for t in range(3):
        writer.append(pa.table({"id": list(range(t * 2000, (t + 1) * 2000))}))
    assert cli(["compact", location, "--set", "chunk_bytes=4096"]) == 0
    shard = ps.open_shard(location)
    (ref,) = shard.inspect.state().parts()
    assert len(open_part(shard._blob, ref).chunks) > 3
    capsys.readouterr()
    assert cli(["inspect", location, "--set", "no_such_knob=1"]) == 2
    assert capsys.readouterr().err.startswith("InvalidOption: --set takes NAME=VALUE")
    assert cli(["inspect", location, "--set", "chunk_bytes=big"]) == 2
    assert capsys.readouterr().err.startswith("InvalidOption: --set chunk_bytes 'big' is not")


def test_conformance_takes_its_target_without_the_environment(tmp_path, monkeypatch):
    """The command hands pytest a plugin object carrying the location and storage options;
    nothing is put in ``os.environ`` (a child process would inherit credentials) and no
    module is reloaded."""
    import pytest as real_pytest

    from persistshard.conformance.target import ConformanceTarget

    seen: list[Any] = []
    real_main = real_pytest.main

    def main(args: list[str], plugins: Any = ()) -> Any:
        seen.append((plugins, dict(os.environ)))
        return real_main(args, plugins=plugins)

    monkeypatch.setattr(real_pytest, "main", main)
    # The inner pytest puts the repository root on sys.path and imports the suite under a
    # name of its own: both are undone after this test (no top-level twin of `core` stays).
    monkeypatch.setattr(sys, "path", list(sys.path))
    modules = set(sys.modules)
    before = dict(os.environ)
    place = str(tmp_path / "place")
    try:
        code = cli(["conformance", place, "-k", "repeated_conditional_put", "--storage-option",
                    "auto_mkdir=true"])  # fmt: skip
    finally:
        for name in set(sys.modules) - modules:
            path = getattr(sys.modules[name], "__file__", None) or ""
            if not name.startswith("persistshard") and os.path.realpath(path).startswith(ROOT):
                del sys.modules[name]
    assert code == 0
    ((plugins, environment),) = seen
    (target,) = [p for p in plugins if isinstance(p, ConformanceTarget)]
    assert (target.location, target.storage_options) == (place, {"auto_mkdir": True})
    assert not [k for k in environment if k.startswith("PERSISTSHARD_CONFORMANCE")]
    assert not [k for k, v in environment.items() if "auto_mkdir" in v]
    nested = {"PYTEST_CURRENT_TEST"}  # the inner pytest's own
    assert {k: v for k, v in environment.items() if k not in nested} == {
        k: v for k, v in before.items() if k not in nested
    }
