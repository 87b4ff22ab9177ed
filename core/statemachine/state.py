"""The shard model: `ShardState`, its parts, and the checks every state and transition pass.

A state version is a pure fold of commits: ``state(N) = apply(state(N-1), commit(N))`` (the
commits: `persistshard.core.statemachine.commits`; their stored form:
`persistshard.core.statemachine.encoding`). This module holds what a state is made of
(`PartRef`, `Batch`, `Hold`, `BatchIdentity`), the named preconditions commits assert
(classes named ``Assert...``), the rules commits share (released leases, since following the
retention, pruned writer records) and `check_transition`, the check of every new state before
its compare-and-set. Everything here is pure.

Invariants of a `ShardState` (checked by `ShardState.check`):
- ``0 <= since <= upper``; both only move forward.
- Trace batches cover consecutive, non-overlapping time intervals ``[lower, upper)``, oldest
  first, the first starting at 0 and the last ending at ``upper`` (a shard that was never
  written has none); a batch with no parts may stand for a seal; every update in a trace
  batch has a time in its interval, or was forwarded to a time ``<= since`` by logical compaction.
- Compaction levels are non-increasing from oldest to newest trace batch.
- Unsealed batches hold updates at times ``>= `` the upper at which they were written; they are
  durable and become visible once ``upper`` passes their times. ``min_time <= max_time``.
- A part key is referenced by at most one batch; batch ids are unique.
- Reader holds: ``since <= hold.since`` for every hold that was live when since last moved
  (`advance_since` stops at the smallest live hold). A hold is live until its lease runs out:
  ``expires_ms`` is compared with the committing clock (``Commit.at_ms``), and every commit that
  carries a time removes the holds that had run out by then.
- Durable consumers (`persistshard.core.statemachine.consumers`): ``since <= position <= upper``
  for every consumer, and since moves no further than ``position - 1`` (`ShardState.hold_floor`),
  so the updates from a consumer's position on stay exact; a consumer has no lease.
- Batches and parts are immutable: a batch is replaced, never changed.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import crc32c
import pyarrow as pa

from persistshard.core.statemachine import retention as ret
from persistshard.core.storage.layout import PARTS_PREFIX
from persistshard.errors import (
    CorruptData,
    HoldExpired,
    InvalidOption,
    InvalidUpdates,
    PersistShardError,
    StateConflict,
    UpperMismatch,
)

# One path segment: no separator, drive or scheme colon, backslash or control character.
_SEGMENT = re.compile(r"^[^/\\:\x00-\x1f\x7f]+$")


def key_problem(key: object, prefix: str = PARTS_PREFIX) -> str | None:
    """Why ``key`` is not a canonical key inside the shard under ``prefix``, or None.

    Canonical: a string starting with ``prefix`` (so never absolute and never another
    shard's), then at least one segment; no segment is empty, ``.`` or ``..``, and none holds
    a scheme or drive colon, a backslash or a control character. So two different keys never
    name the same object (``parts/w/./p.part`` would alias ``parts/w/p.part``, and gc
    deleted a live part through such an alias) and no key reads outside the shard.
    """
    if not isinstance(key, str):
        return f"key {key!r} is not a string"
    if not key.startswith(prefix):
        return f"key {key!r} is not under {prefix}"
    for segment in key[len(prefix) :].split("/"):
        if segment in ("", ".", ".."):
            return f"key {key!r} has an empty, '.' or '..' segment"
        if not _SEGMENT.match(segment):
            return f"key {key!r} has a segment with ':', '\\' or a control character"
    return None


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: Hard limit on one inline part's bytes (`PartRef.inline`): a state (and every consensus
#: entry naming it) stays small whatever a writer asks for. Writers inline far less
#: (``inline_bytes`` of a shard's configuration, `persistshard.core.config`).
MAX_INLINE_PART_BYTES = 64 << 10


@dataclass(frozen=True)
class SourceRef:
    """The shard that owns a part a fork names (`PartRef.source`): its identity (the shard id
    in its ``consensus/IDENTITY``) and its canonical location. The part's key stays a
    canonical key *inside that shard* (`key_problem` holds for it as for any key), and it is
    read from the owner's store (`persistshard.core.storage.parts.open_part`): no key ever
    leaves its shard."""

    shard_id: str
    location: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.shard_id, "location": self.location}

    @staticmethod
    def from_json(d: dict[str, Any]) -> SourceRef:
        shard_id, location = d["id"], d["location"]
        if not isinstance(shard_id, str) or not isinstance(location, str):
            raise TypeError(f"source reference {d!r} is not an id and a location")
        return SourceRef(shard_id, location)


@dataclass(frozen=True)
class PartRef:
    """A part of a batch: its key under the shard, size, rows and time range.

    ``rewrite_time``, when set, is the time of *every* update of the part, whatever time the
    part's bytes say: a plain append that lost a race is committed at the newer upper without
    rewriting its parts (after persist's ``ts_rewrite``). Then ``min_time == max_time ==
    rewrite_time``; every reader applies it (`persistshard.core.storage.parts.adapt_part_table`).

    ``inline``, when set, holds the part's bytes (our part format, the same bytes a part file
    would hold) inside the state itself: a small append commits them in its log entry instead
    of writing a file (`persistshard.core.storage.parts`). Then ``key`` is a canonical part key
    that names no stored object (gc never finds it, so never deletes anything for it),
    ``size == len(inline) <= MAX_INLINE_PART_BYTES`` and ``inline_crc`` is the bytes' crc32c;
    `ShardState.check` verifies all three and that the footer agrees with ``num_rows`` and the
    time range. Stored as base64 in the entry or rollup JSON.

    ``source``, when set, says the part belongs to another shard (a fork names its source's
    parts, `persistshard.core.fork`): ``key`` is a key inside *that* shard, read from its
    store; this shard's gc never deletes it (it lists only its own store) and the owner's gc
    keeps it while the owner's state records the fork (`ShardState.forks`). Never inline.
    """

    key: str
    size: int
    num_rows: int
    min_time: int
    max_time: int
    rewrite_time: int | None = None
    inline: bytes | None = None
    inline_crc: int | None = None
    source: SourceRef | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "key": self.key,
            "size": self.size,
            "rows": self.num_rows,
            "min_time": self.min_time,
            "max_time": self.max_time,
        }
        if self.rewrite_time is not None:
            d["rewrite_time"] = self.rewrite_time
        if self.inline is not None:
            d["inline"] = base64.b64encode(self.inline).decode()
            d["crc"] = self.inline_crc
        if self.source is not None:
            d["source"] = self.source.to_json()
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> PartRef:
        inline = d.get("inline")
        source = d.get("source")
        return PartRef(
            d["key"],
            d["size"],
            d["rows"],
            d["min_time"],
            d["max_time"],
            d.get("rewrite_time"),
            base64.b64decode(inline, validate=True) if inline is not None else None,
            d.get("crc") if inline is not None else None,
            SourceRef.from_json(source) if source is not None else None,
        )

    def at_time(self, time: int) -> PartRef:
        """This part with every update read at ``time`` (a rebased plain append)."""
        return replace(self, min_time=time, max_time=time, rewrite_time=time)

    def stored(self) -> PartRef:
        """This part as a reference to a part file (its inline bytes dropped)."""
        return replace(self, inline=None, inline_crc=None)

    def inline_problem(self) -> str | None:
        """Why this inline part's bytes disagree with its reference, or None (also for a part
        that is not inline). Checks size, crc32c, and the footer's rows and time range."""
        if self.inline is None:
            return None
        data = self.inline
        if not isinstance(data, bytes):
            return f"inline part {self.key} holds {type(data).__name__}, not bytes"
        if len(data) != self.size or len(data) > MAX_INLINE_PART_BYTES:
            return (
                f"inline part {self.key} has {len(data)} bytes, its reference says {self.size} "
                f"(at most {MAX_INLINE_PART_BYTES})"
            )
        if not is_count(self.inline_crc) or crc32c.crc32c(data) != self.inline_crc:
            return f"inline part {self.key} fails its crc32c check"
        from persistshard.format import PartReader  # format never imports core

        try:
            reader = PartReader.from_bytes(self.key, data)
        except (PersistShardError, ValueError, KeyError, TypeError) as e:
            return f"inline part {self.key} does not decode: {e}"
        if reader.num_rows != self.num_rows:
            return (
                f"inline part {self.key} holds {reader.num_rows} rows, its reference says "
                f"{self.num_rows}"
            )
        lows = [c.min_time for c in reader.chunks if c.num_rows and c.min_time is not None]
        highs = [c.max_time for c in reader.chunks if c.num_rows and c.max_time is not None]
        if self.rewrite_time is None and lows and highs:
            lo, hi = min(lows), max(highs)
            if (lo, hi) != (self.min_time, self.max_time):
                return (
                    f"inline part {self.key} holds times {lo}..{hi}, its reference says "
                    f"{self.min_time}..{self.max_time}"
                )
        return None


