"""The conformance suite on the embedded backends (local files and memory).

`persistshard.conformance` holds the contract; this module only supplies locations. A user
runs the same classes against their own storage with `persistshard conformance LOCATION`.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from conformance_helpers import examples, rows_of
from hypothesis import HealthCheck, settings

from persistshard import Indeterminate, InvalidUpdates, UpperMismatch
from persistshard.conformance.faults import FaultyBlob
from persistshard.conformance.model import make_shard_machine
from persistshard.conformance.storage import (
    BlobContract,
    ConsensusContract,
    Store,
    one_consensus,
)
from persistshard.core.shard import Shard
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.storage.blob import Blob
from persistshard.core.storage.consensus import MemoryConsensus
from persistshard.core.storage.layout import ROLLUP_EVERY


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path) -> Store:
    if request.param == "file":
        return Store(f"file://{tmp_path}/store")
    return Store(f"memory://conformance-{uuid.uuid4().hex}", shared=False)


class TestBlob(BlobContract):
    pass


class TestConsensus(ConsensusContract):
    pass


class TestMemoryConsensus(ConsensusContract):
    """The in-process consensus passes the same contract (its racers are threads)."""

    @pytest.fixture
    def store(self) -> Store:
        return Store(
            f"memory://unused-{uuid.uuid4().hex}",
            consensus_factory=one_consensus(MemoryConsensus()),
            shared=False,
        )


class TestFaultFreeWrapper(BlobContract):
    """A wrapper with faults switched off is a blob like any other (the wrapper forwards
    the whole interface, capabilities included)."""

    @pytest.fixture
    def store(self, tmp_path) -> Store:
        return Store(f"file://{tmp_path}/store")

    @pytest.fixture
    def blob(self, store: Store) -> Blob:
        return FaultyBlob(store.blob(), fail_before=0.0, fail_after=0.0)

    # The race builds its blobs from the store in other processes (no wrapper there): it
    # would repeat TestBlob's file race.
    test_put_if_absent_race = None


_counter = iter(range(10**9))


def _new_location() -> str:
    return f"memory://model-{uuid.uuid4().hex}-{next(_counter)}/shard"


MemoryModel = make_shard_machine(_new_location)
TestModelMemory = MemoryModel.TestCase
TestModelMemory.settings = settings(
    max_examples=examples(60),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_model_on_local_files(tmp_path):
    machine = make_shard_machine(lambda: f"{tmp_path}/model-{uuid.uuid4().hex}")
    case = machine.TestCase
    case.settings = settings(max_examples=examples(10), stateful_step_count=20, deadline=None)
    case("runTest").runTest()


@pytest.mark.parametrize("seed", range(4))
def test_commits_under_injected_faults(tmp_path, seed):
    """Storage calls fail before or after doing their work (20% each). Every logical append is
    retried by the caller until it is known to have landed; the result must hold each append
    exactly once: none lost, none doubled. (No pauses between retries: the faults are
    injected, not a storage that needs time to recover.)"""
    location = f"{tmp_path}/faulty"
    blob = FaultyBlob(Blob(location), fail_before=0.2, fail_after=0.2, seed=seed)
    shard = Shard(location, blob=blob, commit_backoff_seconds=0)
    for i in range(25):
        data = pa.table({"id": [i], "_time": [i], "_diff": [1]})
        while True:
            try:
                shard.compare_and_append(data, i, i + 1)
                break
            except UpperMismatch as e:
                assert (e.expected, e.actual) == (i, i + 1)  # an earlier attempt landed
                break
            except (OSError, Indeterminate):  # may have landed: the retry finds out
                continue
    assert blob.injected > 10
    blob.enabled = False
    clean = Shard(location)
    assert clean.upper == 25
    assert rows_of(clean.snapshot()) == {(i,): 1 for i in range(25)}
    clean.inspect.state().check()


@pytest.mark.parametrize("seed", range(2))
def test_commits_under_injected_faults_and_stalls(tmp_path, seed):
    """As above, with stalls: before some storage calls the writer pauses while another
    writer appends past a rollup and the log is truncated behind it (as gc does), so the
    writer's retries and read-backs meet a log that moved on and lost its old versions.
    Each of its appends is retried until it is seen in the shard; every append, its own and
    the other's, must be there exactly once."""
    location = f"{tmp_path}/stalls"
    other = Shard(location)
    other.append(pa.table({"id": [-1], "_time": [0], "_diff": [1]}))
    others = [-1]

    def meanwhile() -> None:
        for _ in range(ROLLUP_EVERY + 1):
            others.append(-len(others) - 1)
            other.append(pa.table({"id": [others[-1]], "_time": [other.upper], "_diff": [1]}))
        head = other._consensus.head()
        assert head is not None
        other._consensus.truncate(Entry.decode(head.data).rollup_version)

    blob = FaultyBlob(
        Blob(location), fail_before=0.1, fail_after=0.1, seed=seed, stall=0.02, on_stall=meanwhile
    )
    shard = Shard(location, blob=blob, commit_backoff_seconds=0)
    for i in range(10):
        while True:
            try:
                shard.append(pa.table({"id": [i], "_time": [shard.upper], "_diff": [1]}))
                break
            except InvalidUpdates as e:  # a stall moved the upper past the row's time
                assert "below the write's lower" in str(e)
            except (OSError, Indeterminate, UpperMismatch):
                blob.enabled = False
                landed = (i,) in rows_of(shard.snapshot())
                blob.enabled = True
                if landed:
                    break
    assert blob.stalls >= 2 and blob.injected > 5
    blob.enabled = False
    clean = Shard(location)
    assert rows_of(clean.snapshot()) == {(i,): 1 for i in [*range(10), *others]}
    clean.inspect.state().check()
    assert clean.verify().ok
