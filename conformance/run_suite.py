"""The conformance suite against a location of the user's: ``persistshard conformance URL``.

Each test gets a fresh, empty sub-location under ``$PERSISTSHARD_CONFORMANCE_LOCATION``; what
the tests write there is left for inspection. The same classes run in the project's own tests
against local files and memory (``tests/test_conformance.py``).
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, settings

from persistshard.conformance.model import make_shard_machine
from persistshard.conformance.storage import BlobContract, ConsensusContract

BASE = os.environ.get("PERSISTSHARD_CONFORMANCE_LOCATION", "")


def _fresh() -> str:
    if not BASE:
        pytest.skip("set PERSISTSHARD_CONFORMANCE_LOCATION (persistshard conformance URL)")
    return f"{BASE.rstrip('/')}/conformance-{uuid.uuid4().hex}"


@pytest.fixture
def location() -> str:
    return _fresh()


class TestBlob(BlobContract):
    pass


class TestConsensus(ConsensusContract):
    pass


if BASE:
    TestShardModel = make_shard_machine(_fresh).TestCase
    TestShardModel.settings = settings(
        max_examples=20,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