@dataclass(frozen=True)
class Batch:
    """A batch of updates: its parts, sorted by (row, time) within each part.

    A trace batch describes the interval ``[lower, upper)`` and carries a compaction
    ``level``; its parts together are consolidated as of ``since`` when ``compacted``. An
    unsealed batch uses ``lower``/``upper`` for the min time and max time + 1 of its updates.
    """

    id: str
    lower: int
    upper: int
    parts: tuple[PartRef, ...]
    level: int = 0
    since: int = 0

    @property
    def num_rows(self) -> int:
        return sum(p.num_rows for p in self.parts)

    @property
    def size_bytes(self) -> int:
        return sum(p.size for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "lower": self.lower,
            "upper": self.upper,
            "level": self.level,
            "since": self.since,
            "parts": [p.to_json() for p in self.parts],
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Batch:
        return Batch(
            id=d["id"],
            lower=d["lower"],
            upper=d["upper"],
            parts=tuple(PartRef.from_json(p) for p in d["parts"]),
            level=d.get("level", 0),
            since=d.get("since", 0),
        )


@dataclass(frozen=True)
class ForkPin:
    """What a shard keeps for one of its forks (`ShardState.forks`, keyed by the fork's shard
    id): the fork's canonical ``location``, the ``keys`` of this shard's own parts the fork was
    created naming, and ``at_ms``, when the pin was recorded (the committing clock).

    The pin is recorded by the source *before* the fork's first entry exists, so a fork never
    names a part its source's gc may delete; gc keeps every pinned key
    (`ShardState.kept_keys`). A fork only ever names fewer of them (its compactions write its
    own parts), never more, so the keys are a superset of what the fork names. The pin goes
    (``release_fork``) when the fork's gc finds no live version of the fork naming them, when
    the fork is dropped, or when gc finds it dangling (no fork at ``location`` with this id,
    more than `PIN_PENDING_MS` after ``at_ms``: a fork creation that died)."""

    location: str
    keys: tuple[str, ...]
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "keys": list(self.keys), "at_ms": self.at_ms}

    @staticmethod
    def from_json(d: dict[str, Any]) -> ForkPin:
        location, keys, at_ms = d["location"], d["keys"], d["at_ms"]
        if not isinstance(location, str) or not isinstance(keys, list) or not is_count(at_ms):
            raise TypeError(f"fork pin {d!r} is not a location, keys and a time")
        return ForkPin(location, tuple(keys), at_ms)


