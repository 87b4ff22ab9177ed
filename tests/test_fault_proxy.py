"""The fault harness itself, and the shard on S3 behind it: a fault-injecting HTTP proxy
(`persistshard.conformance.proxy`) in front of the local moto server, with s3fs's own retries
on, so a lost response is retried by the client library exactly as in production.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from persistshard.conformance.proxy import FaultProxy, Rule, fault_proxy, s3_options_via
from persistshard.core.storage.blob import open_blob

BUCKET = "persistshard-proxy"


@pytest.fixture
def proxy(s3_direct: dict[str, Any]) -> Iterator[FaultProxy]:
    with fault_proxy(s3_direct["client_kwargs"]["endpoint_url"], seed=7) as p:
        yield p


@pytest.fixture
def via(s3_direct: dict[str, Any], proxy: FaultProxy) -> dict[str, Any]:
    """Storage options that reach the server through the proxy."""
    return s3_options_via(s3_direct, proxy)


@pytest.fixture
def location() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}"


CONDITIONAL_PUT = {"method": "PUT", "header": "If-None-Match"}


@pytest.mark.parametrize("action", ["drop", "error500"])
def test_lost_response_to_conditional_put_is_retried_into_exists(action, proxy, via, location):
    """The real behaviour the shard must survive: the server applied the conditional PUT,
    its answer was lost (or a 500 came back), s3fs retried and the retry got 412."""
    blob = open_blob(location, **via)
    proxy.set_rules(Rule(action, times=1, **CONDITIONAL_PUT))
    assert blob.put_if_absent("k", b"mine") is False  # what the library reports ...
    assert blob.get("k") == b"mine"  # ... while its own first request created the key
    assert proxy.hits[action] == 1


def test_forwarding_duplicates_and_cuts(proxy, via, location):
    blob = open_blob(location, **via)
    assert blob.put_if_absent("a", b"1") is True
    assert blob.put_if_absent("a", b"2") is False
    proxy.set_rules(Rule("twice", **CONDITIONAL_PUT, times=1))
    assert blob.put_if_absent("b", b"1") is True  # the first delivery's answer
    proxy.set_rules(Rule("reset", method="GET", times=1))
    assert blob.get("a") == b"1"  # s3fs retries a body cut short
    proxy.set_rules(Rule("delay", method="GET", delay_seconds=0.2, times=1))
    assert blob.get("b") == b"1"
    assert proxy.hits == {"twice": 1, "reset": 1, "delay": 1}
    assert all(rule.times == 0 for rule in proxy._rules)  # bounded


def test_strip_if_none_match_makes_a_lying_store(proxy, via, location):
    blob = open_blob(location, **via)
    assert blob.put_if_absent("a", b"1") is True
    proxy.set_rules(Rule("strip_if_none_match", method="PUT"))
    assert blob.put_if_absent("a", b"2") is True  # the condition never reached the server
    assert blob.get("a") == b"2"


def test_unknown_action_is_refused():
    with pytest.raises(ValueError, match="unknown proxy action"):
        Rule("explode")


# --- item 1 on S3: the log entry's conditional PUT applied, its answer lost -----------------

import pyarrow as pa  # noqa: E402
from conformance_helpers import rows_of  # noqa: E402

from persistshard.core.shard import Shard  # noqa: E402
from persistshard.errors import Indeterminate  # noqa: E402


@pytest.mark.parametrize(
    ("action", "inline"),
    [("drop", False), ("drop", True), ("error500", False)],
    ids=["drop-parts", "drop-inline", "error500-parts"],
)
def test_lost_response_on_log_entry_s3(action, inline, proxy, via, s3_direct, location):
    """The server applies the ``If-None-Match`` PUT of a log entry, the answer is lost (the
    connection closes, or a 500 comes back), s3fs retries by itself and gets 412. Every
    append must be told success (or Indeterminate, resolved by reading), every row must be
    there once, and every read must work. Before the fix: `UpperMismatch` for a commit that
    landed, its parts deleted (`CorruptData` on every later read)."""
    shard = Shard(location, inline_bytes=None if inline else 0, **via)
    times = 3 if action == "drop" else 2  # botocore backs off ~0.5 s after a 500
    proxy.set_rules(
        Rule(action, path_contains="/consensus/v", probability=0.5, times=times, **CONDITIONAL_PUT)
    )
    n = 6
    for i in range(n):
        while True:
            try:
                shard.compare_and_append(
                    pa.table({"id": [i], "_time": [i], "_diff": [1]}), i, i + 1
                )
                break
            except Indeterminate:
                if shard.upper > i:
                    break
    assert proxy.hits[action] == times
    proxy.set_rules()
    clean = Shard(location, **s3_direct)
    assert clean.upper == n
    assert rows_of(clean.snapshot()) == {(i,): 1 for i in range(n)}
    assert clean.verify().ok


# --- item 4 on S3: an endpoint that ignores If-None-Match -------------------------------------

from persistshard.core.storage import consensus as consensus_module  # noqa: E402
from persistshard.errors import StorageUnsupported  # noqa: E402


def test_endpoint_ignoring_if_none_match_is_refused(proxy, via, s3_direct, location):
    """The proxy strips ``If-None-Match`` from every PUT, so moto overwrites: a real lying
    endpoint. The first write is refused and nothing is published at the location."""
    getattr(consensus_module, "ATOMIC_CREATE_CHECKED", set()).clear()
    proxy.set_rules(Rule("strip_if_none_match", method="PUT"))
    shard = Shard(location, inline_bytes=0, **via)
    with pytest.raises(StorageUnsupported, match=r"ignores the condition|second exclusive"):
        shard.compare_and_append(pa.table({"id": [1], "_time": [0], "_diff": [1]}), 0, 1)
    direct = open_blob(location, **s3_direct)
    assert [m.key for m in (*direct.list(""), *direct.list_temporary())] == []
    proxy.set_rules()
    getattr(consensus_module, "ATOMIC_CREATE_CHECKED", set()).clear()
    Shard(location, **via).compare_and_append(
        pa.table({"id": [1], "_time": [0], "_diff": [1]}), 0, 1
    )
