"""A writer's parts are put behind it: the sync of one part overlaps the encoding of the next,
and nothing counts as stored before every put has returned (`PutsBehind`)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.core.config import ShardConfig
from persistshard.core.storage import parts
from persistshard.core.storage.blob import BlobWrapper, open_blob
from persistshard.core.storage.parts import PutsBehind, write_parts

#: Parts cut at 100 kB: a 20,000-row table is written as several.
SMALL_PARTS = ShardConfig(part_bytes=100_000)


class GatedBlob(BlobWrapper):
    """Each part put waits for the test to open its gate; records what ran when."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.events: list[str] = []
        self.fail = False

    def put(self, key: str, data: bytes) -> None:
        if key.startswith("parts/"):
            self.events.append("put started")
            assert self.gate.wait(10)
            if self.fail:
                raise OSError(f"injected failure putting {key}")
            self.events.append("put done")
        self.inner.put(key, data)


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(1)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "v": rng.random(n),
            "_time": np.zeros(n, np.int64),
            "_diff": np.ones(n, np.int64),
        }
    )


def test_the_next_part_is_encoded_while_the_previous_one_is_put(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = GatedBlob(open_blob(str(tmp_path / "s")))
    encoded: list[int] = []
    real = parts.encode_part

    def encode(table: pa.Table, **kwargs: Any) -> Any:
        encoded.append(table.num_rows)
        blob.events.append("encoded")
        if len(encoded) == 2:
            blob.gate.set()  # the first put is still waiting: the second part was encoded first
        return real(table, **kwargs)

    monkeypatch.setattr(parts, "encode_part", encode)
    refs = write_parts(blob, "w", _table(20_000), config=SMALL_PARTS)
    assert len(refs) > 2
    assert blob.events[:3] == ["encoded", "put started", "encoded"]
    assert blob.events.count("put done") == len(refs)
    assert all(blob.inner.size(r.key) == r.size for r in refs)  # stored when it returned


def test_a_failed_put_fails_the_write_after_the_others_end(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = GatedBlob(open_blob(str(tmp_path / "s")))
    blob.fail = True
    blob.gate.set()
    with pytest.raises(OSError, match="injected failure"):
        write_parts(blob, "w", _table(20_000), config=SMALL_PARTS)
    assert "put started" in blob.events


def test_leaving_on_an_error_waits_for_the_put_under_way(tmp_path: Any) -> None:
    blob = GatedBlob(open_blob(str(tmp_path / "s")))
    with pytest.raises(RuntimeError, match="encoding failed"), PutsBehind(blob) as puts:
        puts.put("parts/w/a.part", b"x")
        threading.Timer(0.2, blob.gate.set).start()
        raise RuntimeError("encoding failed")
    assert blob.events == ["put started", "put done"]  # it ended before the error left


def test_a_large_python_append_reads_back(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: an append cut into several parts put behind is whole after the commit."""
    shard = ps.open_shard(str(tmp_path / "s"), config=SMALL_PARTS)
    table = _table(20_000).drop_columns(["_time", "_diff"])
    shard.append(table)
    assert len(shard.inspect.state().parts()) > 2
    got = shard.snapshot()
    assert got.drop_columns(["_diff"]).equals(table)
