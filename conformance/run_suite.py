"""The conformance suite against a location of the user's: ``persistshard conformance URL``.

Each test gets a fresh, empty sub-location under ``$PERSISTSHARD_CONFORMANCE_LOCATION``, opened
with the storage options in ``$PERSISTSHARD_CONFORMANCE_STORAGE_OPTIONS`` (a JSON object; the
command line's ``--storage-option`` values); what the tests write there is left for inspection.
With ``$PERSISTSHARD_CONFORMANCE_CONSENSUS`` (``--consensus URL``) the log is kept in that
database instead of next to the data. The same classes run in the project's own tests against
local files, memory and a local S3 server (``tests/test_conformance.py``,
``tests/test_s3.py``).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from persistshard.conformance.model import make_shard_machine
from persistshard.conformance.storage import (
    BlobContract,
    ConsensusAt,
    ConsensusContract,
    Store,
)
from persistshard.core.blob import open_blob

BASE = os.environ.get("PERSISTSHARD_CONFORMANCE_LOCATION", "")
OPTIONS: dict[str, Any] = json.loads(
    os.environ.get("PERSISTSHARD_CONFORMANCE_STORAGE_OPTIONS") or "{}"
)

CONSENSUS = os.environ.get("PERSISTSHARD_CONFORMANCE_CONSENSUS", "")


def _fresh() -> str:
    if not BASE:
        pytest.skip("set PERSISTSHARD_CONFORMANCE_LOCATION (persistshard conformance URL)")
    return f"{BASE.rstrip('/')}/conformance-{uuid.uuid4().hex}"


@pytest.fixture
def store() -> Store:
    url = _fresh()
    shared = open_blob(url, **OPTIONS).capabilities.shared
    factory = ConsensusAt(CONSENSUS) if CONSENSUS else None
    return Store(url, OPTIONS, consensus_factory=factory, shared=shared)


class TestBlob(BlobContract):
    pass


class TestConsensus(ConsensusContract):
    pass


if BASE:
    MODEL_OPTIONS = {**OPTIONS, "consensus": CONSENSUS} if CONSENSUS else OPTIONS
    TestShardModel = make_shard_machine(_fresh, MODEL_OPTIONS).TestCase
    TestShardModel.settings = settings(
        max_examples=20,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