@dataclass(frozen=True)
class TxnsRef:
    """A data shard's registration with a txns shard (`ShardState.txns`,
    `persistshard.core.txns`): the txns shard's identity (its shard id) and canonical
    location, and ``at``, the time it was registered at. While it is set, the shard's logical
    upper is the txns shard's, and only ``apply_txn`` commits add data to it."""

    shard_id: str
    location: str
    at: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.shard_id, "location": self.location, "at": self.at}

    @staticmethod
    def from_json(d: dict[str, Any]) -> TxnsRef:
        shard_id, location, at = d["id"], d["location"], d["at"]
        if not isinstance(shard_id, str) or not isinstance(location, str) or not is_count(at):
            raise TypeError(f"txns registration {d!r} is not an id, a location and a time")
        return TxnsRef(shard_id, location, at)


@dataclass(frozen=True)
class TxnPin:
    """The parts a transaction wrote to a registered data shard, pinned before the txns
    shard's commit names them (`ShardState.txn_pins`, keyed by the transaction's id): gc keeps
    ``keys`` (`ShardState.kept_keys`) from the pin until ``apply_txn`` adopts them (which
    removes the pin) or ``release_txn`` drops it (a transaction that lost its race, or one that
    died: no commit of it more than `PIN_PENDING_MS` after ``at_ms``)."""

    keys: tuple[str, ...]
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "at_ms": self.at_ms}

    @staticmethod
    def from_json(d: dict[str, Any]) -> TxnPin:
        keys, at_ms = d["keys"], d["at_ms"]
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise TypeError(f"txn pin keys {keys!r} are not strings")
        if not is_count(at_ms):
            raise TypeError(f"txn pin time {at_ms!r} is not a time")
        return TxnPin(tuple(keys), at_ms)


#: A fork pin whose fork has no first entry this long after the pin was recorded is
#: dangling (the creation died): gc releases it. The creator never commits the fork's first
#: entry later than half of this after recording the pin (`persistshard.core.fork`).
PIN_PENDING_MS = 3600 * 1000


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class Hold:
    """A reader's hold on since: the shard's since does not pass ``since`` while the hold is
    live, i.e. until ``expires_ms`` (ms since the epoch) on the committing clock. The lease
    (``lease_ms``) is what every renewal adds to the renewing commit's time."""

    since: int
    expires_ms: int
    lease_ms: int

    def live_at(self, now_ms: int) -> bool:
        return now_ms < self.expires_ms

    def to_json(self) -> list[int]:
        return [self.since, self.expires_ms, self.lease_ms]

    @staticmethod
    def from_json(d: list[int]) -> Hold:
        return Hold(int(d[0]), int(d[1]), int(d[2]))


@dataclass(frozen=True)
class ConsumerPosition:
    """A durable consumer's record (`persistshard.core.statemachine.consumers`): it has read
    every update at a time below ``position``; ``moved_ms`` is the commit time (ms since the
    epoch, the committing clock) of the commit that created it or last moved it."""

    position: int
    moved_ms: int

    def holds_since_at(self) -> int:
        """How far this consumer lets since go: ``position - 1`` (0 at position 0), so a read
        of the updates from ``position`` stays exact (`check_updates_range`)."""
        return max(0, self.position - 1)

    def to_json(self) -> list[int]:
        return [self.position, self.moved_ms]

    @staticmethod
    def from_json(d: list[int]) -> ConsumerPosition:
        return ConsumerPosition(int(d[0]), int(d[1]))


@dataclass(frozen=True)
class BatchIdentity:
    """What identifies a streaming writer's micro-batch besides its number (each part None
    when unknown): ``digest``, a multiset hash of the batch's rows as the sink received them
    (`persistshard.datasource.replay.Digest`, versioned text), and ``query_id``, the id of the
    Spark query that ran it (kept in the query's checkpoint: a new checkpoint has a new one)."""

    digest: str | None = None
    query_id: str | None = None

    def known(self) -> bool:
        return self.digest is not None or self.query_id is not None

    def to_json(self) -> dict[str, str]:
        out = {}
        if self.digest is not None:
            out["digest"] = self.digest
        if self.query_id is not None:
            out["query"] = self.query_id
        return out

    @staticmethod
    def from_json(d: dict[str, Any] | None) -> BatchIdentity:
        if not d:
            return BatchIdentity()
        digest, query = d.get("digest"), d.get("query")
        return BatchIdentity(
            digest=str(digest) if digest is not None else None,
            query_id=str(query) if query is not None else None,
        )


