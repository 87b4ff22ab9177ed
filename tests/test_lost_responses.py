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


# --- item 1: a conditional create whose response was lost -----------------------------------

import errno  # noqa: E402
import os  # noqa: E402
from collections import Counter  # noqa: E402

import pyarrow as pa  # noqa: E402
from conformance_helpers import rows_of  # noqa: E402

from persistshard.core.shard import Shard  # noqa: E402
from persistshard.core.statemachine.commits.append import Append  # noqa: E402
from persistshard.core.statemachine.state import Batch  # noqa: E402
from persistshard.core.storage import blob as blob_module  # noqa: E402
from persistshard.core.storage.consensus import MemoryConsensus  # noqa: E402
from persistshard.core.storage.layout import ROLLUP_EVERY  # noqa: E402
from persistshard.errors import CorruptData, Indeterminate, UpperMismatch  # noqa: E402

LOSSES = ["lose_response", "retry_after_lost", "duplicate"]


def faulty_shard(
    location: str, fault: str, p: float, seed: int, inline: bool, backoff: float | None = None
) -> tuple[Shard, FaultyBlob]:
    """A shard over local files whose conditional creates (the log entries) meet ``fault``;
    ``backoff``: its ``commit_backoff_seconds`` (default the configuration's)."""
    blob = FaultyBlob(
        Blob(location), seed=seed, operations=frozenset({"put_if_absent"}), **{fault: p}
    )
    knobs = {"inline_bytes": None if inline else 0, "commit_backoff_seconds": backoff}
    return Shard(location, blob=blob, **knobs), blob


def append_until_known(shard: Shard, i: int) -> None:
    """Append row ``i`` at time ``i`` the way a careful caller does: on `Indeterminate`
    re-read and retry only if the row is not there. A refusal is a test failure."""
    while True:
        try:
            shard.compare_and_append(pa.table({"id": [i], "_time": [i], "_diff": [1]}), i, i + 1)
            return
        except Indeterminate:
            if shard.upper > i:  # resolved: it landed (an append at upper i is ours)
                return


@pytest.mark.parametrize("inline", [False, True], ids=["parts", "inline"])
@pytest.mark.parametrize("fault", LOSSES)
def test_lost_response_on_log_entry_local(tmp_path, monkeypatch, fault, inline):
    """The log entry's conditional create is applied and its answer lost (then, for
    ``retry_after_lost``, the client library's own retry reports "exists"): every append is
    told success (or Indeterminate, resolved), every row is there exactly once, and nothing
    is unreadable. Before the fix: `UpperMismatch` for a commit that landed, then its parts
    deleted (`CorruptData`) or, inline, rows landed that the caller was told were refused."""
    location = str(tmp_path / "shard")
    shard, blob = faulty_shard(location, fault, 0.4, seed=3, inline=inline, backoff=0)
    n = ROLLUP_EVERY + 4  # past a rollup
    for i in range(n):
        append_until_known(shard, i)
    assert blob.injected >= 5
    blob.enabled = False
    clean = Shard(location)
    assert clean.upper == n
    assert rows_of(clean.snapshot()) == {(i,): 1 for i in range(n)}
    assert clean.verify().ok


@pytest.mark.parametrize("fault", LOSSES)
def test_lost_response_on_plain_append_never_doubles(tmp_path, monkeypatch, fault):
    """Plain appends (no times: they land at whatever the upper is) re-apply the same commit
    after a lost race: a race "lost" to a lost response must not land the rows twice."""
    location = str(tmp_path / "shard")
    shard, blob = faulty_shard(location, fault, 0.5, seed=5, inline=False, backoff=0)
    for i in range(16):
        while True:
            try:
                shard.append(pa.table({"id": [i]}))
                break
            except Indeterminate:
                blob.enabled = False
                landed = (i,) in rows_of(Shard(location).snapshot())
                blob.enabled = True
                if landed:
                    break
    assert blob.injected >= 3
    clean = Shard(location)
    assert Counter(rows_of(clean.snapshot())) == Counter({(i,): 1 for i in range(16)})
    assert clean.verify().ok


def test_link_reporting_exists_after_success_local(tmp_path, monkeypatch):
    """NFS: ``link()`` created the name, its reply was lost, the client retried and got
    EEXIST. `put_if_absent` must report the key created by this call (it holds our file)."""
    real_link = os.link
    calls = Counter[str]()

    def link_then_eexist(src: str, dst: str) -> None:
        real_link(src, dst)
        if "consensus" in dst and "/v" in dst:
            calls["lied"] += 1
            raise FileExistsError(errno.EEXIST, "File exists", dst)

    monkeypatch.setattr(blob_module.os, "link", link_then_eexist)
    blob = Blob(str(tmp_path / "b"))
    assert blob.put_if_absent("consensus/v1", b"mine") is True
    assert blob.put_if_absent("consensus/v1", b"other") is False  # a real "exists"
    assert blob.get("consensus/v1") == b"mine"
    location = str(tmp_path / "shard")
    shard = Shard(location, inline_bytes=0)
    for i in range(5):
        shard.compare_and_append(pa.table({"id": [i], "_time": [i], "_diff": [1]}), i, i + 1)
    assert calls["lied"] >= 5
    monkeypatch.setattr(blob_module.os, "link", real_link)
    assert rows_of(Shard(location).snapshot()) == {(i,): 1 for i in range(5)}


class LostAckConsensus(MemoryConsensus):
    """A consensus whose compare-and-set applies and then reports a lost race, ``times``
    times (what a consensus that trusts "exists" did): the state machine itself must not
    report a refusal, or re-apply, for a commit that landed."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times

    @property
    def certain_lost_races(self) -> bool:
        return False  # it lies about them

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        ok = super().compare_and_set(expected, data)
        if ok and self.times > 0:
            self.times -= 1
            return False
        return ok


@pytest.mark.parametrize("plain", [False, True], ids=["compare_and_append", "plain"])
def test_state_machine_never_refuses_or_doubles_a_landed_commit(tmp_path, plain):
    location = str(tmp_path / "shard")
    shard = Shard(location, consensus=LostAckConsensus(times=0), inline_bytes=0)
    shard.compare_and_append(pa.table({"id": [0], "_time": [0], "_diff": [1]}), 0, 1)
    assert isinstance(shard._consensus, LostAckConsensus)
    shard._consensus.times = 1
    if plain:
        shard.append(pa.table({"id": [1]}))
    else:
        shard.compare_and_append(pa.table({"id": [1], "_time": [1], "_diff": [1]}), 1, 2)
    assert shard.upper == 2
    assert Counter(rows_of(shard.snapshot())) == Counter({(0,): 1, (1,): 1})
    assert shard.verify().ok


def test_state_machine_checks_before_reporting_a_refusal(tmp_path):
    """A direct commit through the state machine: compare-and-set applied and said False;
    the retry's precondition fails because of the commit itself. Not a refusal."""
    consensus = LostAckConsensus(times=1)
    shard = Shard(str(tmp_path / "shard"), consensus=consensus)
    seal = Append(0, 1, Batch("b", 0, 1, ()), id="c-1")
    state = shard._machine.commit(seal)
    assert state.version == 1 and state.last_commit == "c-1"
    with pytest.raises(UpperMismatch):  # a real refusal is still one
        shard._machine.commit(Append(0, 1, Batch("b", 0, 1, ()), id="c-2"))
    assert CorruptData  # (imported for the parametrised tests' failure messages)
