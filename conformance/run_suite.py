"""The conformance suite against a location of the user's: ``persistshard conformance URL``.

Each test gets a fresh, empty sub-location ``conformance-<run>-<uuid>`` under the target's
location, opened with its storage options; with a consensus URL the log is kept in that
database instead of next to the data. The target comes from the plugin object the command
hands pytest (`persistshard.conformance.target.ConformanceTarget`, fixture
``conformance_target``), never from the environment: the command deletes every
``conformance-<run>-*`` sub-location when the suite ends (`persistshard.conformance.cleanup`).
The same classes run in the project's own tests against local files, memory and a local S3
server (``tests/test_conformance.py``, ``tests/test_s3.py``).

`TestStore` reports what the store does beyond pass/fail (`persistshard.conformance.store_report`):
each of its tests records a ``store`` user property ``{name: answer}`` that the command prints
(and puts under ``"store"`` in ``--json``): atomic create, the answer to a repeated
conditional PUT, and a short linearizability run with the store's responses lost.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from persistshard.conformance import store_report
from persistshard.conformance.crash import check_page_cache, check_process_cuts
from persistshard.conformance.model import make_shard_machine
from persistshard.conformance.storage import (
    BlobContract,
    ConsensusAt,
    ConsensusContract,
    Store,
)
from persistshard.conformance.target import ConformanceTarget
from persistshard.core.storage.blob import open_blob


@pytest.fixture
def store(conformance_target: ConformanceTarget) -> Store:
    t = conformance_target
    url = t.fresh()
    shared = open_blob(url, **t.storage_options).capabilities.shared
    factory = ConsensusAt(t.consensus) if t.consensus else None
    return Store(url, t.storage_options, consensus_factory=factory, shared=shared)


class TestBlob(BlobContract):
    pass


class TestConsensus(ConsensusContract):
    pass


class TestStore:
    """What this store answers, reported by the command (module docstring)."""

    def test_atomic_create(self, store: Store, record_property: Any) -> None:
        answer = store_report.atomic_create(store.blob())
        record_property("store", {"atomic_create": answer})
        assert answer == "holds", answer

    def test_repeated_conditional_put(self, store: Store, record_property: Any) -> None:
        answers = store_report.repeated_conditional_put(store.blob())
        record_property("store", {"repeated_conditional_put": answers})
        assert answers == {"first": "created", "second": "exists", "kept": "first"}, answers

    def test_lost_responses_are_linearizable(
        self, store: Store, record_property: Any, conformance_target: ConformanceTarget
    ) -> None:
        """Processes read and append on a scratch shard whose storage calls are applied and
        then reported failed (the response lost); the history is checked for
        linearizability and the final rows hold each acknowledged append once."""
        if not store.shared:
            pytest.skip("the store is not shared between processes")
        consensus = conformance_target.consensus
        rec = store_report.lost_responses(store.url, store.storage_options, consensus)
        record_property("store", {"lost_responses": store_report.describe(rec)})
        rec.assert_ok()
        assert rec.injected > 0, rec.summary()


class TestCrash:
    """Crash consistency on this store (`persistshard.conformance.crash`): the process dies
    before every store call of an append and of a gc (of replaced parts), and on each image
    every acknowledged commit is there, the shard verifies and takes a new commit. On local
    files, also a power cut after every os call of an append and of an overwrite, through
    the page-cache model (only fsynced bytes and directory entries survive)."""

    @pytest.mark.parametrize("name", ["append", "gc-short"])
    def test_process_dies_before_every_store_call(
        self, name: str, conformance_target: ConformanceTarget
    ) -> None:
        t = conformance_target
        assert check_process_cuts(t.fresh, name, t.storage_options) > 1

    @pytest.mark.parametrize("name", ["append", "overwrite"])
    def test_power_cut_on_local_files(
        self, name: str, conformance_target: ConformanceTarget
    ) -> None:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        t = conformance_target
        fs, root = fsspec.core.url_to_fs(t.fresh(), **t.storage_options)
        if not isinstance(fs, LocalFileSystem):
            pytest.skip("the page-cache model intercepts local file calls; this store is not local")
        assert check_page_cache(root, name) > 1


class TestShardModel:
    """The shard against its reference model (`persistshard.conformance.model`), on fresh
    sub-locations of the target."""

    def test_model(self, conformance_target: ConformanceTarget) -> None:
        t = conformance_target
        options: dict[str, Any] = dict(t.storage_options)
        if t.consensus:
            options["consensus"] = t.consensus
        run_state_machine_as_test(
            make_shard_machine(t.fresh, options),
            settings=settings(
                max_examples=20,
                stateful_step_count=15,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
