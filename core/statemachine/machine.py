"""State machine: the one owner of a shard's versioned state (refresh, commit loop, rollups).

A shard's state is the fold of the commits in its consensus log
(`persistshard.core.statemachine.encoding`, the kinds in
`persistshard.core.statemachine.commits`). `StateMachine` is the only code that reads that
log into a state or appends to it; the user facing `persistshard.core.shard.Shard`,
compaction (`persistshard.core.maintenance.compact`) and gc
(`persistshard.core.maintenance.gc`) all go through it.

What always holds:
- `StateMachine.state` returns the newest version at the time of the call: it re-reads the head
  and folds only the entries it has not seen (or starts again from the newest rollup).
- `StateMachine.commit` applies a commit with compare-and-set and, after a lost race, re-applies
  the *same* commit (same id, same parts) to the newer state; data blobs are never rewritten on
  retry. A precondition failure (`UpperMismatch`, `StateConflict`, ...) is raised at once and
  is determinate: nothing landed.
- A race reported lost is not trusted blindly either (a consensus may have been misled by a
  request its client library retried): the next attempt returns at once if the newest
  state's last commit is this commit (free), and, unless the consensus declares its lost
  races certain (`Consensus.certain_lost_races`: the blob consensus reads every "exists"
  back), a precondition failure after a lost race is reported only once the log after the
  version that race built on is read and does not hold the commit id (that path only): a
  landed-then-"lost" commit is neither refused nor applied twice.
- An ambiguous attempt (the consensus raised `Indeterminate` or an `OSError`) is resolved by
  looking for the commit's id in the log before anything else: if it landed, its state is
  returned; if not, the commit is tried again. Only when the outcome stays unknown (the
  storage keeps failing) does `Indeterminate` escape; an `OSError` before any attempt, and
  giving up after plain lost races (`CommitDeadline`), are determinate.
- After a lost race the next attempt waits a random pause (full jitter: uniform in
  ``[0, min(MAX_BACKOFF_SECONDS, RACE_BACKOFF_SECONDS * 2**n))`` after the n-th loss), so
  writers that collide do not collide again in lockstep; the first retry is immediate. A
  commit gives up with `CommitDeadline` once ``deadline_seconds`` (the configuration's
  ``commit_deadline_seconds``, `persistshard.core.config`) have passed since it started, or
  after ``max_attempts`` attempts.
- Before each attempt, a commit that adds parts (or renews a lease) is checked against the
  leases of the state it expects (`persistshard.core.statemachine.leases.check_commit`): a write
  whose lease ran out is refused with `LeaseExpired`, so a commit never references a part gc may
  have deleted.
- Each attempt stamps the commit with the shard's clock (``config.clock``): leases
  of reader holds are judged by the time of the commit that sees them, the same on every replay.
- Every `ROLLUP_EVERY`-th version also writes a rollup (a full copy of the state) before its
  entry, and the entry names it, so loading costs one rollup plus fewer than `ROLLUP_EVERY`
  entries, however long the log.

Relies on: the consensus contract (`persistshard.core.storage.consensus`: linearizable
compare-and-set, contiguous retained versions) and immutable blobs.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import NoReturn

from persistshard.core.config import ShardConfig
from persistshard.core.statemachine import encoding, leases
from persistshard.core.statemachine.commits import Commit, apply
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.statemachine.state import ShardState, check_transition
from persistshard.core.storage import layout, metrics
from persistshard.core.storage.blob import Blob, as_storage_error
from persistshard.core.storage.consensus import (
    Consensus,
    VersionedData,
    check_log_home,
    mark_log_home,
)
from persistshard.core.storage.layout import ROLLUP_EVERY, rollup_key
from persistshard.errors import (
    CommitDeadline,
    CorruptData,
    Indeterminate,
    InvalidOption,
    InvalidUpdates,
    LeaseExpired,
    NotSealed,
    StateConflict,
    StorageError,
    UpperMismatch,
)
from persistshard.format.memo import BytesMemo

log = logging.getLogger("persistshard.core.statemachine.machine")

#: Errors after which a commit certainly did not land (its parts may be deleted).
DETERMINATE_REFUSALS = (
    UpperMismatch,
    InvalidUpdates,
    InvalidOption,
    NotSealed,
    StateConflict,
    LeaseExpired,
    CommitDeadline,
)

#: How many compare-and-set attempts one commit makes at most before giving up.
MAX_ATTEMPTS = 1000
#: The scale of the random pause after a lost race (it doubles per loss, up to the cap).
RACE_BACKOFF_SECONDS = 0.002
MAX_BACKOFF_SECONDS = 0.5
#: How often reading the log back may fail, after an ambiguous attempt, before `Indeterminate`.
MAX_STORAGE_FAILURES = 8
#: How many times `StateMachine.state` starts again when the log was truncated under it.
MAX_STATE_READS = 16


class SharedStates:
    """The newest state each log was read or committed at in this process, shared by every
    handle on that log (as persist's process-wide state cache is): a handle whose head read
    finds exactly that entry, the same version with the same digest, takes that state instead
    of loading a rollup and folding the entries after it, however many handles were opened
    on the shard. Keyed by `Consensus.cache_key` (objects without one share nothing); at most
    ``capacity`` logs, the least recently used dropped. Thread-safe; states are immutable.

    Sound because the head entry's digest names one position in one log: every entry holds
    a commit with its own random id, so a log written again at the same location (deleted
    and recreated, or repaired) has different bytes at that version and misses."""

    def __init__(self, capacity: int) -> None:
        # Each log counts as one byte: the memo's entry bound is the only one that applies.
        self._memo: BytesMemo[tuple[int, str, ShardState, tuple[int, str | None]]] = BytesMemo(
            entries=capacity, max_bytes=1, total_bytes=capacity
        )

    def get(
        self, consensus: Consensus, head: VersionedData
    ) -> tuple[ShardState, tuple[int, str | None]] | None:
        """The state at ``head`` and its rollup, if this process holds exactly that entry's."""
        key = consensus.cache_key
        held = self._memo.get(key) if key is not None else None
        if held is None or held[0] != head.version or held[1] != head.digest:
            return None
        return held[2], held[3]

    def put(
        self,
        consensus: Consensus,
        head: VersionedData,
        state: ShardState,
        rollup: tuple[int, str | None],
    ) -> None:
        """Remember ``state`` as the state at ``head`` (unless a newer one is held: two
        handles racing here may still leave the older, which only costs a miss)."""
        key = consensus.cache_key
        if key is None:
            return
        held = self._memo.get(key)
        if held is None or held[0] <= head.version:
            self._memo.put(key, (head.version, head.digest, state, rollup), 1)

    def clear(self) -> None:
        self._memo.clear()


#: The process's shared states (`SharedStates`).
SHARED_STATES = SharedStates(capacity=64)


def repair_hint(error: CorruptData, location: str) -> CorruptData:
    """``error`` (met reading the log or a rollup), saying what to run:
    `persistshard.core.maintenance.repair` restores the last valid version when the newest entries
    are torn, and refuses (changing nothing) when the damage is older."""
    if "persistshard repair" in error.detail:
        return error
    out = CorruptData(
        f"{error.detail}; run `persistshard repair {location}` to see whether restoring the "
        "last valid version fixes it (a dry run; `--apply` restores it)",
        location=error.location or location,
    )
    out.file, out.chunk = error.file, error.chunk
    return out


class StateMachine:
    """The versioned state of the shard at ``location``, kept in ``consensus`` (entries) and
    ``blob`` (rollups). See the module docstring for what it guarantees."""

    def __init__(
        self,
        location: str,
        blob: Blob,
        consensus: Consensus,
        config: ShardConfig | None = None,
    ) -> None:
        self.location = location
        self.blob = blob
        self.consensus = consensus
        #: The shard's tunables and clock (`persistshard.core.config`).
        self.config = config if config is not None else ShardConfig()
        self._state = ShardState()
        self._rollup: tuple[int, str | None] = (0, None)
        # The write id this machine's compaction merges put their outputs under, while young
        # (`persistshard.core.maintenance.compact.merge_write_id`).
        self.merge_write_id: str | None = None
        # The shard's time as this machine last saw it: the newest of the head entry's commit
        # time and gc's lease fence (`new_write_id`).
        self._shard_time_ms = 0

    # --- the shard's time -----------------------------------------------------------------

    def _saw(self, *times_ms: int | None) -> None:
        """Remember the shard's time from a state read or committed: its lease fence and the
        commit times of the entries read (where known; every one of them, not the head's
        alone: gc bounds its fence by the newest commit time it read)."""
        self._shard_time_ms = max(self._shard_time_ms, *(t or 0 for t in times_ms))

    def now_ms(self) -> int:
        """The shard's clock (``config.clock``), raised to the shard's time as this machine
        last saw it (at most `layout.MAX_ID_LEAD_MS` past the clock): the time write ids
        start their leases."""
        clock = self.config.clock()
        return max(clock, min(self._shard_time_ms, clock + layout.MAX_ID_LEAD_MS))

    def new_write_id(self) -> str:
        """A write id whose time (its lease's start) is not behind the shard's time as this
        machine last saw it (`now_ms`). gc judges a write's lease by the time in its id and
        fences at its own clock (bounded by the newest commit time): a writer whose clock runs
        behind would otherwise mint leases that look expired to gc, and every commit of its
        writes would be refused (`LeaseExpired`) as long as its clock stays behind. Raising
        the id's time only lengthens the write's lease as gc sees it (its parts are kept
        longer), never shortens it, so it cannot make gc delete anything it would have kept."""
        return layout.new_id(self.now_ms())

    def new_id(self) -> str:
        """A fresh id (of a commit, a reader, a rollup) whose time is the shard's clock's."""
        return layout.new_id(self.config.clock())

    # --- reading ------------------------------------------------------------------------

    def known(self) -> ShardState:
        """The newest state this machine has read or committed, without reading anything
        (version 0 if none): after this machine's own commit, the state that commit made."""
        return self._state

    def state(self) -> ShardState:
        """The newest state version (re-reads the consensus head). A damaged log or rollup
        is `CorruptData` that names ``persistshard repair`` (`repair_hint`)."""
        try:
            return self._read_state()
        except CorruptData as e:
            raise repair_hint(e, self.location) from e

    def _read_state(self) -> ShardState:
        """The newest state. A read that finds the log truncated behind it (a gap, or a
        rollup gc removed) while the head moved on is started again from the new head; the
        same failure at an unchanged head is `CorruptData`."""
        for _ in range(MAX_STATE_READS):
            head = self.consensus.head()
            try:
                return self._state_at(head)
            except CorruptData:
                newer = self.consensus.head()
                if head is None or newer is None or newer.version == head.version:
                    raise
        raise Indeterminate(
            f"the log kept moving and being truncated under {MAX_STATE_READS} reads in a "
            "row; retry the read",
            location=self.location,
        )

    def _state_at(self, head: VersionedData | None) -> ShardState:
        """The state at ``head`` (read just before), from this machine's state or a rollup."""
        if head is None:
            check_log_home(self.blob, self.consensus, self.location)
            self._state, self._rollup = ShardState(), (0, None)
            return self._state
        if head.version == self._state.version:
            return self._state
        shared = SHARED_STATES.get(self.consensus, head)
        if shared is not None:
            self._state, self._rollup = shared
            self._saw(self._state.lease_fence_ms)
            return self._state
        entry = Entry.decode(head.data, self.consensus.entry_name(head.version), self.location)
        base = self._state if 0 < self._state.version < head.version else None
        # Entries up to the head only (``limit``): nothing past it is folded, so probing for
        # the version after the head would be a wasted read.
        entries = (
            self.consensus.scan(base.version + 1, head.version - base.version)
            if base is not None
            else []
        )
        if base is None or not entries or entries[0].version != base.version + 1:
            base = self.load_rollup(entry.rollup_version, entry.rollup_key)
            entries = (
                self.consensus.scan(base.version + 1, head.version - base.version)
                if base.version < head.version
                else []
            )
        commits = [
            Entry.decode(e.data, self.consensus.entry_name(e.version), self.location).commit
            for e in entries
            if e.version <= head.version
        ]
        folded = encoding.fold(base, commits, self.location)
        if folded.version < head.version:
            raise CorruptData(
                f"consensus log has a gap: rebuilt version {folded.version}, head is "
                f"{head.version}",
                location=self.location,
            )
        self._state = folded
        self._saw(folded.lease_fence_ms, entry.at_ms, *(c.at_ms for c in commits))
        self._rollup = (entry.rollup_version, entry.rollup_key)
        SHARED_STATES.put(self.consensus, head, folded, self._rollup)
        return folded

    def load_rollup(self, version: int, key: str | None) -> ShardState:
        """The state stored in the rollup of ``version`` (the empty state for version 0)."""
        if version == 0 or key is None:
            return ShardState()
        data = self.blob.get(key)
        if data is None:
            raise CorruptData(
                f"state rollup of version {version} is missing", file=key, location=self.location
            )
        return encoding.decode_rollup(data, key, self.location)

    def entries(self, from_version: int = 1) -> list[tuple[int, Entry]]:
        """The decoded log entries at or after ``from_version``, oldest first."""
        try:
            return [
                (
                    e.version,
                    Entry.decode(e.data, self.consensus.entry_name(e.version), self.location),
                )
                for e in self.consensus.scan(from_version)
            ]
        except CorruptData as e:
            raise repair_hint(e, self.location) from e

    def find_commit(self, commit_id: str, after: int) -> ShardState | None:
        """The newest state if ``commit_id`` landed at a version > ``after``, else None.
        `Indeterminate` if the log was truncated past ``after + 1`` (nothing can tell)."""
        entries = self.entries(after + 1)
        for _, entry in entries:
            if entry.commit.id == commit_id:
                return self.state()
        if entries and entries[0][0] > after + 1:
            raise Indeterminate(
                f"commit {commit_id}: the storage failed while committing, and the log was "
                f"truncated past version {after + 1} before the commit could be looked for, "
                "so whether it landed is unknown; re-read the shard before retrying",
                location=self.location,
            )
        return None

    # --- writing ------------------------------------------------------------------------

    def commit(
        self,
        commit: Commit,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        deadline_seconds: float | None = None,
        base: ShardState | None = None,
    ) -> ShardState:
        """`_commit` in an operation scope (`persistshard.core.storage.metrics`: the entry
        records what the operation did), counted and logged: landed (debug), refused (info)."""
        with metrics.operation(commit.kind):
            try:
                new = self._commit(
                    commit,
                    max_attempts=max_attempts,
                    deadline_seconds=deadline_seconds,
                    base=base,
                )
            except DETERMINATE_REFUSALS as e:
                metrics.REGISTRY.inc("commit_refusals")
                log.info("%s: commit %s (%s) refused: %s", self.location, commit.id, commit.kind, e)
                raise
        metrics.REGISTRY.inc("commits")
        op = metrics.current()
        if op is not None:
            op.landed()
        log.debug(
            "%s: commit %s (%s) landed as version %d",
            self.location,
            commit.id,
            commit.kind,
            new.version,
        )
        return new

    def _commit(
        self,
        commit: Commit,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        deadline_seconds: float | None = None,
        base: ShardState | None = None,
    ) -> ShardState:
        """Apply ``commit`` with compare-and-set, re-applying it after each lost race; the
        state it produced. Precondition failures propagate (determinate).

        After an ambiguous attempt, every later attempt first looks for the commit in the log:
        a precondition that fails *because the commit itself landed* must never be reported
        as a refusal (the caller would delete parts the shard now references).
        ``base``: a state this machine read or committed (a version > 0) that the first attempt
        builds on instead of re-reading the head; if it is no longer the newest, that attempt's
        compare-and-set fails and the next one reads the head (a small append then costs one
        compare-and-set and no read).
        """
        ambiguous_after: int | None = None  # the head before the first ambiguous attempt
        lost_after: int | None = None  # the version the first lost race built on
        unknown: BaseException | None = None
        failures = 0
        losses = 0
        started = time.monotonic()
        deadline = started + (
            self.config.commit_deadline_seconds if deadline_seconds is None else deadline_seconds
        )
        attempts = 0
        while attempts < max_attempts:
            attempts += 1
            try:
                fresh = attempts == 1 and base is not None and base.version > 0
                current = base if fresh and base is not None else self.state()
                if ambiguous_after is not None:
                    landed = self.find_commit(commit.id, ambiguous_after)
                    if landed is not None:
                        return landed
                elif lost_after is not None and current.last_commit == commit.id:
                    return current  # the "lost" race was lost to this very commit: landed
            except StorageError as e:
                self._refused(commit, ambiguous_after, e)  # an OSError, but a certain refusal
            except OSError as e:
                if ambiguous_after is None:
                    # Nothing was tried yet: determinate, nothing landed.
                    self._raise_determinate(e, commit)
                unknown = e
                failures += 1
                if failures >= MAX_STORAGE_FAILURES:
                    break
                pause = min(1.0, self.config.commit_backoff_seconds * 2**failures)
                log.info(
                    "%s: reading the log back failed (%s); retry in %.2f s", self.location, e, pause
                )
                time.sleep(pause)
                continue
            now = self.config.clock()
            stamped = replace(commit, at_ms=now)
            try:
                leases.check_commit(current, stamped, self.location)
                new = apply(current, stamped, self.location)
                check_transition(current, new, stamped, self.location)  # before any write
            except DETERMINATE_REFUSALS:
                if fresh:
                    # Planned on ``base``, which may be stale (a renewal, a seal or a merge by
                    # another handle since): refuse only on the newest state.
                    continue
                if (
                    lost_after is not None
                    and ambiguous_after is None
                    and not self.consensus.certain_lost_races
                ):
                    # A race reported lost may have been lost to this commit itself (a
                    # consensus misled by a retried request): a precondition failing now
                    # may be its own effect. Look before refusing (this path only).
                    landed = self.find_commit(commit.id, lost_after)
                    if landed is not None:
                        log.warning(
                            "%s: commit %s was reported as a lost race but had landed",
                            self.location,
                            commit.id,
                        )
                        return landed
                raise
            rollup = self._rollup
            if new.version % ROLLUP_EVERY == 0:
                key = rollup_key(new.version, now)
                try:
                    self.blob.put(key, encoding.encode_rollup(new))
                except StorageError as e:
                    self._refused(commit, ambiguous_after, e)  # certain: nothing was published
                except OSError as e:
                    if ambiguous_after is None:  # determinate: this commit wrote no entry
                        self._raise_determinate(e, commit)
                    # An earlier attempt may have landed: unknown, as a failed read-back.
                    unknown = e
                    failures += 1
                    if failures >= MAX_STORAGE_FAILURES:
                        break
                    continue
                rollup = (new.version, key)
            if current.version == 0:
                mark_log_home(self.blob, self.consensus, self.location)
            # What the operation did, counted up to here (the last request before the entry).
            done = metrics.commit_metrics(current, new, attempts - 1)
            stamped = replace(stamped, metrics=done)
            entry = Entry(stamped, rollup[0], rollup[1], at_ms=now)
            encoded = entry.encode()
            op = metrics.current()
            if op is not None:
                op.attempting()  # from here this commit may land
            try:
                ok = self.consensus.compare_and_set(current.version or None, encoded)
            except StorageError as e:
                self._refused(commit, ambiguous_after, e)  # refused for certain: not applied
            except (Indeterminate, OSError) as e:
                if ambiguous_after is None:
                    ambiguous_after = current.version
                unknown = e
                log.info(
                    "%s: commit %s ambiguous (%s); looking for it", self.location, commit.id, e
                )
                continue
            if ok:
                self._state, self._rollup = new, rollup
                self._saw(new.lease_fence_ms, now)
                SHARED_STATES.put(self.consensus, VersionedData(new.version, encoded), new, rollup)
                return new
            losses += 1
            if lost_after is None:
                lost_after = current.version
            metrics.REGISTRY.inc("commit_retries")
            log.info(
                "%s: commit %s lost a race at version %d; retrying",
                self.location,
                commit.id,
                current.version,
            )
            if time.monotonic() >= deadline:
                break
            if losses > 1:
                cap = min(MAX_BACKOFF_SECONDS, RACE_BACKOFF_SECONDS * 2 ** min(losses, 30))
                time.sleep(min(random.uniform(0, cap), max(0.0, deadline - time.monotonic())))
        if ambiguous_after is not None:
            raise Indeterminate(
                f"commit {commit.id}: the storage failed ({type(unknown).__name__}: {unknown}) "
                "and whether the commit landed could not be read back; re-read the shard "
                "before retrying",
                location=self.location,
            ) from unknown
        raise CommitDeadline(
            f"commit {commit.id} ({commit.kind}) lost {losses} compare-and-set races in "
            f"{time.monotonic() - started:.1f} s to other writers and gave up (deadline "
            f"{deadline - started:.0f} s, at most {max_attempts} attempts); nothing landed: "
            "retry later, or write from fewer processes at once",
            location=self.location,
        )

    def _refused(
        self, commit: Commit, ambiguous_after: int | None, error: StorageError
    ) -> NoReturn:
        """Raise a certain storage refusal met while committing ``commit``. It is certain about
        the request refused, not about the commit: before any ambiguous attempt nothing can
        have landed (``error`` as it is); after one (``ambiguous_after`` set) an earlier
        attempt may have landed, so the outcome is `Indeterminate`, never the refusal, whose
        "nothing was applied" would let a caller delete parts the shard may now name."""
        if ambiguous_after is None:
            raise error
        raise Indeterminate(
            f"commit {commit.id}: an earlier attempt's answer was lost and the storage then "
            f"refused ({error}); whether the commit landed is unknown: re-read the shard "
            "before retrying",
            location=self.location,
        ) from error

    def _raise_determinate(self, error: OSError, commit: Commit) -> NoReturn:
        """Raise ``error``, met before any attempt of ``commit`` could have landed (nothing
        was written to the log), as `StorageError` (`as_storage_error`): a certain refusal
        and any other storage error alike (a timeout on the first state read), since
        nothing was applied either way."""
        translated = as_storage_error(
            error, self.location, f"commit {commit.kind} (nothing was applied)"
        )
        if translated is None:
            raise error
        raise translated from error

    def delete_parts(self, keys: Iterable[str]) -> None:
        """Delete parts that no state references (after a refused commit). Best effort: a
        delete the storage refuses (read-only, permissions) or fails leaves the rest to gc,
        logged once, and never hides the refusal the caller is about to see."""
        failed: list[tuple[str, OSError]] = []
        for key in keys:
            try:
                self.blob.delete(key)
            except OSError as e:
                failed.append((key, e))
        if failed:
            log.warning(
                "%s: could not delete %d unreferenced parts (first %s: %s); gc removes them",
                self.location,
                len(failed),
                failed[0][0],
                failed[0][1],
            )