class WriterBatch(tuple[str, int]):
    """A ``(writer id, batch id)`` pair that also carries its batch's `BatchIdentity`; it goes
    wherever such a pair goes (``writer=`` of a commit) and `append_commit` records both."""

    identity: BatchIdentity

    def __new__(cls, writer_id: str, batch_id: int, identity: BatchIdentity) -> WriterBatch:
        self = super().__new__(cls, (writer_id, batch_id))
        self.identity = identity
        return self

    def __getnewargs__(self) -> tuple[str, int, BatchIdentity]:
        return (self[0], self[1], self.identity)


class WriterVerdict:
    """What `judge_writer_batch` says of a micro-batch: commit it, or it is a replay."""

    NEW = "new"
    REPLAY = "replay"


def judge_writer_batch(
    state: ShardState,
    writer_id: str,
    batch_id: int,
    identity: BatchIdentity,
    location: str | None,
) -> str:
    """Whether micro-batch ``batch_id`` of ``writer_id`` is new (`WriterVerdict.NEW`) or a
    replay of the batch the shard recorded last (`WriterVerdict.REPLAY`); raises
    `InvalidUpdates` naming the checkpoint when it is neither.

    Only the recorded batch id itself can be a replay: Spark writes its commit log entry for
    batch N after the sink committed N, so after a crash it re-runs at most that batch. It is a
    replay when both name the same query (the same checkpoint: Spark re-runs a batch over the
    same offsets, whatever a nondeterministic query then computes), or when the rows' digests
    are equal; when either side does not know its identity (a record or a caller from before
    identities were kept) the equal id alone decides, as it always did. An id below the record
    means the checkpoint that numbered the batches was lost or replaced (Spark numbers them
    from 0 again): refused, as is the recorded id with other rows from another query.
    """
    last = state.writers.get(writer_id)
    if last is None or batch_id > last:
        return WriterVerdict.NEW
    if batch_id == last:
        recorded = state.writer_batches.get(writer_id, BatchIdentity())
        if not recorded.known() or not identity.known():
            return WriterVerdict.REPLAY
        if recorded.query_id is not None and recorded.query_id == identity.query_id:
            return WriterVerdict.REPLAY
        if recorded.digest is not None and recorded.digest == identity.digest:
            return WriterVerdict.REPLAY
        what = (
            f"micro-batch {batch_id} of streaming writer {writer_id!r} is the batch id the "
            f"shard recorded last, but with other rows ({_digest_rows(identity.digest)} vs "
            f"{_digest_rows(recorded.digest)} recorded), not from the same query"
        )
    else:
        what = (
            f"micro-batch {batch_id} of streaming writer {writer_id!r} is below the last one "
            f"it committed ({last})"
        )
    raise InvalidUpdates(
        f"{what}: the query was restarted without its checkpoint (the checkpoint was lost, "
        "deleted or replaced, or a new checkpointLocation was given), so Spark numbers "
        "micro-batches from 0 again. Nothing was written. To go on: restore the checkpoint; "
        "or, to start this writer over on purpose, write under a new writer_id (with the "
        "source started after what the shard already holds, or those rows are written again)",
        location=location,
    )


def _digest_rows(digest: str | None) -> str:
    if digest is None:
        return "rows unknown"
    rows = digest.split(":")[1] if digest.count(":") == 2 else "?"
    return f"{rows} rows"


