"""Storage that ignores the condition of a conditional create is refused before the first
write with the default (blob) consensus, not discovered by losing data (issue 36, item 4)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from persistshard.conformance.faults import FaultyBlob
from persistshard.core.shard import Shard
from persistshard.core.storage import consensus as consensus_module
from persistshard.core.storage.blob import Blob, BlobWrapper, foreign_keys
from persistshard.errors import StorageUnsupported

ROWS = pa.table({"id": [1], "_time": [0], "_diff": [1]})


@pytest.fixture(autouse=True)
def fresh_probe_cache():
    getattr(consensus_module, "ATOMIC_CREATE_CHECKED", set()).clear()
    yield
    getattr(consensus_module, "ATOMIC_CREATE_CHECKED", set()).clear()


def every_key(blob: Blob) -> list[str]:
    return [m.key for m in (*blob.list(""), *blob.list_temporary())]


@pytest.mark.parametrize("inline", [False, True], ids=["parts", "inline"])
def test_lying_store_is_refused_before_anything_is_published(tmp_path, inline):
    """4 writers on such a store got 120 appends acknowledged and 31 rows kept: now the first
    write is `StorageUnsupported` and the location holds nothing afterwards."""
    location = str(tmp_path / "shard")
    liar = FaultyBlob(Blob(location), ignore_condition=1.0)
    shard = Shard(location, blob=liar, inline_bytes=None if inline else 0)
    with pytest.raises(StorageUnsupported, match=r"ignores the condition|second exclusive"):
        shard.compare_and_append(ROWS, 0, 1)
    with pytest.raises(StorageUnsupported):
        shard.append(ROWS)  # refused again: a lying store is never cached as checked
    assert liar.lied >= 2
    assert every_key(Blob(location)) == []


def test_probe_runs_once_per_process_and_store(tmp_path):
    class Counting(BlobWrapper):
        creates = 0

        def put_if_absent(self, key: str, data: bytes) -> bool:
            Counting.creates += 1
            return self.inner.put_if_absent(key, data)

    first = Shard(str(tmp_path / "a"), blob=Counting(Blob(str(tmp_path / "a"))))
    first.compare_and_append(ROWS, 0, 1)
    assert Counting.creates == 4  # the probe's two, the identity marker, then the entry
    second = Shard(str(tmp_path / "b"), blob=Counting(Blob(str(tmp_path / "b"))))
    second.compare_and_append(ROWS, 0, 1)
    second.compare_and_append(ROWS.set_column(1, "_time", pa.array([1])), 1, 2)
    assert Counting.creates == 7  # same file system: no second probe (marker, 2 entries)
    assert len(consensus_module.ATOMIC_CREATE_CHECKED) == 1


def test_probe_survives_lost_responses_and_leaves_nothing_foreign(tmp_path):
    """The probe's own creates meet the client's retry ("exists" for its own object): an
    honest store is not refused. A probe cut short (its delete failed) leaves a temporary
    object, which is neither a foreign file nor part of the shard (gc's to remove)."""
    location = str(tmp_path / "shard")
    blob = FaultyBlob(Blob(location), retry_after_lost=1.0, operations=frozenset({"put_if_absent"}))
    consensus_module.check_atomic_create(blob)
    blob.operations = frozenset({"delete"})
    blob.fail_before = 1.0
    getattr(consensus_module, "ATOMIC_CREATE_CHECKED", set()).clear()
    consensus_module.check_atomic_create(blob)
    plain = Blob(location)
    assert foreign_keys(plain) == [] and plain.list("") == []
    assert [m.key.split("/")[0] for m in plain.list_temporary()] == ["consensus"]
