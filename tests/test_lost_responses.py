"""Lost responses, client retries, duplicated requests and lying stores, on local files
through `persistshard.conformance.faults.FaultyBlob` (issue 36, item 1)."""

from __future__ import annotations

import pytest

from persistshard.conformance.faults import FaultyBlob
from persistshard.core.storage.blob import Blob


@pytest.fixture
def inner(tmp_path) -> Blob:
    return Blob(str(tmp_path / "store"))


def test_faulty_blob_modes(inner):
    """Each fault does what its name says, on the store underneath."""
    lost = FaultyBlob(inner, lose_response=1.0)
    with pytest.raises(TimeoutError):
        lost.put_if_absent("a", b"1")
    assert inner.get("a") == b"1" and lost.lost == 1
    retried = FaultyBlob(inner, retry_after_lost=1.0)
    assert retried.put_if_absent("b", b"1") is False  # the library's retry saw "exists"
    assert inner.get("b") == b"1" and retried.retried == 1
    dup = FaultyBlob(inner, duplicate=1.0)
    assert dup.put_if_absent("c", b"1") is True
    assert inner.get("c") == b"1" and dup.duplicated == 1
    liar = FaultyBlob(inner, ignore_condition=1.0)
    assert liar.put_if_absent("c", b"2") is True
    assert inner.get("c") == b"2" and liar.lied == 1
    liar.enabled = False
    assert liar.put_if_absent("c", b"3") is False


def test_faulty_blob_draws_are_seeded(inner):
    def outcomes(seed: int) -> list[str]:
        blob = FaultyBlob(inner, lose_response=0.3, retry_after_lost=0.3, seed=seed)
        out = []
        for i in range(30):
            try:
                out.append(str(blob.put_if_absent(f"s{seed}-{i}-{len(out)}", b"x")))
            except TimeoutError:
                out.append("timeout")
        return out

    first = outcomes(3)
    assert {"True", "False", "timeout"} <= set(first)
    for key in [m.key for m in inner.list("")]:
        inner.delete(key)
    assert outcomes(3) == first