@dataclass(frozen=True)
class ShardState:
    """One version of a shard's metadata (see the module docstring for the invariants)."""

    version: int = 0
    upper: int = 0
    since: int = 0
    schema: pa.Schema | None = None
    trace: tuple[Batch, ...] = ()
    unsealed: tuple[Batch, ...] = ()
    writers: dict[str, int] = field(default_factory=dict)
    last_commit: str | None = None
    holds: dict[str, Hold] = field(default_factory=dict)
    #: Explicit write leases (`persistshard.core.statemachine.leases`): write id -> expiry (ms
    #: since the epoch). A write without an entry has the implicit lease its id's time gives it.
    leases: dict[str, int] = field(default_factory=dict)
    #: gc deleted the parts of every write whose lease had run out by this time (ms); no
    #: commit may add a part of such a write afterwards (`persistshard.core.statemachine.leases`).
    lease_fence_ms: int = 0
    #: When each streaming writer in ``writers`` last committed (ms, the committing clock);
    #: records expire and are pruned (`prune_writers`).
    writers_seen_ms: dict[str, int] = field(default_factory=dict)
    #: What identifies the micro-batch each streaming writer in ``writers`` committed last
    #: (`BatchIdentity`), when its commit said (`judge_writer_batch`); absent for records
    #: written before identities were kept.
    writer_batches: dict[str, BatchIdentity] = field(default_factory=dict)
    #: History retention (`persistshard.core.statemachine.retention`): since follows the upper
    #: minus this on every upper-moving commit; ``retention_marks`` are the (commit time,
    #: upper) of the recent data versions the rule needs.
    retention: ret.Retention | None = None
    retention_marks: tuple[ret.Mark, ...] = ()
    #: Durable consumers (`persistshard.core.statemachine.consumers`): name -> position and
    #: when it last moved. No lease: a consumer holds since until it moves or is dropped.
    consumers: dict[str, ConsumerPosition] = field(default_factory=dict)
    #: The forks that name this shard's parts, by the fork's shard id (`ForkPin`): gc keeps
    #: their keys (`kept_keys`).
    forks: dict[str, ForkPin] = field(default_factory=dict)
    #: For a fork: the shards whose parts it was created naming (shard id -> canonical
    #: location), kept so that its gc and `drop` know where its pins are.
    sources: dict[str, str] = field(default_factory=dict)
    #: The shard was dropped (`persistshard.core.fork.drop`): it names no part, reads as no
    #: shard, and takes only ``release_fork`` commits (its pins, if forks still need them).
    dropped: bool = False
    #: The txns shard this shard is registered with (`TxnsRef`), or None: a plain shard.
    txns: TxnsRef | None = None
    #: Parts of transactions not applied yet, by transaction id (`TxnPin`): gc keeps them.
    txn_pins: dict[str, TxnPin] = field(default_factory=dict)

    def live_holds(self, now_ms: int) -> dict[str, Hold]:
        """The holds whose lease has not run out at ``now_ms``."""
        return {r: h for r, h in self.holds.items() if h.live_at(now_ms)}

    def hold_floor(self, now_ms: int | None) -> int | None:
        """The furthest since may move under every hold, or None when nothing holds it: the
        smallest since of the reader holds live at ``now_ms`` (every hold when None) and
        ``position - 1`` of every consumer (`ConsumerPosition.holds_since_at`)."""
        holds = self.holds if now_ms is None else self.live_holds(now_ms)
        floors = [h.since for h in holds.values()]
        floors += [c.holds_since_at() for c in self.consumers.values()]
        return min(floors, default=None)

    def parts(self) -> list[PartRef]:
        """Every part referenced by this version."""
        return [p for b in (*self.trace, *self.unsealed) for p in b.parts]

    def part_keys(self) -> set[str]:
        return {p.key for p in self.parts()}

    def kept_keys(self) -> set[str]:
        """The keys gc must keep for this version: its parts and every key a fork's pin
        names (`forks`)."""
        keys = self.part_keys()
        for pin in self.forks.values():
            keys.update(pin.keys)
        for txn_pin in self.txn_pins.values():
            keys.update(txn_pin.keys)
        return keys

    def stored_part_keys(self) -> set[str]:
        """The keys of the parts stored as files (inline parts name no object)."""
        return {p.key for p in self.parts() if p.inline is None}

    def inline_bytes(self) -> int:
        """The bytes of every inline part of this version (bounded by the writers' cap)."""
        return sum(p.size for p in self.parts() if p.inline is not None)

    def check(self, checked: ShardState | None = None) -> None:
        """Raise `CorruptData` if any invariant of the module docstring does not hold.

        ``checked``: a state that already passed this check; the contents of the batches
        this state shares with it (the same objects, as `apply` keeps them) are not checked
        again, so checking a commit's new state costs its new batches plus one pass over the
        batch list, not one pass over every part.
        """

        def fail(msg: str) -> None:
            raise CorruptData(f"state version {self.version} breaks an invariant: {msg}")

        # Types, keys and counts first: the order checks below compare them.
        for n, v in (("version", self.version), ("upper", self.upper), ("since", self.since)):
            if not is_count(v):
                fail(f"{n} {v!r} is not a non-negative integer")
        known = (
            {id(b) for b in (*checked.trace, *checked.unsealed)} if checked is not None else set()
        )
        trace_ids = {id(b) for b in self.trace}
        for b in (*self.trace, *self.unsealed):
            if id(b) in known:
                continue
            if not isinstance(b.id, str):
                fail(f"batch id {b.id!r} is not a string")
            if not is_count(b.lower) or not is_count(b.upper) or not is_count(b.level):
                fail(f"batch {b.id} has bounds or level that are not non-negative integers")
            for p in b.parts:
                problem = key_problem(p.key)
                if problem is not None:
                    fail(f"batch {b.id}: part {problem}")
                if not is_count(p.size) or not is_count(p.num_rows):
                    fail(f"part {p.key} has size {p.size!r} and {p.num_rows!r} rows")
                problem = p.inline_problem()
                if problem is not None:
                    fail(f"batch {b.id}: {problem}")
                if p.source is not None and (
                    p.inline is not None or self.sources.get(p.source.shard_id) is None
                ):
                    fail(f"part {p.key} names source {p.source.shard_id}, not one of the shard's")
                if not p.num_rows:
                    continue
                if p.size == 0:
                    fail(f"part {p.key} has {p.num_rows} rows in 0 bytes")
                if not (is_count(p.min_time) and is_count(p.max_time)):
                    fail(f"part {p.key} has times {p.min_time!r}..{p.max_time!r}")
                if p.min_time > p.max_time:
                    fail(f"part {p.key} has min time {p.min_time} > max time {p.max_time}")
                if p.rewrite_time is not None and not (p.min_time == p.max_time == p.rewrite_time):
                    fail(f"part {p.key} is rewritten to {p.rewrite_time!r} but spans times")
                if id(b) in trace_ids and p.max_time >= b.upper:
                    fail(f"part {p.key} has time {p.max_time} beyond its batch [.., {b.upper})")
        if not 0 <= self.since <= self.upper:
            fail(f"since {self.since} and upper {self.upper} out of order")
        problem = ret.check_marks(self.retention, self.retention_marks, self.upper)
        if problem is not None:
            fail(problem)
        expected_lower = 0
        last_level = None
        for b in self.trace:
            if b.lower != expected_lower:
                fail(f"trace batch {b.id} starts at {b.lower}, expected {expected_lower}")
            if b.upper < b.lower:
                fail(f"trace batch {b.id} has upper {b.upper} < lower {b.lower}")
            if last_level is not None and b.level > last_level:
                fail(f"trace batch {b.id} has level {b.level} above its predecessor's")
            last_level = b.level
            expected_lower = b.upper
        if self.trace and expected_lower != self.upper:
            fail(f"trace ends at {expected_lower}, upper is {self.upper}")
        for b in self.unsealed:
            if b.lower >= b.upper:
                fail(f"unsealed batch {b.id} has an empty time range")
        keys = [p.key for p in self.parts()]
        if len(keys) != len(set(keys)):
            fail("a part is referenced twice")
        ids = [b.id for b in (*self.trace, *self.unsealed)]
        if len(ids) != len(set(ids)):
            fail("two batches share an id")
        stray = set(self.writer_batches) - set(self.writers)
        if stray:
            fail(f"batch identities of writers without a record: {sorted(stray)}")
        for name, c in self.consumers.items():
            if not isinstance(name, str) or not name:
                fail(f"consumer name {name!r} is not a non-empty string")
            if not is_count(c.position) or not is_count(c.moved_ms):
                fail(f"consumer {name} has position {c.position!r} and time {c.moved_ms!r}")
            if not self.since <= c.position <= self.upper:
                fail(
                    f"consumer {name} is at {c.position}, outside [since {self.since}, "
                    f"upper {self.upper}]"
                )
        for fork_id, pin in self.forks.items():
            if not isinstance(fork_id, str) or not isinstance(pin.location, str):
                fail(f"fork pin {fork_id!r} is not named by an id and a location")
            for key in pin.keys:
                problem = key_problem(key)
                if problem is not None:
                    fail(f"fork {fork_id}'s pin: {problem}")
        for txn_id, txn_pin in self.txn_pins.items():
            for key in txn_pin.keys:
                problem = key_problem(key)
                if problem is not None:
                    fail(f"transaction {txn_id}'s pin: {problem}")
        if self.dropped and (self.trace or self.unsealed):
            fail("a dropped shard names parts")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "upper": self.upper,
            "since": self.since,
            "schema": schema_to_b64(self.schema) if self.schema is not None else None,
            "trace": [b.to_json() for b in self.trace],
            "unsealed": [b.to_json() for b in self.unsealed],
            "writers": dict(self.writers),
            "last_commit": self.last_commit,
            "holds": {r: h.to_json() for r, h in sorted(self.holds.items())},
            **({"leases": dict(sorted(self.leases.items()))} if self.leases else {}),
            **({"lease_fence_ms": self.lease_fence_ms} if self.lease_fence_ms else {}),
            **({"writers_seen_ms": dict(self.writers_seen_ms)} if self.writers_seen_ms else {}),
            **(
                {"writer_batches": {w: i.to_json() for w, i in self.writer_batches.items()}}
                if self.writer_batches
                else {}
            ),
            **({"retention": self.retention.to_json()} if self.retention else {}),
            **(
                {"retention_marks": [list(m) for m in self.retention_marks]}
                if self.retention_marks
                else {}
            ),
            **(
                {"consumers": {n: c.to_json() for n, c in sorted(self.consumers.items())}}
                if self.consumers
                else {}
            ),
            **(
                {"forks": {f: p.to_json() for f, p in sorted(self.forks.items())}}
                if self.forks
                else {}
            ),
            **({"sources": dict(sorted(self.sources.items()))} if self.sources else {}),
            **({"dropped": True} if self.dropped else {}),
            **({"txns": self.txns.to_json()} if self.txns is not None else {}),
            **(
                {"txn_pins": {t: p.to_json() for t, p in sorted(self.txn_pins.items())}}
                if self.txn_pins
                else {}
            ),
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> ShardState:
        return ShardState(
            version=d["version"],
            upper=d["upper"],
            since=d["since"],
            schema=schema_from_b64(d["schema"]) if d.get("schema") else None,
            trace=tuple(Batch.from_json(b) for b in d["trace"]),
            unsealed=tuple(Batch.from_json(b) for b in d["unsealed"]),
            writers=dict(d.get("writers", {})),
            last_commit=d.get("last_commit"),
            holds={r: Hold.from_json(h) for r, h in d.get("holds", {}).items()},
            leases={w: int(e) for w, e in d.get("leases", {}).items()},
            lease_fence_ms=int(d.get("lease_fence_ms", 0)),
            writers_seen_ms={w: int(t) for w, t in d.get("writers_seen_ms", {}).items()},
            writer_batches={
                w: BatchIdentity.from_json(i) for w, i in d.get("writer_batches", {}).items()
            },
            retention=ret.Retention.from_json(d.get("retention")),
            retention_marks=tuple((int(t), int(u)) for t, u in d.get("retention_marks", [])),
            consumers={n: ConsumerPosition.from_json(c) for n, c in d.get("consumers", {}).items()},
            forks={f: ForkPin.from_json(p) for f, p in d.get("forks", {}).items()},
            sources={str(i): str(loc) for i, loc in d.get("sources", {}).items()},
            dropped=bool(d.get("dropped", False)),
            txns=TxnsRef.from_json(d["txns"]) if d.get("txns") is not None else None,
            txn_pins={t: TxnPin.from_json(p) for t, p in d.get("txn_pins", {}).items()},
        )


