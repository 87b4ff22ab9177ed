"""A storage refusal that is certain (permission denied, read-only, disk full) is
`StorageError` with nothing applied, logged once, never `Indeterminate` (issue 36, item 4);
a put whose own temporary file vanished is retried once or refused, never a raw
`FileNotFoundError` (item 2's last part).

Tests run as root, where a read-only directory is writable anyway: the refusals are injected
by a blob wrapper that raises exactly what the operating system raises."""

from __future__ import annotations

import errno
import logging
import os

import pyarrow as pa
import pytest

from persistshard.core.shard import Shard
from persistshard.core.storage import blob as blob_module
from persistshard.core.storage.blob import Blob, BlobWrapper
from persistshard.errors import Indeterminate, StorageError

REFUSALS = {
    "EROFS": lambda key: OSError(errno.EROFS, "Read-only file system", key),
    "EACCES": lambda key: PermissionError(errno.EACCES, "Permission denied", key),
    "ENOSPC": lambda key: OSError(errno.ENOSPC, "No space left on device", key),
}


class Refusing(BlobWrapper):
    """Every write is refused by the storage with ``error`` (reads work): a read-only mount,
    a directory without write permission, a full disk."""

    def __init__(self, inner: Blob, error: str) -> None:
        super().__init__(inner)
        self.make = REFUSALS[error]
        self.refused = 0

    def _refuse(self, key: str) -> OSError:
        self.refused += 1
        return self.make(key)

    def put(self, key: str, data: bytes) -> None:
        raise self._refuse(key)

    def put_hint(self, key: str, data: bytes) -> None:
        raise self._refuse(key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        raise self._refuse(key)

    def delete(self, key: str) -> None:
        raise self._refuse(key)


def store_errors(caplog) -> int:
    return sum("store error" in r.getMessage() for r in caplog.records)


@pytest.fixture
def existing(tmp_path) -> str:
    """A shard with a few versions, written before its storage turned read-only."""
    location = str(tmp_path / "shard")
    shard = Shard(location)
    for i in range(3):
        shard.compare_and_append(pa.table({"id": [i], "_time": [i], "_diff": [1]}), i, i + 1)
    return location


@pytest.mark.parametrize("error", sorted(REFUSALS))
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "parts"])
def test_append_on_refusing_storage_is_storage_error(existing, caplog, error, inline):
    """Before: ~1000 "store error" lines, then `Indeterminate` (inline) or a raw OSError."""
    caplog.set_level(logging.WARNING)
    blob = Refusing(Blob(existing), error)
    shard = Shard(existing, blob=blob, inline_bytes=None if inline else 0)
    with pytest.raises(StorageError) as info:
        shard.append(pa.table({"id": [9]}))
    assert not isinstance(info.value, Indeterminate)
    assert os.strerror(REFUSALS[error]("k").errno) in str(info.value)
    assert blob.refused <= 3 and store_errors(caplog) <= 3
    assert Shard(existing).upper == 3  # nothing applied


@pytest.mark.parametrize("error", ["EROFS", "EACCES"])
def test_first_write_on_refusing_storage_is_storage_error(tmp_path, caplog, error):
    caplog.set_level(logging.WARNING)
    location = str(tmp_path / "new")
    shard = Shard(location, blob=Refusing(Blob(location), error))
    with pytest.raises(StorageError):
        shard.append(pa.table({"id": [1]}))
    assert store_errors(caplog) <= 3


@pytest.mark.parametrize("error", ["EROFS", "ENOSPC"])
def test_compact_on_refusing_storage_is_storage_error(existing, error):
    """Before: a raw OSError."""
    shard = Shard(existing, blob=Refusing(Blob(existing), error))
    with pytest.raises(StorageError):
        shard.compact()
    assert Shard(existing).upper == 3


def test_put_whose_temporary_vanished_is_retried(tmp_path, monkeypatch):
    """gc (with a small retention) deleted a young ``.tmp-`` file between its write and its
    link: the put writes it again once; when it keeps vanishing, `StorageError`."""
    real_link = os.link
    vanish = {"times": 1}

    def link(src: str, dst: str) -> None:
        if vanish["times"] > 0 and os.path.basename(src).startswith(".tmp-"):
            vanish["times"] -= 1
            os.unlink(src)  # what gc did
        real_link(src, dst)

    monkeypatch.setattr(blob_module.os, "link", link)
    blob = Blob(str(tmp_path / "b"))
    blob.put_if_absent("consensus/v1", b"one")
    assert blob.get("consensus/v1") == b"one"
    vanish["times"] = 1
    blob.put("parts/p", b"part")
    assert blob.get("parts/p") == b"part"
    vanish["times"] = 10
    with pytest.raises(StorageError, match="temporary"):
        blob.put_if_absent("consensus/v2", b"two")
    assert blob.get("consensus/v2") is None
    shard_location = str(tmp_path / "shard")
    vanish["times"] = 1
    Shard(shard_location, inline_bytes=0).append(pa.table({"id": [1]}))
    assert Shard(shard_location).upper == 1


class TimingOut(BlobWrapper):
    """The next ``reads`` reads time out (the answer never came), as on a flaky network;
    writes work."""

    def __init__(self, inner: Blob, reads: int) -> None:
        super().__init__(inner)
        self.reads = reads

    def _maybe_time_out(self, key: str) -> None:
        if self.reads > 0:
            self.reads -= 1
            raise TimeoutError(f"injected: reading {key} timed out")

    def get(self, key: str) -> bytes | None:
        self._maybe_time_out(key)
        return self.inner.get(key)

    def list(self, prefix: str = "") -> list:
        self._maybe_time_out(prefix)
        return self.inner.list(prefix)


