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


# --- the same contracts on S3 through the fault-injecting proxy (s3fs's own retries on) -------

import os  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

from persistshard.conformance.proxy import Rule, fault_proxy, s3_options_via  # noqa: E402

BUCKET = "persistshard-contracts"
CONDITIONAL_PUT = {"method": "PUT", "header": "If-None-Match"}


#: ``PERSISTSHARD_SWEEP=1`` (as tests/test_linearizability.py) runs the whole S3 matrix: the
#: consensus contract under every proxy fault and the racing workers under each.
#: The sweep's cases are collected only then, so a default run lists no skips.
SWEEP = os.environ.get("PERSISTSHARD_SWEEP") == "1"


def proxy_rules(action: str) -> list[Rule]:
    """``action`` on conditional creates first (the requests a lost answer turns into
    "exists"), then on any request, each bounded below s3fs's retries (each costs the
    client a retry after a backoff; a 500 about half a second: fewer)."""
    times = 1
    return [
        Rule(action, probability=0.5, times=times, **CONDITIONAL_PUT),
        Rule(action, probability=0.5, times=times),
    ]


def proxied_store(s3_direct: dict[str, Any], action: str) -> Iterator[Store]:
    """A store on the moto server through a `FaultProxy` injecting ``action``; no harness
    read-back (the client library retries, the library reads "exists" back: every answer the
    contract asserts must come out exact). After the test, the faults must have been met."""
    with fault_proxy(s3_direct["client_kwargs"]["endpoint_url"], seed=SEED) as proxy:
        proxy.set_rules(*proxy_rules(action))
        yield Store(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_options_via(s3_direct, proxy))
        assert proxy.hits[action] > 0, f"no {action} was injected: the test checked nothing"


#: The proxy faults beside ``drop`` that only the sweep runs.
SLOWER = ("error500", "twice")


class TestS3ConsensusUnderProxyFaults(ConsensusContract):
    """Every proxy fault in the sweep; ``drop`` (a lost answer, retried by the client) by
    default."""

    @pytest.fixture(
        params=["drop", *(pytest.param(a, marks=pytest.mark.slow) for a in SLOWER if SWEEP)]
    )
    def store(self, request, s3_direct) -> Iterator[Store]:
        yield from proxied_store(s3_direct, request.param)

    if not SWEEP:
        # Racing worker processes on S3 through the proxy take tens of seconds: the sweep's.
        test_cas_race = None  # type: ignore[assignment]


class TestS3BlobUnderDrop(blob_contract_under("drop")):  # type: ignore[misc]
    @pytest.fixture
    def store(self, s3_direct) -> Iterator[Store]:
        yield from proxied_store(s3_direct, "drop")


if SWEEP:

    @pytest.mark.slow
    class TestS3BlobUnderTwice(blob_contract_under("twice")):  # type: ignore[misc]
        @pytest.fixture
        def store(self, s3_direct) -> Iterator[Store]:
            yield from proxied_store(s3_direct, "twice")

    @pytest.mark.slow
    class TestS3BlobUnderError500(blob_contract_under("error500")):  # type: ignore[misc]
        @pytest.fixture
        def store(self, s3_direct) -> Iterator[Store]:
            yield from proxied_store(s3_direct, "error500")