# --- preconditions -------------------------------------------------------------------------


@dataclass(frozen=True)
class AssertUpper:
    """The shard's upper must be exactly ``expected``."""

    expected: int

    def check(self, state: ShardState, location: str | None) -> None:
        if state.upper != self.expected:
            raise UpperMismatch(self.expected, state.upper, location=location)


@dataclass(frozen=True)
class AssertBatchesPresent:
    """Every named batch must still be in the state (compaction inputs)."""

    trace_ids: tuple[str, ...] = ()
    unsealed_ids: tuple[str, ...] = ()

    def check(self, state: ShardState, location: str | None) -> None:
        have = {b.id for b in state.trace}
        have_unsealed = {b.id for b in state.unsealed}
        missing = [i for i in self.trace_ids if i not in have]
        missing += [i for i in self.unsealed_ids if i not in have_unsealed]
        if missing:
            raise StateConflict(
                f"inputs {missing} are no longer in the shard (another compaction won)",
                location=location,
            )


@dataclass(frozen=True)
class AssertLiveHold:
    """The reader must hold since, with a lease that has not run out at ``now_ms``."""

    reader_id: str
    now_ms: int

    def check(self, state: ShardState, location: str | None) -> Hold:
        hold = state.holds.get(self.reader_id)
        if hold is None or not hold.live_at(self.now_ms):
            raise HoldExpired(self.reader_id, location=location)
        return hold


