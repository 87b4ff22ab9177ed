"""What `persistshard conformance` reports about the user's store beyond pass/fail: whether
an exclusive create is atomic, what the store answers to a repeated conditional PUT, and
whether the library keeps its promises when that store's responses are lost.

- `atomic_create`: `persistshard.conformance.storage.probe_atomic_create` (a second exclusive
  create of a key must be refused and leave the first bytes), as a sentence.
- `repeated_conditional_put`: a ``put_if_absent`` of a new key, then of the same key again:
  ``"exists"`` is the answer every store must give the second time (S3's 412 for
  ``If-None-Match: *``, ``EEXIST`` of a link); ``"accepted"`` means the store ignores the
  condition, ``"error: ..."`` that it answers neither.
- `lost_responses`: a short recorded run (`persistshard.conformance.recorder`) of processes
  reading and appending on a scratch shard whose blob is wrapped in
  `persistshard.conformance.faults.FaultyBlob` with its lost-response modes (``fail_after``:
  applied but reported failed, and any newer mode it has), checked for linearizability
  (`persistshard.conformance.linearizability`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from persistshard.conformance.recorder import (
    LOST_RESPONSE_MODES,
    Recording,
    Target,
    fault_plan,
    faulty_blob_modes,
    record,
)
from persistshard.conformance.storage import probe_atomic_create
from persistshard.core.storage.blob import Blob
from persistshard.errors import StorageUnsupported

log = logging.getLogger("persistshard.conformance.store_report")

#: How likely a storage call's response is lost in the `lost_responses` run.
LOST_PROBABILITY = 0.08


def atomic_create(blob: Blob, prefix: str = "") -> str:
    """``"holds"``, or ``"fails: <why>"``."""
    try:
        probe_atomic_create(blob, prefix=prefix)
    except StorageUnsupported as e:
        return f"fails: {e}"
    return "holds"


def repeated_conditional_put(blob: Blob, prefix: str = "") -> dict[str, str]:
    """The answers to a conditional create of a new key and then of the same key again
    (``first``: ``"created"``; ``second``: ``"exists"``, or ``"accepted"`` when the store
    ignores the condition; either may be ``"error: ..."``), and which bytes
    the key holds afterwards (``kept``: ``"first"``, ``"second"``, ``"none"``)."""
    key = f"{prefix}repeat-{uuid.uuid4().hex}"

    def attempt(data: bytes, again: bool) -> str:
        try:
            created = blob.put_if_absent(key, data)
            return ("accepted" if again else "created") if created else "exists"
        except Exception as e:  # the answer is what is reported
            return f"error: {type(e).__name__}: {e}"

    try:
        first = attempt(b"first", False)
        second = attempt(b"second", True)
        data = blob.get(key)
    finally:
        blob.delete(key)
    kept = {b"first": "first", b"second": "second", None: "none"}.get(data, "other bytes")
    if second != "exists" or kept != "first":
        log.warning(
            "%s: a repeated conditional create answered %r and the key kept %s bytes: the "
            "store does not keep the condition",
            getattr(blob, "url", "the store"),
            second,
            kept,
        )
    return {"first": first, "second": second, "kept": kept}


def lost_response_faults() -> list[str]:
    """The lost-response faults the FaultyBlob of this version injects."""
    modes = faulty_blob_modes()
    return [m for m in LOST_RESPONSE_MODES if m in modes]


def lost_responses(
    location: str,
    storage_options: Mapping[str, Any],
    consensus: str | None = None,
    *,
    seed: int = 0,
    workers: int = 3,
    ops: int = 12,
) -> Recording:
    """A short linearizability run at the (empty, scratch) ``location`` with the store's
    responses lost (module docstring)."""
    target = Target(location, dict(storage_options), consensus or None)
    plan = fault_plan(lost_response_faults(), probability=LOST_PROBABILITY)
    log.info(
        "%s: a checked run of %d processes with %s, each on %.0f%% of the store's calls",
        location,
        workers,
        ", ".join(plan.names),
        LOST_PROBABILITY * 100,
    )
    return record(target, plan, seed=seed, workers=workers, ops=ops, max_kills=0, timeout=120)


def describe(rec: Recording) -> str:
    """One line: linearizable or not, and how much was lost."""
    verdict = (
        "linearizable, every acknowledged append there once"
        if not rec.problems()
        else ("NOT linearizable or lost data")
    )
    return (
        f"{verdict}: {rec.count('read')} reads, {rec.count(outcome='ok') - rec.count('read')} "
        f"acknowledged, {rec.count(outcome='refused')} refused, "
        f"{rec.count(outcome='unknown')} indeterminate appends; "
        f"{rec.injected} responses lost (faults {rec.plan.names})"
    )
