"""The storage contracts under faults (issue 36, "Done when": the fault harness runs the
consensus and blob contracts): `persistshard.conformance.storage`'s suites over stores whose
blob is wrapped in `persistshard.conformance.faults.FaultyBlob`, and the conformance probe's
own footprint."""

from __future__ import annotations

import pytest

from persistshard.conformance.crash import Cut, CutBlob
from persistshard.conformance.storage import probe_atomic_create
from persistshard.core.storage.blob import Blob, foreign_keys


@pytest.mark.parametrize("prefix", ["", "scratch/"])
def test_conformance_probe_cut_short_leaves_no_foreign_file(tmp_path, prefix):
    """The probe `persistshard conformance` runs first dies before it deletes its key (a
    crash): what it leaves must be a temporary inside the shard's own prefixes, never a
    foreign file that would refuse creating a shard there (it wrote ``probe-<uuid>``)."""
    location = str(tmp_path / "place")
    with pytest.raises(Cut):
        probe_atomic_create(CutBlob(Blob(location), cut_at=2), prefix=prefix)
    plain = Blob(location)
    assert foreign_keys(plain) == [] and plain.list("") == []
    left = [m.key for m in plain.list_temporary()]
    assert len(left) == 1 and left[0].startswith(f"{prefix}consensus/"), left
    probe_atomic_create(Blob(location), prefix=prefix)  # a complete probe leaves nothing new
    assert plain.list("") == [] and len(plain.list_temporary()) == 1


# --- the consensus and blob contracts on local files under every FaultyBlob fault ------------

from collections.abc import Iterator  # noqa: E402

from persistshard.conformance.faults import Faults  # noqa: E402
from persistshard.conformance.storage import (  # noqa: E402
    BLOB_CONTRACT_UNDER,
    ConsensusContract,
    Store,
    blob_contract_under,
)

#: The faults the consensus must survive (its callers resolve an ambiguous attempt by
#: reading back): every one, on each storage call, at this probability.
CONSENSUS_FAULTS = ["lose_response", "retry_after_lost", "duplicate", "fail_before", "fail_after"]
P = 0.3
#: Its first draws (0.24, 0.10, 0.40, 0.15, 0.07) put faults on the first calls of every test.
SEED = 4


def faulty_store(url: str, fault: str) -> Iterator[Store]:
    """A store whose blobs meet ``fault``; after the test, the faults must have been met
    (in this process: racing workers count their own)."""
    wrap = Faults({fault: P}, seed=SEED)
    store = Store(url, wrap=wrap)
    yield store
    assert wrap.injected > 0, f"no {fault} was injected: the test checked nothing under it"


@pytest.fixture(params=CONSENSUS_FAULTS)
def store(request, tmp_path) -> Iterator[Store]:
    yield from faulty_store(f"file://{tmp_path}/store", request.param)


class TestConsensusUnderFaults(ConsensusContract):
    pass


class TestBlobUnderDuplicate(blob_contract_under("duplicate")):  # type: ignore[misc]
    @pytest.fixture
    def store(self, tmp_path) -> Iterator[Store]:
        yield from faulty_store(f"file://{tmp_path}/store", "duplicate")


class TestBlobUnderRetryAfterLost(blob_contract_under("retry_after_lost")):  # type: ignore[misc]
    @pytest.fixture
    def store(self, tmp_path) -> Iterator[Store]:
        yield from faulty_store(f"file://{tmp_path}/store", "retry_after_lost")


def test_blob_contract_table_names_real_tests():
    """Every test the table leaves out exists in the contract, and the faults that leave the
    caller no answer are said to admit no blob contract at all."""
    from persistshard.conformance.storage import BlobContract

    for fault, excluded in BLOB_CONTRACT_UNDER.items():
        for name in excluded or ():
            assert callable(getattr(BlobContract, name)), (fault, name)
        if excluded is not None:
            assert not any(callable(getattr(blob_contract_under(fault), n)) for n in excluded)
    for fault in ("lose_response", "fail_before", "fail_after"):
        with pytest.raises(ValueError, match="only the consensus contract"):
            blob_contract_under(fault)