@dataclass(frozen=True)
class AssertNoLiveHold:
    """No live hold may already use the reader id (reader ids are unique)."""

    reader_id: str
    now_ms: int

    def check(self, state: ShardState, location: str | None) -> None:
        hold = state.holds.get(self.reader_id)
        if hold is not None and hold.live_at(self.now_ms):
            raise InvalidOption(
                f"reader {self.reader_id!r} is already registered (holding since {hold.since}); "
                "reader ids are unique: pick another, or expire the old hold first",
                location=location,
            )


@dataclass(frozen=True)
class AssertConsumerAt:
    """Durable consumer ``name`` must exist and be at ``expected`` (its compare-and-set)."""

    name: str
    expected: int

    def check(self, state: ShardState, location: str | None) -> ConsumerPosition:
        found = state.consumers.get(self.name)
        if found is not None and found.position == self.expected:
            return found
        if found is None:
            why = "is not there (dropped, or never created: shard.consumer(name) creates it)"
        else:
            why = (
                f"is at {found.position}, not at the expected {self.expected}: another "
                "process moved it first"
            )
        raise StateConflict(
            f"consumer {self.name!r} {why}; nothing moved (read its position again and decide)",
            location=location,
            expected=self.expected,
            actual=found.position if found is not None else None,
        )


@dataclass(frozen=True)
class AssertLevelsOrdered:
    """A compaction output at trace positions ``[first, last]`` keeps levels non-increasing:
    its predecessor's level is at least, and its successor's at most, the output's level."""

    first: int
    last: int
    level: int

    def check(self, state: ShardState, location: str | None) -> None:
        before = state.trace[self.first - 1] if self.first > 0 else None
        after = state.trace[self.last + 1] if self.last + 1 < len(state.trace) else None
        if (before is not None and before.level < self.level) or (
            after is not None and after.level > self.level
        ):
            raise StateConflict(
                f"compaction output at level {self.level} would sit between levels "
                f"{before.level if before else None} and {after.level if after else None}",
                location=location,
            )


# --- rules the commits share ------------------------------------------------------------


def part_write_id(key: str) -> str | None:
    """The write id of a part key ``parts/<write id>/<name>``, else None (also for a key that
    is not a string: a damaged commit, which the state checks then refuse)."""
    if not isinstance(key, str):
        return None
    head, sep, rest = key.partition("/")
    write_id, sep2, _ = rest.partition("/")
    return write_id if head == "parts" and sep and sep2 and write_id else None


def lease_covers(lease_id: str, write_id: str) -> bool:
    """Whether the lease named ``lease_id`` covers parts of ``write_id``: the same id, or an
    id derived from it (``<lease id>-<suffix>``, as an overwrite names its delta writes)."""
    return write_id == lease_id or write_id.startswith(lease_id + "-")


