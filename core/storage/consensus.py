"""Consensus: a linearizable, versioned log per shard, with compare-and-set at its head.

Contract (every implementation; tested by `persistshard.conformance`):
- Versions start at 1 and increase by exactly one per successful `compare_and_set`.
- ``compare_and_set(expected, data)`` appends ``data`` as version ``expected + 1`` (``expected``
  is None for an empty log) if and only if the head is currently ``expected``. Of any number of
  racing callers with the same ``expected``, at most one succeeds. Implementations are required
  to be linearizable: once a call returns True, every later `head` sees that version or a newer.
- A ``compare_and_set`` that raises `Indeterminate` may or may not have appended. Callers
  resolve it by reading the log (entries carry the caller's own commit id).
- ``scan(from_version)`` returns the entries at or after ``from_version`` in order.
- ``truncate(below)`` deletes entries with versions < ``below``; it never deletes the head.

`BlobConsensus` keeps the log next to the data, one object per version, using the blob's atomic
put-if-absent. Truncation deletes old versions, so a writer that read the head long ago could
re-create a truncated version number (its put-if-absent succeeds on the freed key): such an
entry is a *stale re-creation* and must never be reported as a successful compare-and-set nor
be seen by a reader. Truncation therefore leaves a durable low-water mark, the *floor*: before
it deletes anything below ``b`` it creates ``consensus/floor/f<b:020d>``, and it deletes older
markers only after writing a higher one, so the highest marker is never removed and the floor
(the highest marker, 0 without any) only rises. What always holds, and what every check below
relies on:

- floor <= head: truncation never deletes the head and writes a marker only below it.
- An entry at version ``v`` that exists while the floor is ``<= v`` is the original one: a
  re-creation of ``v`` needs the original deleted first, which needs a marker above ``v``
  first. So an entry is trusted only if a floor read *after* reading (or creating) it is
  ``<= v``; `head` and `scan` check that, and a compare-and-set that created ``v`` does too.
- A compare-and-set reads the floor after its put-if-absent, and before it too unless it
  builds on the entry the same object last wrote or trusted less than
  `TRUST_OWN_ENTRY_SECONDS` ago (an expected version below the floor is no longer the head:
  False, nothing written; so a handle whose state predates a truncation is refused
  determinately, never left `Indeterminate`). A created entry that fails the
  check is withdrawn (it is below the floor either way) and its successor, if that is
  trusted, tells which case it was: each entry's header names its predecessor's digest, so a
  successor naming another entry proves a re-creation (False), one naming this entry proves
  the commit landed and the log moved on (True); no trusted successor: `Indeterminate`.
- A put-if-absent that reports "exists", or fails, is never taken at its word: client
  libraries retry behind our back (S3: the first PUT applied, its answer lost, the retry
  gets 412; NFS: EEXIST from a retried link), so the entry is read back, and if it holds
  this call's own bytes (unique: the commit carries its id and time) it was created by this
  call. Other bytes are a lost race (False); nothing readable is `Indeterminate`. One get,
  on that path only.

Finding the head does not list the log: versions are created one after another and only ever
deleted from below, so the retained versions are contiguous up to the head. A hint (the last
head this object saw, else the best-effort ``consensus/HEAD`` object) is probed upward until a
version is missing; only a missing hint (truncated, or never written) falls back to listing.
The hint may be stale but never makes the answer wrong: probing always reaches the true head,
and the floor check rejects a probe that ended on a stale re-creation (probing then starts
again from the floor). Each head and scan lists ``consensus/floor/`` (a few markers at most)
once, each compare-and-set once after its put (and once before, unless it builds on the entry
this object wrote or trusted last, moments ago).
Before its first write, each `BlobConsensus` makes sure its store honours a conditional
create (`check_atomic_create`: a probe under a temporary key, once per process and store), so
storage that ignores ``If-None-Match`` is `StorageUnsupported` before anything is published.
A certain refusal of the storage (permission denied, read-only, disk full) before or at the
put is `StorageError` (nothing applied), never `Indeterminate`.
``consensus/HEAD`` is rewritten only at version 1 and every `HINT_EVERY`-th version (4: a
quarter of the commits pay a third request beside their put-if-absent and floor list), so a
fresh reader probes at most `HINT_EVERY` entries past it (each probe one get: the trade is a
put on one commit in four for up to twelve gets fewer on every fresh head read); readers
never write it (a reader needs no write permission). It is written without
syncing (`Blob.put_hint`): after a crash it may be missing, older, empty or torn, and any of
those only makes a reader probe from lower or list. `HINT_EVERY` divides
`persistshard.core.storage.layout.ROLLUP_EVERY`, so the hint is never below the newest rollup and
gc's truncation (which keeps the versions from the newest rollup on) never removes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.storage.blob import Blob, is_certain_refusal, temporary_name, unobserved
from persistshard.core.storage.layout import (
    CONSENSUS_PREFIX,
    IDENTITY_KEY,
    LEGACY_LOG_HOME_KEY,
    ROLLUP_EVERY,
    new_id,
)
from persistshard.errors import (
    CorruptData,
    Indeterminate,
    InvalidOption,
    StorageError,
    StorageUnsupported,
    storage_error,
)

log = logging.getLogger("persistshard.core.storage.consensus")


@dataclass(frozen=True)
class VersionedData:
    """One log entry: its version and its bytes."""

    version: int
    data: bytes

    @functools.cached_property
    def digest(self) -> str:
        """A short content hash, by which the next entry names this one (computed once per
        object: a head read and the shared state it is matched against ask for it twice)."""
        return hashlib.sha256(self.data).hexdigest()[:32]


class Consensus(ABC):
    """A versioned log with compare-and-set at its head (see the module docstring)."""

    #: A consensus that forwards every call to another (fault injection, tracing) names it
    #: here: where the log lives is the wrapped one's (`underlying`).
    wrapped: Consensus | None = None

    def entry_name(self, version: int) -> str:
        """How messages name the stored entry of ``version`` (its file, where there is one)."""
        return f"consensus version {version}"

    @property
    def shared(self) -> bool:
        """Whether other processes see the same log (what Spark needs); declared by each
        implementation."""
        return True

    @property
    def certain_lost_races(self) -> bool:
        """Whether a False from `compare_and_set` is certain: nothing of the call landed
        (an implementation that checks what its storage reports, as `BlobConsensus` reads
        back every "exists"). False (the default): a lost race may be a retried request that
        met its own first delivery, so the state machine looks for the commit in the log
        before it reports a refusal after one."""
        return False

    @property
    def cache_key(self) -> str | None:
        """A name under which every consensus object of this process reading the same log
        may share the states read from it (`persistshard.core.statemachine.machine`), or
        None (the default: the states of this object are its own). Sharing is only ever
        done on an exact match of the head entry's version and digest, so a key that two
        different logs share costs misses, never a wrong state."""
        return None

    @abstractmethod
    def head(self) -> VersionedData | None:
        """The newest entry, or None for an empty log."""

    @abstractmethod
    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        """Append ``data`` as version ``(expected or 0) + 1`` iff the head is ``expected``."""

    @abstractmethod
    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        """Entries with version >= ``from_version``, oldest first."""

    @abstractmethod
    def truncate(self, below: int) -> int:
        """Delete entries with version < ``below`` (never the head); return how many."""

    def destroy(self) -> None:
        """Delete the whole log, head included: the end of a shard's drop
        (`persistshard.core.fork.drop`, after its ``drop`` commit), after which the log reads
        as empty. Idempotent. Not atomic: a crash may leave part of it, which a rerun deletes
        (the drop's marker says to). A consensus that cannot raises `NotImplementedError`."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete a shard's log")

    def oldest_stored(self) -> int | None:
        """The lowest version whose entry is still stored, trusted or not (what a truncation
        would delete from: a truncation cut short leaves entries that `scan` no longer
        returns), or None for an empty log."""
        first = self.scan(1, 1)
        return first[0].version if first else None


#: How long after this object wrote or trusted an entry a compare-and-set building on it
#: skips the floor read before its put (see `BlobConsensus.compare_and_set`).
TRUST_OWN_ENTRY_SECONDS = 0.5

#: ``consensus/HEAD`` is written at version 1 and at every multiple of this (see above).
HINT_EVERY = 4
assert ROLLUP_EVERY % HINT_EVERY == 0

_ENTRY = re.compile(r"^v(\d{20})\.json$")
_PREFIX = CONSENSUS_PREFIX
_HINT = f"{_PREFIX}HEAD"
_FLOOR_PREFIX = f"{_PREFIX}floor/"
_FLOOR = re.compile(r"^f(\d{20})$")
#: How often `head` starts again from a risen floor before giving up (truncation keeps racing).
MAX_RESTARTS = 64


def _key(version: int) -> str:
    return f"{_PREFIX}v{version:020d}.json"


def _floor_key(below: int) -> str:
    return f"{_FLOOR_PREFIX}f{below:020d}"


def _wrap(prev_digest: str | None, payload: bytes) -> bytes:
    head = json.dumps({"prev": prev_digest}).encode() + b"\n"
    return head + payload


def _unwrap(raw: bytes, key: str, location: str | None = None) -> tuple[str | None, bytes]:
    line, sep, payload = raw.partition(b"\n")
    if not sep:
        raise CorruptData("consensus entry has no header line", file=key, location=location)
    try:
        prev: Any = json.loads(line)["prev"]
        if prev is not None and not isinstance(prev, str):
            raise TypeError(f"predecessor digest {prev!r} is not a string")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptData(
            f"consensus entry header unreadable: {e}", file=key, location=location
        ) from e
    return prev, payload


#: The stores (`Blob.probe_key`) this process found honouring a conditional create.
ATOMIC_CREATE_CHECKED: set[Hashable] = set()
_CHECKED_LOCK = threading.Lock()


def create_or_read(blob: Blob, key: str, data: bytes) -> bytes | None:
    """`Blob.put_if_absent` of ``data`` under ``key``, then what ``key`` holds: ``data``
    when this call created it (also when its answer was lost, or the client's own retry
    reported "exists" for it), else the bytes another writer stored first, or None when it
    reported "exists" and nothing can be read. For keys whose bytes name their writer (a
    probe's random bytes, a marker's fresh id). A certain refusal, and an ``OSError`` after
    which nothing is stored under ``key``, propagate."""
    try:
        if blob.put_if_absent(key, data):
            return data
    except (StorageUnsupported, StorageError):  # certain: never read back as "unknown"
        raise
    except OSError as e:
        if is_certain_refusal(e):
            raise
        stored = blob.get(key)  # the answer may have been lost while the create applied
        if stored is None:
            raise
        return stored
    return blob.get(key)


def probe_atomic_create(blob: Blob) -> None:
    """Create a fresh key, create it again with other bytes, read it: raise
    `StorageUnsupported` unless the second create was refused and the first bytes stayed
    (an S3-compatible endpoint that ignores ``If-None-Match`` accepts both).

    The key is ``consensus/.tmp-<time><random>-probe``: inside the shard's own prefixes and a
    temporary name, so a crash that leaves it behind leaves neither a foreign file (which
    would refuse creating a shard) nor anything a shard reads; gc removes old temporaries.
    It is deleted afterwards. Lost responses and the client's own retries are tolerated
    (read back); an ``OSError`` that leaves the answer unknown propagates."""
    key = f"{CONSENSUS_PREFIX}{temporary_name()}-probe"
    first, second = f"probe {uuid.uuid4().hex}".encode(), b"second"
    try:
        if create_or_read(blob, key, first) != first:
            raise StorageUnsupported(
                "an exclusive create of a new key reported that the key exists; the default "
                "consensus needs an atomic put-if-absent",
                location=blob.url,
            )
        try:
            again: bool | None = blob.put_if_absent(key, second)
        except (StorageUnsupported, StorageError):
            raise
        except OSError:
            again = None  # what is stored now tells
        kept = blob.get(key)
    finally:
        try:
            blob.delete(key)
        except OSError as e:
            log.info("%s: could not remove the probe %s (%s); gc removes it", blob.url, key, e)
    if again or kept != first:
        log.warning("%s: the storage accepted a second exclusive create of %s", blob.url, key)
        raise StorageUnsupported(
            "the storage accepted a second exclusive create of the same key (it ignores the "
            "condition If-None-Match, or has no atomic put-if-absent): two writers could both "
            "commit the same version and acknowledged commits would be lost. Use storage "
            "with an atomic put-if-absent (S3, local files) or a database consensus "
            "(consensus=postgresql://... or sqlite:///...)",
            location=blob.url,
        )


def check_atomic_create(blob: Blob) -> None:
    """`probe_atomic_create`, once per process and store (`Blob.probe_key`; a blob without a
    key is probed each time). Only a passing probe is remembered: a store that failed it is
    refused again on every write."""
    key = blob.probe_key()
    if key is not None:
        with _CHECKED_LOCK:
            if key in ATOMIC_CREATE_CHECKED:
                return
    probe_atomic_create(blob)
    log.debug("%s: conditional create honoured (probed)", blob.url)
    if key is not None:
        with _CHECKED_LOCK:
            ATOMIC_CREATE_CHECKED.add(key)


class BlobConsensus(Consensus):
    """The default consensus: one object per version under ``consensus/`` of the shard's blob.

    Requires a blob whose put-if-absent is atomic (local files, memory, S3); refuses others
    with `StorageUnsupported`. Each stored entry is a one-line JSON header naming the digest
    of its predecessor, then the caller's bytes; `VersionedData.data` is the caller's bytes.
    Truncation leaves floor markers under ``consensus/floor/`` (see the module docstring).
    """

    def __init__(self, blob: Blob) -> None:
        if not blob.supports_atomic_create:
            raise StorageUnsupported(
                f"the {blob.protocol!r} filesystem has no atomic put-if-absent, which the "
                "default consensus needs; pass consensus=... with an implementation that "
                "can compare-and-set",
                location=blob.url,
            )
        self.blob = blob
        self._hint = 0
        # (version, digest) of the newest *trusted* entry this object read or wrote (checked
        # against the floor): the predecessor digest of its next compare-and-set.
        self._seen: tuple[int, str] | None = None
        self._seen_at = 0.0  # when ``_seen`` was read or written (monotonic clock)
        # The highest floor this object has read (the floor only rises).
        self._floor_seen = 0
        # Whether this object's store passed the atomic-create probe (before its first write).
        self._create_checked = False
        # The entries the last `head` read while probing for the head, kept for the `scan`
        # that follows it (a state read scans the entries from the newest rollup on, the
        # probe's among them: up to `HINT_EVERY` gets twice). Consumed by that scan.
        self._probed: dict[int, tuple[str | None, VersionedData]] = {}

    def entry_name(self, version: int) -> str:
        return _key(version)

    @property
    def certain_lost_races(self) -> bool:
        return True  # every "exists" and every failed create is read back (`_read_back`)

    @property
    def cache_key(self) -> str:
        return f"blob:{self.blob.url}"

    @property
    def shared(self) -> bool:
        return self.blob.capabilities.shared

    def floor(self) -> int:
        """The truncation floor now: every version below it may be gone or a stale
        re-creation; every entry at or above it that exists is the original."""
        best = 0
        for meta in self.blob.list(_FLOOR_PREFIX):
            m = _FLOOR.match(meta.key[len(_FLOOR_PREFIX) :])
            if m:
                best = max(best, int(m.group(1)))
        self._floor_seen = max(self._floor_seen, best)
        return best

    def _read_hint(self) -> int:
        if self._hint:
            return self._hint
        try:
            raw = self.blob.get(_HINT)
            return int(raw) if raw else 0
        except (OSError, ValueError):
            return 0

    def _write_hint(self, version: int) -> None:
        self._hint = max(self._hint, version)
        if version != 1 and version % HINT_EVERY:
            return
        try:
            # Not synced: a lost, stale, empty or torn hint only makes a reader probe from
            # lower (or list), never answer wrong (tests/test_crash.py loses it on purpose).
            self.blob.put_hint(_HINT, str(version).encode())
        except OSError:
            pass  # only a hint: readers probe upward from whatever it says

    def _probe_from(self, start: int) -> tuple[str | None, VersionedData] | None:
        """The last entry of the run of versions starting at ``start``, if ``start`` exists."""
        found = self._read(start)
        if found is None:
            return None
        self._probed[start] = found
        while True:
            nxt = self._read(found[1].version + 1)
            if nxt is None:
                return found
            found = nxt
            self._probed[found[1].version] = found

    def _versions(self) -> list[int]:
        out = []
        for meta in self.blob.list(_PREFIX):
            m = _ENTRY.match(meta.key[len(_PREFIX) :])
            if m:
                out.append(int(m.group(1)))
        out.sort()
        return out

    def _read(self, version: int) -> tuple[str | None, VersionedData] | None:
        key = _key(version)
        raw = self.blob.get(key)
        if raw is None:
            return None
        prev, payload = _unwrap(raw, key, self.blob.url)
        return prev, VersionedData(version, payload)

    def _untrusted_head(self, start: int) -> VersionedData | None:
        """The end of the run of versions from ``start`` (else from the newest listed version);
        not yet checked against the floor."""
        if start > 0:
            found = self._probe_from(start)
            if found is not None:
                return found[1]
        for version in reversed(self._versions()):
            if version < start:
                break
            found = self._probe_from(version)
            if found is not None:
                return found[1]
        return None

    def head(self) -> VersionedData | None:
        self._probed = {}
        start = self._read_hint()
        for _ in range(MAX_RESTARTS):
            found = self._untrusted_head(start)
            floor = self.floor()
            if found is None:
                if start > floor:
                    # The hint is above every stored entry: `persistshard repair` dropped the
                    # newest (unreadable) ones. Look again from the floor, listing.
                    start = floor
                    continue
                if floor == 0:
                    return None  # never written (truncation always leaves the head)
                start = floor
                continue
            if found.version >= floor:
                # Trusted (read before this floor); and no version above it existed and was
                # truncated before that read, or the floor would be above it.
                self._hint = found.version
                self._seen = (found.version, found.digest)
                self._seen_at = time.monotonic()
                return found
            start = floor  # a stale re-creation: the log moved on and was truncated
        raise Indeterminate(
            f"the consensus head kept moving under truncation ({MAX_RESTARTS} tries); "
            "retry the read",
            location=self.blob.url,
        )

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        try:
            return self._compare_and_set(expected, data)
        except OSError as e:
            # Raised before the put-if-absent (every later error is read back or wrapped):
            # nothing was written. A certain refusal is said so, once.
            if is_certain_refusal(e):
                raise storage_error(e, self.blob.url, "commit (nothing was applied)") from e
            raise

    def check_store(self) -> None:
        """Refuse a store whose conditional create is not exclusive (`check_atomic_create`)
        before this object's first write of anything: the shard's identity marker
        (`mark_log_home`) or a log entry. Probed on the store itself, not through the request
        counting of operations (its cost is once per process and store)."""
        if not self._create_checked:
            check_atomic_create(unobserved(self.blob))
            self._create_checked = True

    def _compare_and_set(self, expected: int | None, data: bytes) -> bool:
        self.check_store()  # before the first write: nothing is published on a lying store
        base = expected or 0
        prev_digest: str | None = None
        if (
            base > 0
            and self._seen is not None
            and self._seen[0] == base
            and time.monotonic() - self._seen_at < TRUST_OWN_ENTRY_SECONDS
        ):
            # The entry this object last wrote or trusted, moments ago (entries are
            # immutable): no floor read first. If truncation passed ``base`` since, the
            # put-if-absent below either finds the entry after it (the floor is at most the
            # head: False) or re-creates a truncated one, which the floor read after it
            # withdraws (a truncation inside this short window may leave that
            # `Indeterminate`, as any truncation racing the call does). A writer committing
            # again and again thus pays two requests and a floor list, not two lists. An
            # older entry may predate a whole truncation: the floor is read first, so a
            # handle whose state is older than a truncation gets a determinate False.
            prev_digest = self._seen[1]
        else:
            if base > 0:
                prev = self._read(base)
                if prev is None:
                    return False  # truncated (the head moved past it) or never written
                prev_digest = prev[1].digest
            floor = self.floor()  # an OSError here: nothing was written
            if base < floor:
                return False  # the head is at or above the floor, so above ``base``
        new_version = base + 1
        raw = _wrap(prev_digest, data)
        try:
            created = self.blob.put_if_absent(_key(new_version), raw)
        except (StorageUnsupported, StorageError):  # certain: nothing was created
            raise
        except OSError as e:
            created = self._read_back(new_version, raw, e)
        else:
            if not created:
                created = self._read_back(new_version, raw, None)
        if not created:
            return False
        digest = VersionedData(new_version, data).digest
        try:
            floor = self.floor()
            if floor > new_version and not self._built_on(new_version, digest):
                log.warning(
                    "%s: withdrew a stale re-creation of version %d", self.blob.url, new_version
                )
                return False
        except OSError as e:
            raise Indeterminate(
                f"checking consensus version {new_version} against the truncation floor "
                f"failed ({e}); it may have been applied"
            ) from e
        self._seen = (new_version, digest)
        self._seen_at = time.monotonic()
        self._write_hint(new_version)
        return True

    def _read_back(self, version: int, raw: bytes, error: OSError | None) -> bool:
        """Whether the entry of ``version`` is the one this call tried to create (``raw``),
        after its put-if-absent reported "exists" (``error`` None) or failed (``error``).

        A client library retries behind our back: the server applied the first request, its
        answer was lost, and the retry reports "exists" (S3: 412; NFS: EEXIST) for our own
        object, or the call times out after it was applied. The entry's bytes are unique
        (the commit carries its own id and time), so equal bytes prove it is ours: True.
        Other bytes: another writer won, certainly (False). Missing, or unreadable: nothing
        tells, `Indeterminate` (the caller resolves it by the commit id). Costs one get, on
        this path only."""
        try:
            stored = self.blob.get(_key(version))
        except OSError as e:
            raise Indeterminate(
                f"writing consensus version {version} "
                + (f"failed ({error})" if error is not None else "reported it exists")
                + f" and reading it back failed ({e}); it may have been applied",
                location=self.blob.url,
            ) from (error or e)
        if stored == raw:
            log.info(
                "%s: consensus version %d %s, but holds this call's own entry (a retried "
                "request whose first answer was lost): created",
                self.blob.url,
                version,
                f"failed ({error})" if error is not None else "reported it exists",
            )
            return True
        if stored is not None:
            return False  # another writer's entry: a lost race, certainly
        if error is not None and is_certain_refusal(error):
            # Permission denied, read-only, disk full: refused, and nothing is there.
            raise storage_error(error, self.blob.url, "commit (nothing was applied)") from error
        if error is None:
            # It existed, and is gone: truncated since (the log moved past it).
            raise Indeterminate(
                f"consensus version {version} reported it exists, and was truncated before it "
                "could be read back; whether it was this commit is unknown",
                location=self.blob.url,
            )
        raise Indeterminate(
            f"writing consensus version {version} failed ({error}); it may have been applied",
            location=self.blob.url,
        ) from error

    def _built_on(self, version: int, digest: str) -> bool:
        """Whether the entry this object created at ``version``, now below the floor, was the
        original (True: the log moved on from it and truncated it) rather than a stale
        re-creation (withdrawn, False). Raises `Indeterminate` when nothing tells."""
        successor = self._read(version + 1)
        # The successor tells only if it is the original itself (a floor read after it).
        trusted = successor is not None and self.floor() <= version + 1
        self.blob.delete(_key(version))  # below the floor: truncated territory either way
        if successor is None or not trusted:
            raise Indeterminate(
                f"consensus version {version} was created, but the log was truncated past it "
                "before the creation could be confirmed; it may have been applied (re-read "
                "the shard)",
                location=self.blob.url,
            )
        return successor[0] == digest

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        # Entries the last head probe read count as read by this scan: they were read before
        # the floor read below, which is all the check needs (entries are never rewritten; a
        # version below the floor may be a stale re-creation, and is dropped either way).
        probed, self._probed = self._probed, {}
        out = self._untrusted_scan(from_version, limit, probed)
        floor = self.floor()
        # Entries read before this floor and at or above it are the originals; below it they
        # may be stale re-creations, so they are dropped (the caller sees the log start later).
        return [e for e in out if e.version >= floor]

    def _untrusted_scan(
        self,
        from_version: int,
        limit: int | None,
        probed: dict[int, tuple[str | None, VersionedData]] | None = None,
    ) -> list[VersionedData]:
        known = probed or {}
        start = max(from_version, 1, self._floor_seen)
        first = known.get(start) or self._read(start)
        if first is not None:  # contiguous from here: probe upward, no listing
            out = [first[1]]
            while limit is None or len(out) < limit:
                version = out[-1].version + 1
                nxt = known.get(version) or self._read(version)
                if nxt is None:
                    break
                out.append(nxt[1])
            return out
        out = []
        for version in self._versions():
            if version < start:
                continue
            entry = self._read(version)
            if entry is None:
                continue
            out.append(entry[1])
            if limit is not None and len(out) >= limit:
                break
        return out

    def oldest_stored(self) -> int | None:
        versions = self._versions()
        return versions[0] if versions else None

    def truncate(self, below: int) -> int:
        """Delete the versions below ``below`` (never the head): first raise the floor to the
        bound actually used (a durable marker), then delete the entries oldest first, then
        the lower markers (a lower marker is removed only once a higher one exists)."""
        versions = self._versions()
        if not versions:
            return 0
        bound = min(below, versions[-1])
        current = self.floor()
        if bound > current:
            self.blob.put_if_absent(_floor_key(bound), b"")
            current = bound
        deleted = 0
        for version in versions:
            if version >= current:
                break
            self.blob.delete(_key(version))
            deleted += 1
        for meta in self.blob.list(_FLOOR_PREFIX):
            m = _FLOOR.match(meta.key[len(_FLOOR_PREFIX) :])
            if m and int(m.group(1)) < current:
                self.blob.delete(meta.key)
        log.debug("%s: truncated %d log versions below %d", self.blob.url, deleted, current)
        return deleted

    def destroy(self) -> None:
        """`Consensus.destroy`: every entry (oldest first), then the head hint, then the floor
        markers (the entries they guarded are gone)."""
        for version in self._versions():
            self.blob.delete(_key(version))
        self.blob.delete(_HINT)
        for meta in self.blob.list(_FLOOR_PREFIX):
            self.blob.delete(meta.key)


class MemoryConsensus(Consensus):
    """An in-process consensus (a list under a lock), for tests and single-process use."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._entries: dict[int, bytes] = {}

    @property
    def shared(self) -> bool:
        return False  # a list in this process

    @property
    def certain_lost_races(self) -> bool:
        return True  # a list under a lock: nothing is lost between the call and its answer

    def head(self) -> VersionedData | None:
        with self._lock:
            if not self._entries:
                return None
            v = max(self._entries)
            return VersionedData(v, self._entries[v])

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        with self._lock:
            current = max(self._entries) if self._entries else 0
            if current != (expected or 0):
                return False
            self._entries[current + 1] = data
            return True

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        with self._lock:
            out = [
                VersionedData(v, d) for v, d in sorted(self._entries.items()) if v >= from_version
            ]
        return out[:limit] if limit is not None else out

    def truncate(self, below: int) -> int:
        with self._lock:
            if not self._entries:
                return 0
            head = max(self._entries)
            doomed = [v for v in self._entries if v < below and v < head]
            for v in doomed:
                del self._entries[v]
            return len(doomed)

    def destroy(self) -> None:
        with self._lock:
            self._entries.clear()


#: Next to the data of every shard written since shard ids: its identity (`LogHome`: the
#: shard id and where its log is), created once by `mark_log_home` and never rewritten.
LOG_HOME_KEY = IDENTITY_KEY

#: A `LogHome.log` value: the log is next to the data (`BlobConsensus`).
BLOB_LOG = "blob"
#: A `LogHome.log` value: the log is in a database (a `DatabaseLog`: SQLite, PostgreSQL).
DATABASE_LOG = "database"
#: A `LogHome.log` value: another consensus without an identity of its own (`MemoryConsensus`).
OTHER_LOG = "other"


@dataclass(frozen=True)
class LogHome:
    """A shard's identity as recorded next to its data (`LOG_HOME_KEY`, one JSON line).

    ``log`` says where its log is (`BLOB_LOG`, `DATABASE_LOG`, `OTHER_LOG`); ``shard_id`` is
    the key its log has in a database (a `new_id` made on the first write; on storage without
    an atomic put-if-absent the canonical location, see `mark_log_home`); ``database_id``
    names the one database that holds it (`DatabaseLog.database_id`); ``consensus`` is the
    redacted URL (or the type) the log was made with, for messages. ``legacy``: read from
    `LEGACY_LOG_HOME_KEY` (a database log from before shard ids, keyed by the location; only
    ``consensus`` is known)."""

    log: str
    shard_id: str | None
    database_id: str | None
    consensus: str
    legacy: bool = False

    def encode(self) -> bytes:
        fields: dict[str, Any] = {"format": 1, "log": self.log, "shard_id": self.shard_id}
        if self.database_id is not None:
            fields["database_id"] = self.database_id
        fields["consensus"] = self.consensus
        return json.dumps(fields, sort_keys=True).encode() + b"\n"

    @staticmethod
    def decode(raw: bytes, location: str) -> LogHome:
        try:
            fields = json.loads(raw)
            log_kind, shard_id = fields["log"], fields["shard_id"]
            database_id = fields.get("database_id")
            if not isinstance(log_kind, str) or not isinstance(shard_id, str) or not shard_id:
                raise TypeError("log and shard_id must be strings")
            if log_kind == DATABASE_LOG and not isinstance(database_id, str):
                raise TypeError("a database log names its database_id")
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(
                f"the shard's identity marker is unreadable ({e}); it is written once, before "
                "the shard's first version, and never rewritten",
                file=LOG_HOME_KEY,
                location=location,
            ) from e
        return LogHome(log_kind, shard_id, database_id, str(fields.get("consensus", "")))


class DatabaseLog(ABC):
    """A consensus that keeps the logs of many shards in one database, each under a key, and
    has an identity of its own (`database_id`), so that a shard's `LogHome` names exactly the
    database that holds its log, whatever URL spells it. Implemented by
    `persistshard.core.storage.sqlconsensus`."""

    #: The consensus URL without secrets (what messages and the marker show).
    redacted: str

    @abstractmethod
    def database_id(self) -> str:
        """The database's own random id, made when its tables were made (never changes)."""

    @abstractmethod
    def existing_database_id(self) -> str | None:
        """`database_id` without creating anything: None for a database that has none (a
        new file or database, or tables made before database ids), which therefore holds
        no log a `LogHome` names. What a check that must write nothing asks."""

    @abstractmethod
    def attach(self, home: Blob) -> None:
        """Key the log by the id of the shard whose data (and identity marker) is in
        ``home``, unless this object already reads a shard's marker."""

    @abstractmethod
    def bind_log(self, shard_id: str) -> None:
        """Key this object's log by ``shard_id`` (the id `mark_log_home` found or made)."""


def read_log_home(blob: Blob, location: str) -> LogHome | None:
    """The shard's recorded identity: `LOG_HOME_KEY`, else a legacy `LEGACY_LOG_HOME_KEY`
    (a `LogHome` with ``legacy`` set), else None (nothing written yet, or a shard logged next
    to its data before shard ids). One get; a second only when the first finds nothing."""
    raw = blob.get(LOG_HOME_KEY)
    if raw is not None:
        return LogHome.decode(raw, location)
    old = blob.get(LEGACY_LOG_HOME_KEY)
    if old is None:
        return None
    return LogHome(DATABASE_LOG, None, None, old.decode(errors="replace").strip(), legacy=True)


def _name_of(consensus: Consensus) -> str:
    return str(getattr(consensus, "redacted", type(consensus).__name__))


def underlying(consensus: Consensus) -> Consensus:
    """The consensus that holds the log, under any wrappers (`Consensus.wrapped`): the one
    the identity checks judge, whatever wraps it."""
    while consensus.wrapped is not None:
        consensus = consensus.wrapped
    return consensus


def refuse_other_home(home: LogHome, consensus: Consensus, location: str) -> None:
    """`InvalidOption` naming where the shard's log is, unless ``home`` is ``consensus``'s:
    the same kind of log and, for a database, the same database (by its id; a legacy marker
    is checked by the database consensus itself, which knows its URL forms)."""
    consensus = underlying(consensus)
    if isinstance(consensus, BlobConsensus):
        if home.log == BLOB_LOG:
            return
        where = "a database" if home.log == DATABASE_LOG else "another consensus"
        raise InvalidOption(
            f"the shard keeps its log in {where} ({home.consensus}), not next to its data: "
            "open it with that consensus (Python "
            "consensus=URL, Spark option consensus, CLI --consensus URL)",
            location=location,
        )
    if home.log == BLOB_LOG:
        raise InvalidOption(
            "the shard keeps its log next to its data (the default consensus), not in "
            f"{_name_of(consensus)}: open it without the consensus option",
            location=location,
        )
    if isinstance(consensus, DatabaseLog):
        if home.log != DATABASE_LOG:
            raise InvalidOption(
                f"the shard keeps its log in {home.consensus}, not in the database "
                f"{consensus.redacted}: open it with that consensus",
                location=location,
            )
        if home.legacy:
            return
        mine = consensus.existing_database_id()  # nothing is created in another database
        if home.database_id != mine:
            raise InvalidOption(
                f"the shard keeps its log in another database: {home.consensus} (database id "
                f"{home.database_id}), not {consensus.redacted} (database id "
                f"{mine or 'none yet'}); open it with the consensus that holds its log. "
                "Nothing was written",
                location=location,
            )
        return
    if home.log == DATABASE_LOG:
        raise InvalidOption(
            f"the shard keeps its log in a database ({home.consensus}), not in "
            f"{_name_of(consensus)}: open it with that consensus",
            location=location,
        )


def mark_log_home(blob: Blob, consensus: Consensus, location: str) -> LogHome:
    """Before a shard's first version is created: make sure its identity is recorded next to
    the data (`LOG_HOME_KEY`) and names ``consensus``, and key a database log by its id.

    - The marker is created with put-if-absent, never rewritten: every kind of consensus
      races on this one key, so of two first writers with different consensuses one loses
      here, before its log holds anything. A marker that exists already (another writer's,
      or this shard's from a writer that crashed before its first entry: the next writer
      completes that state, with the same id) must name ``consensus``, else `InvalidOption`
      and nothing is written: the marker is never re-pointed.
    - On storage without an atomic put-if-absent (only possible with a database log: the
      blob consensus refuses such storage) the id is the canonical ``location`` itself, so
      racing first writers on one database agree on the key without the storage's help; the
      marker is then a get, a put if absent, and a get to confirm (two *different* databases
      racing the first write there cannot be told apart by such storage: best effort).
    Returns the recorded identity. Costs one put-if-absent (a get more if it exists)."""
    consensus = underlying(consensus)
    if isinstance(consensus, BlobConsensus):
        consensus.check_store()  # a store that ignores the condition gets no marker either
        mine = LogHome(BLOB_LOG, None, None, "the default consensus, next to its data")
    elif isinstance(consensus, DatabaseLog):
        mine = LogHome(DATABASE_LOG, None, consensus.database_id(), consensus.redacted)
    else:
        mine = LogHome(OTHER_LOG, None, None, _name_of(consensus))
    found: LogHome | None
    if blob.supports_atomic_create:
        record = replace(mine, shard_id=new_id())
        encoded = record.encode()
        # Ours (also after a lost answer), or the marker a racing or crashed writer made.
        stored = create_or_read(blob, LOG_HOME_KEY, encoded)
        found = (
            record
            if stored == encoded
            else (LogHome.decode(stored, location) if stored is not None else None)
        )
    else:
        found = read_log_home(blob, location)
        if found is None or found.legacy:
            blob.put(LOG_HOME_KEY, replace(mine, shard_id=location).encode())
            found = read_log_home(blob, location)
    if found is None or found.legacy:
        raise OSError(
            f"{location}: the shard's identity marker {LOG_HOME_KEY} could not be read back "
            "after it was created; nothing was committed, try again"
        )
    refuse_other_home(found, consensus, location)
    if isinstance(consensus, DatabaseLog) and found.shard_id is not None:
        consensus.bind_log(found.shard_id)
    return found


def check_log_home(blob: Blob, consensus: Consensus, location: str) -> None:
    """Called when ``consensus`` holds no version of the shard: refuse if the shard's log is
    somewhere else (`InvalidOption` naming where), so a shard opened with the wrong consensus
    never looks empty and never takes a first write that forks its history.

    The blob consensus reads the marker (`read_log_home`: one get, two when there is none);
    a database consensus has read it already (it keys its log by the id in it) and lists the
    log's prefix for entries of a shard logged next to its data before shard ids (one
    listing). Only on an empty log: a shard with versions costs nothing here."""
    consensus = underlying(consensus)
    if isinstance(consensus, BlobConsensus) or not isinstance(consensus, DatabaseLog):
        home = read_log_home(blob, location)
        if home is not None:
            refuse_other_home(home, consensus, location)
        if isinstance(consensus, BlobConsensus):
            return
    if any(_ENTRY.match(m.key[len(_PREFIX) :]) for m in blob.list(_PREFIX)):
        raise InvalidOption(
            "the shard keeps its log next to its data (the default consensus), not in "
            f"{_name_of(consensus)}: open it without the consensus option",
            location=location,
        )
