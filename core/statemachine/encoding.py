"""The stored form of a shard's state: log entries, rollups, and the fold that reads them.

The consensus log stores each commit (small: it names the parts it adds and removes) in an
`Entry`, and every `ROLLUP_EVERY` versions (`persistshard.core.storage.layout`) a full copy of
the state (a *rollup*) is written as a blob and named by the commit's entry, so loading costs
one rollup plus at most `ROLLUP_EVERY` commits, and the bytes written per commit do not grow
with history.

Stored bytes (`Entry.encode`, `encode_rollup`; docs/format.md): one header line
``<magic> <version> <length> <crc32c>\n`` then the JSON body, where ``length`` and ``crc32c``
(8 hex digits) are those of the body. Decoding checks all four before parsing, so a flipped,
truncated or lengthened object is `CorruptData` naming the file (and the shard when the caller
passes it), never a different state and never a retryable error. A decoded entry holds a
typed commit (`persistshard.core.statemachine.commits`): an unknown kind or arguments that are
not the kind's are `CorruptData` too. A loaded state is also checked: a rollup's state must
satisfy `ShardState.check`, and replaying the log (`fold`) must apply every commit (a
precondition failing on replay means the log is damaged, so it is `CorruptData`, not
`UpperMismatch`) and end in a state that satisfies `ShardState.check`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from persistshard.core.statemachine.commits import Commit, apply
from persistshard.core.statemachine.state import ShardState, is_count, key_problem
from persistshard.core.storage.layout import ROLLUPS_PREFIX
from persistshard.errors import CorruptData, PersistShardError, WriterAlreadyCommitted
from persistshard.format.memo import BytesMemo

#: Magic words of the stored objects, and the version of their layout.
ENTRY_MAGIC = b"persistshard-entry"
ROLLUP_MAGIC = b"persistshard-rollup"
STORED_VERSION = 1
_HEADER = re.compile(rb"^([a-z-]+) (\d+) (\d+) ([0-9a-f]{8})$")


def seal(magic: bytes, body: bytes) -> bytes:
    """``body`` behind a header line that carries its length and crc32c (module docstring)."""
    checksum = crc32c.crc32c(body)
    return b"%s %d %d %08x\n" % (magic, STORED_VERSION, len(body), checksum) + body


def unseal(magic: bytes, data: bytes, what: str, where: str, location: str | None) -> bytes:
    """The body of a sealed object, or `CorruptData` naming ``where`` if any check fails."""

    def corrupt(problem: str) -> CorruptData:
        return CorruptData(f"{what} is damaged: {problem}", file=where, location=location)

    line, sep, body = data.partition(b"\n")
    m = _HEADER.match(line) if sep else None
    if m is None:
        raise corrupt("no valid header line")
    if m.group(1) != magic:
        raise corrupt(f"magic {m.group(1)[:40]!r}, expected {magic!r}")
    if int(m.group(2)) != STORED_VERSION:
        raise corrupt(f"layout version {int(m.group(2))}, this reader knows {STORED_VERSION}")
    if int(m.group(3)) != len(body):
        raise corrupt(f"{len(body)} bytes, the header says {int(m.group(3))}")
    if int(m.group(4), 16) != crc32c.crc32c(body):
        raise corrupt("crc32c mismatch")
    return body


@dataclass(frozen=True)
class Entry:
    """What one consensus version holds: the commit, and where the latest rollup is."""

    commit: Commit
    rollup_version: int
    rollup_key: str | None
    at_ms: int | None = None

    def encode(self) -> bytes:
        body = json.dumps(
            {
                "commit": self.commit.to_json(),
                "rollup": {"version": self.rollup_version, "key": self.rollup_key},
                "at_ms": self.at_ms,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        return seal(ENTRY_MAGIC, body)

    @staticmethod
    def decode(data: bytes, where: str = "consensus", location: str | None = None) -> Entry:
        """The entry in ``data``; `CorruptData` naming ``where`` (and the shard at
        ``location``) if its checksum, length or contents are wrong."""
        body = unseal(ENTRY_MAGIC, data, "consensus entry", where, location)
        try:
            d = json.loads(body)
            entry = Entry(
                Commit.from_json(d["commit"]),
                d["rollup"]["version"],
                d["rollup"]["key"],
                d.get("at_ms"),
            )
            if not is_count(entry.rollup_version):
                raise ValueError(f"rollup version {entry.rollup_version!r}")
            if entry.rollup_key is not None:
                problem = key_problem(entry.rollup_key, ROLLUPS_PREFIX)
                if problem is not None:
                    raise ValueError(f"rollup {problem}")
            return entry
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptData(
                f"unreadable consensus entry: {e}", file=where, location=location
            ) from e


def encode_rollup(state: ShardState) -> bytes:
    body = json.dumps(state.to_json(), separators=(",", ":"), sort_keys=True).encode()
    return seal(ROLLUP_MAGIC, body)


#: Rollups decoded in this process, by their bytes (`decode_rollup`): every state read of a
#: shard handle opened anew decodes its newest rollup, and decoding (JSON, then
#: `ShardState.check`) is a pure function of the bytes. At most 64 rollups of up to 1 MiB
#: each, 4 MiB in all (a decoded state takes several times its bytes).
_ROLLUPS: BytesMemo[ShardState] = BytesMemo(entries=64, max_bytes=1 << 20, total_bytes=4 << 20)


def decode_rollup(data: bytes, where: str, location: str | None = None) -> ShardState:
    """The state in a rollup; `CorruptData` naming ``where`` if its checksum, length or
    contents are wrong, or if the state breaks an invariant (`ShardState.check`). The same
    bytes decoded before in this process give the state they gave then (states are
    immutable); bytes that did not decode are never remembered."""
    key = bytes(data)
    known = _ROLLUPS.get(key)
    if known is not None:
        return known
    state = _decode_rollup(key, where, location)
    _ROLLUPS.put(key, state, len(key))
    return state


def _decode_rollup(data: bytes, where: str, location: str | None) -> ShardState:
    body = unseal(ROLLUP_MAGIC, data, "state rollup", where, location)
    try:
        state = ShardState.from_json(json.loads(body))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptData(f"unreadable state rollup: {e}", file=where, location=location) from e
    try:
        state.check()
    except CorruptData as e:
        raise CorruptData(f"state rollup: {e.detail}", file=where, location=location) from e
    return state


#: Errors of `apply` that, on replay of commits that once applied, mean a damaged log.
_REPLAY_FAILURES = (PersistShardError, WriterAlreadyCommitted, KeyError, TypeError, ValueError)


def fold(state: ShardState, commits: Sequence[Commit], location: str | None = None) -> ShardState:
    """Apply ``commits`` in order (replaying the log; preconditions held when they landed),
    then check the invariants of the result (cheap: one pass over batches and parts).

    Every commit in the log applied once, so a failure here means the stored log or rollup
    is damaged: it is `CorruptData`, never a retryable error such as `UpperMismatch`.
    """
    if not commits:
        return state
    for c in commits:
        try:
            state = apply(state, c, location)
        except CorruptData:
            raise
        except _REPLAY_FAILURES as e:
            raise CorruptData(
                f"replaying the log, the commit of version {state.version + 1} ({c.kind} "
                f"{c.id}) does not apply to version {state.version}: {e}",
                location=location,
            ) from e
    try:
        state.check()
    except CorruptData as e:
        raise CorruptData(e.detail, location=location) from e
    return state