def released(leases: dict[str, int], parts: Sequence[PartRef]) -> dict[str, int]:
    """``leases`` without those covering a write whose parts a commit just added: the write
    is done, its parts are referenced, and gc judges referenced parts by the state."""
    if not leases or not parts:
        return leases
    ids = {part_write_id(p.key) for p in parts}
    return {lid: e for lid, e in leases.items() if not any(w and lease_covers(lid, w) for w in ids)}


def follow_retention(state: ShardState, now_ms: int | None) -> ShardState:
    """``state`` with since moved as far as its retention allows (never back, never past a
    live hold or a consumer's `ConsumerPosition.holds_since_at`, never to the upper:
    `persistshard.core.statemachine.retention`)."""
    if state.retention is None:
        return state
    target = ret.since_target(state.retention, state.retention_marks, now_ms)
    if target is None or target <= state.since:
        return state
    floor = state.hold_floor(now_ms)
    if floor is not None:
        target = min(target, floor)
    return replace(state, since=max(state.since, target))


#: Writer records older than this (by the committing clock) are pruned.
WRITER_RECORD_MS = 7 * 24 * 3600 * 1000
#: At most this many writer records are kept after a prune; the least recently committed go
#: first. A prune runs once the records pass this by a quarter (so its cost is amortized over
#: many commits), and every `PRUNE_EVERY` versions for the records that expired.
MAX_WRITER_RECORDS = 1000
PRUNE_EVERY = 64


def prune_due(state: ShardState) -> bool:
    """Whether the commit applied to ``state`` prunes writer records (`prune_writers`)."""
    if not state.writers:
        return False
    over = len(state.writers) > MAX_WRITER_RECORDS + MAX_WRITER_RECORDS // 4
    return over or state.version % PRUNE_EVERY == 0


def prune_writers(state: ShardState, now_ms: int) -> ShardState:
    """``state`` without the writer records that expired: last committed more than
    `WRITER_RECORD_MS` before ``now_ms``, or beyond the `MAX_WRITER_RECORDS` most recent. A
    record from before commit times were kept is stamped with ``now_ms`` by the first prune
    (it expires one period later). Pure: replaying the log prunes the same records.

    What it costs: a writer whose record was pruned is no longer recognised, so replaying a
    batch it committed long ago appends it again (docs/design.md, "Bounded metadata")."""
    seen = state.writers_seen_ms
    if len(seen) < len(state.writers):
        seen = {w: seen.get(w, now_ms) for w in state.writers}
    floor = now_ms - WRITER_RECORD_MS
    keep = [w for w, t in seen.items() if t > floor]
    if len(keep) > MAX_WRITER_RECORDS:
        keep = sorted(keep, key=lambda w: (seen[w], w))[-MAX_WRITER_RECORDS:]
    if len(keep) == len(state.writers) and seen is state.writers_seen_ms:
        return state
    kept = set(keep)
    return replace(
        state,
        writers={w: b for w, b in state.writers.items() if w in kept},
        writers_seen_ms={w: t for w, t in seen.items() if w in kept},
        writer_batches={w: i for w, i in state.writer_batches.items() if w in kept},
    )


class Step(Protocol):
    """What `check_transition` needs of a commit
    (`persistshard.core.statemachine.commits.Commit`, which imports this module)."""

    kind: ClassVar[str]
    #: Whether the commit may change the retention (``set_retention`` and
    #: ``append_set_retention`` do).
    changes_retention: ClassVar[bool]

    @property
    def id(self) -> str: ...

    def check_step(self, old: ShardState, new: ShardState) -> str | None: ...


def check_transition(
    old: ShardState, new: ShardState, commit: Step, location: str | None = None
) -> None:
    """Refuse a new state before its compare-and-set (`InvalidUpdates`: nothing is written).

    ``new`` must be ``apply(old, commit)`` and hold every invariant of `ShardState.check`
    (canonical part keys inside the shard, consistent counts, contiguous trace); on top, the
    step from ``old``: the version moves by one, upper and since never move back, only a
    commit that declares it (``set_retention``, ``append_set_retention``) changes the
    retention, the retention and its marks are valid
    (`persistshard.core.statemachine.retention`), and the commit's own check of the step
    passes (``check_step``: an append adds no unsealed update below the new
    upper, which would change snapshots that are already readable).
    """

    def refuse(msg: str) -> InvalidUpdates:
        return InvalidUpdates(
            f"commit {commit.id} ({commit.kind}) is refused before it is written: {msg}; "
            "the shard is unchanged (fix the writer that built it)",
            location=location,
        )

    try:
        new.check(checked=old)  # ``old`` was checked when it was read or committed
    except CorruptData as e:
        raise refuse(e.detail) from None
    if new.version != old.version + 1:
        raise refuse(f"it makes version {new.version} from version {old.version}")
    if new.upper < old.upper or new.since < old.since:
        raise refuse(
            f"upper {old.upper} -> {new.upper} and since {old.since} -> {new.since} move back"
        )
    if not commit.changes_retention and new.retention != old.retention:
        raise refuse(
            f"only set_retention and append_set_retention change the retention "
            f"({old.retention} -> {new.retention})"
        )
    problem = commit.check_step(old, new)
    if problem is not None:
        raise refuse(problem)