@pytest.mark.parametrize("reads", [2, 3, 5])
def test_a_timeout_before_any_attempt_is_a_determinate_storage_error(existing, reads):
    """A raw `TimeoutError` reading the state a write plans on, before any compare-and-set,
    escaped `compare_and_append` as it is. Nothing can have been applied: it is
    `StorageError` (an `OSError` still), naming the shard, with the timeout as its cause."""
    blob = TimingOut(Blob(existing), reads)
    shard = Shard(existing, blob=blob)
    with pytest.raises(StorageError) as info:
        shard.compare_and_append(pa.table({"id": [9], "_time": [3], "_diff": [1]}), 3, 4)
    assert not isinstance(info.value, Indeterminate)
    assert isinstance(info.value, OSError)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert str(info.value).startswith("StorageError: ") and "TimeoutError" in str(info.value)
    assert shard.location in str(info.value)
    assert Shard(existing).upper == 3  # nothing applied: the same write now lands
    Shard(existing).compare_and_append(pa.table({"id": [9], "_time": [3], "_diff": [1]}), 3, 4)


def test_a_timeout_on_a_commits_first_state_read_is_a_determinate_storage_error(existing):
    """The commit loop's own first state read (no attempt made yet) times out: the machine
    says `StorageError`, not the raw `TimeoutError` (which reads as "may have landed")."""
    from persistshard.core.statemachine.commits.advance_since import AdvanceSince
    from persistshard.core.storage.layout import new_id

    blob = TimingOut(Blob(existing), 0)
    shard = Shard(existing, blob=blob)
    blob.reads = 3
    with pytest.raises(StorageError) as info:
        shard._machine.commit(AdvanceSince(1, id=new_id()))
    assert isinstance(info.value.__cause__, TimeoutError)
    assert "nothing was applied" in str(info.value)
    assert Shard(existing).since == 0


class RefusingEntries(BlobWrapper):
    """Every conditional create of a log entry is refused for certain with `StorageError`,
    as the store raises it when a put's temporary file was deleted twice under it (nothing
    was published)."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key.startswith("consensus/v"):
            raise StorageError(
                f"injected: cannot write {key}: nothing was published",
                location=self.inner.url,
                cause=FileNotFoundError(errno.ENOENT, "No such file or directory", key),
            )
        return self.inner.put_if_absent(key, data)


def test_a_storage_error_in_the_stores_compare_and_set_stays_determinate(existing):
    """`StorageError` is an `OSError`; the consensus reads a failed create back ("it may have
    been applied") and the commit loop takes an `OSError` from the compare-and-set for an
    ambiguous attempt. A certain refusal must pass both as it is: never `Indeterminate`."""
    before = Shard(existing).inspect.state()
    shard = Shard(existing, blob=RefusingEntries(Blob(existing)), inline_bytes=0)
    with pytest.raises(StorageError, match="injected") as info:
        shard.append(pa.table({"id": [9]}))
    assert not isinstance(info.value, Indeterminate)
    assert Shard(existing).inspect.state() == before


def test_a_storage_error_from_a_consensus_compare_and_set_is_not_indeterminate(existing):
    """A consensus that refuses a compare-and-set for certain raises `StorageError` (its own
    translation of a permission error); the commit loop must not read it as a lost answer."""
    shard = Shard(existing)
    calls = []

    def refuse(expected: int | None, data: bytes) -> bool:
        calls.append(expected)
        raise StorageError("injected: commit refused, nothing was applied", cause=None)

    shard._consensus.compare_and_set = refuse  # type: ignore[method-assign]
    before = Shard(existing).inspect.state()
    with pytest.raises(StorageError, match="injected") as info:
        shard.advance_since(1)
    assert not isinstance(info.value, Indeterminate)
    assert len(calls) == 1  # said at once: not retried as an unknown outcome
    assert Shard(existing).inspect.state() == before


def test_a_storage_error_after_an_ambiguous_attempt_is_indeterminate(existing):
    """The compare-and-set is applied but its answer is lost (a timeout), then reading the log
    back is refused for certain (credentials expired, say). That refusal is certain about the
    read, not about the commit, which may have landed: `Indeterminate`, never `StorageError`
    (whose "nothing was applied" would let a caller delete parts the shard now names)."""
    shard = Shard(existing)
    consensus = shard._consensus
    applied = consensus.compare_and_set
    refused_reads = []

    def lose_answer(expected: int | None, data: bytes) -> bool:
        assert applied(expected, data)
        consensus.head = refuse  # type: ignore[method-assign]
        consensus.scan = refuse  # type: ignore[method-assign]
        raise TimeoutError("injected: the answer of an applied compare-and-set was lost")

    def refuse(*args: object, **kwargs: object) -> None:
        refused_reads.append(args)
        raise StorageError("injected: reading the log refused", cause=None)

    consensus.compare_and_set = lose_answer  # type: ignore[method-assign]
    with pytest.raises(Indeterminate) as info:
        shard.advance_since(1)
    assert isinstance(info.value.__cause__, StorageError)
    assert refused_reads
    assert Shard(existing).since == 1  # it had landed
