"""Local puts are durable before they return: file data synced before the name is published,
the directory entry (and every directory the put created) synced after it.

The order is checked by recording every ``os.fsync``, ``os.link`` and ``os.replace`` a put
makes (the path of each synced descriptor is read back from ``/proc/self/fd``). What these
syscalls buy on a crash is checked by the page-cache model in ``tests/test_crash.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

from persistshard.core.storage import blob as blob_module
from persistshard.core.storage.blob import TMP_PREFIX, open_blob

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads descriptor paths from /proc/self/fd"
)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every fsync (with the synced path), link and replace, in order."""
    out: list[tuple[str, ...]] = []
    real_fsync, real_link, real_replace = os.fsync, os.link, os.replace

    def fsync(fd: int) -> None:
        out.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def link(src: str, dst: str) -> None:
        real_link(src, dst)
        out.append(("link", src, dst))

    def replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        out.append(("replace", src, dst))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "replace", replace)
    return out


def _is_tmp(path: str) -> bool:
    return os.path.basename(path).startswith(TMP_PREFIX)


def test_put_syncs_data_before_link_and_directories_after(tmp_path, events):
    """A put into two new directories: data of the temporary file synced, then linked to the
    key, then the key's directory and the parent of each directory it created synced (these
    concurrently). Nothing else is synced, and the temporary file is gone."""
    root = tmp_path / "shard"
    root.mkdir()
    blob = open_blob(str(root))
    blob.put("parts/w1/p.part", b"payload")
    key = str(root / "parts" / "w1" / "p.part")
    assert events[0][0] == "fsync" and _is_tmp(events[0][1])
    assert events[1] == ("link", events[0][1], key)
    assert sorted(events[2:]) == [  # synced concurrently: in any order, all before returning
        ("fsync", str(root)),
        ("fsync", str(root / "parts")),
        ("fsync", str(root / "parts" / "w1")),
    ]
    assert os.listdir(root / "parts" / "w1") == ["p.part"]
    assert blob.get("parts/w1/p.part") == b"payload"


def test_put_if_absent_syncs_data_before_link_and_directory_after(tmp_path, events):
    """An exclusive create in an existing directory: data synced, linked, directory synced
    (no parent: the directory existed). A lost create publishes nothing and syncs no
    directory."""
    (tmp_path / "consensus").mkdir()
    blob = open_blob(str(tmp_path))
    assert blob.put_if_absent("consensus/v1.json", b"one")
    key = str(tmp_path / "consensus" / "v1.json")
    assert [e[0] for e in events] == ["fsync", "link", "fsync"]
    assert _is_tmp(events[0][1]) and events[1] == ("link", events[0][1], key)
    assert events[2] == ("fsync", str(tmp_path / "consensus"))
    events.clear()
    assert not blob.put_if_absent("consensus/v1.json", b"two")
    assert [e[0] for e in events] == ["fsync"]  # the loser's data only; no link, no dir sync
    assert blob.get("consensus/v1.json") == b"one"
    assert os.listdir(tmp_path / "consensus") == ["v1.json"]


def test_put_over_an_existing_key_replaces_after_the_data_sync(tmp_path, events):
    """Overwriting (the HEAD hint) falls back from link to replace: still data synced before
    the name changes, and the directory synced after."""
    blob = open_blob(str(tmp_path))
    blob.put("consensus/HEAD", b"1")
    events.clear()
    blob.put("consensus/HEAD", b"4")
    key = str(tmp_path / "consensus" / "HEAD")
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert _is_tmp(events[0][1]) and events[1] == ("replace", events[0][1], key)
    assert events[2] == ("fsync", str(tmp_path / "consensus"))
    assert blob.get("consensus/HEAD") == b"4"


def test_a_shard_commit_syncs_every_object_it_references_first(tmp_path, events):
    """One append through the public API that writes a part file (inline writes off): the
    part's name is synced (its directory) before the consensus entry that references it is
    even written."""
    import pyarrow as pa

    import persistshard as ps

    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0)
    shard.append(pa.table({"id": [1]}))
    names = [e for e in events if e[0] in ("link", "replace")]
    synced = [e[1] for e in events if e[0] == "fsync"]
    part = next(e for e in names if e[2].endswith(".part"))
    entry = next(e for e in names if "/consensus/v" in e[2])
    part_dir_sync = synced.index(os.path.dirname(part[2]))
    assert events.index(("fsync", os.path.dirname(part[2]))) < events.index(entry)
    assert part_dir_sync < synced.index(os.path.dirname(entry[2]))


def test_sync_switch_is_on(tmp_path):
    """The benchmark's switch is on in every other use."""
    assert blob_module.SYNC_LOCAL is True


def test_the_head_hint_and_the_benchmark_option_skip_syncs(tmp_path, events):
    """``consensus/HEAD`` (a hint) is published without any sync, and so is every put of a
    blob opened with the benchmark-only ``unsafe_no_sync`` option; a plain blob still syncs."""
    root = tmp_path / "shard"
    root.mkdir()
    open_blob(str(root)).put("consensus/v1.json", b"entry")
    events.clear()
    open_blob(str(root)).put_hint("consensus/HEAD", b"1")
    open_blob(str(root)).put_hint("consensus/HEAD", b"4")  # over the old hint: a replace
    unsynced = open_blob(str(root), **{blob_module.NO_SYNC_OPTION: "true"})
    unsynced.put("parts/w1/p.part", b"payload")
    assert unsynced.put_if_absent("parts/w1/q.part", b"payload")
    assert [e[0] for e in events] == ["link", "replace", "link", "link"]
    assert (root / "consensus" / "HEAD").read_bytes() == b"4"
    open_blob(str(root), **{blob_module.NO_SYNC_OPTION: "false"}).put("parts/w2/p.part", b"x")
    assert any(e[0] == "fsync" for e in events)
