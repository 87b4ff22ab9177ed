"""The rows of a txns shard and what they mean for reads (`persistshard.core.txns`): a
registration per data shard, a write per committed, not yet tidied transaction write; read as
a `TxnsView`, and the logical state of a registered data shard (`logical_state`): its state
with the committed writes it has not applied added, at the txns shard's upper.

What always holds: `logical_state` reads the txns shard's view *before* the data shard's
state, so a write missing from the view was applied before the state was read (a write is
tidied from the view only after it is applied), and a write in the view is added exactly when
the state has not applied it (its upper is not above the write's time). Nothing here commits
but `release_dangling` (gc's release of the pins of transactions that never committed).
This module names the shard handle by its shape (`Shard`): `persistshard.core.shard` imports
it for reads and gc.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import pyarrow as pa

from persistshard.core.fork import Shard as ForkShard
from persistshard.core.fork import identity
from persistshard.core.read.race import pinned_read
from persistshard.core.rows import DIFF, TIME
from persistshard.core.statemachine.commits.apply_txn import ApplyTxn
from persistshard.core.statemachine.commits.release_txn import ReleaseTxn
from persistshard.core.statemachine.state import (
    PIN_PENDING_MS,
    Batch,
    PartRef,
    ShardState,
    schema_from_b64,
    schema_to_b64,
)
from persistshard.core.storage.parts import read_part
from persistshard.errors import CorruptData, VersionCollected
from persistshard.format.memo import BytesMemo

log = logging.getLogger("persistshard.core.txnlog")


class Shard(ForkShard, Protocol):
    """What this module needs of a shard (`persistshard.core.shard.Shard`, which imports this
    module, so it is named by its shape here): a fork's needs (`persistshard.core.fork`),
    and its snapshot."""

    def snapshot(self, as_of: int | None = None) -> pa.Table: ...


#: The rows of a txns shard (module docstring).
TXNS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), False),
        pa.field("shard", pa.string(), False),
        pa.field("location", pa.string(), False),
        pa.field("txn", pa.string(), False),
        pa.field("at", pa.int64(), False),
        pa.field("batch", pa.string(), False),
    ]
)
#: How many times `read_view` reads again after gc collected the version it read.
VIEW_ATTEMPTS = 3
REGISTER = "register"
WRITE = "write"


@dataclass(frozen=True)
class Registration:
    """A ``register`` row: the data shard ``shard_id`` at ``location``, registered at ``at``."""

    shard_id: str
    location: str
    at: int

    def row(self) -> dict[str, Any]:
        return {
            "kind": REGISTER,
            "shard": self.shard_id,
            "location": self.location,
            "txn": "",
            "at": self.at,
            "batch": "",
        }


@dataclass(frozen=True)
class CommittedWrite:
    """A ``write`` row: transaction ``txn`` wrote ``parts`` (all at time ``at``) to the data
    shard ``shard_id`` at ``location``, with the user columns ``schema``."""

    txn: str
    shard_id: str
    location: str
    at: int
    parts: tuple[PartRef, ...]
    schema: pa.Schema

    def row(self) -> dict[str, Any]:
        batch = {"parts": [p.to_json() for p in self.parts], "schema": schema_to_b64(self.schema)}
        return {
            "kind": WRITE,
            "shard": self.shard_id,
            "location": self.location,
            "txn": self.txn,
            "at": self.at,
            "batch": json.dumps(batch, sort_keys=True),
        }

    @staticmethod
    def from_row(row: dict[str, Any]) -> CommittedWrite:
        batch = json.loads(row["batch"])
        return CommittedWrite(
            row["txn"],
            row["shard"],
            row["location"],
            int(row["at"]),
            tuple(PartRef.from_json(p) for p in batch["parts"]),
            schema_from_b64(batch["schema"]),
        )

    def batch(self, lower: int) -> Batch:
        """The batch ``apply_txn`` adds to a data shard whose upper is ``lower``."""
        return Batch(id=f"{self.txn}-t", lower=lower, upper=self.at + 1, parts=self.parts)


@dataclass
class TxnsView:
    """The newest snapshot of a txns shard: its upper, registrations and unretracted writes
    (sorted by time), and its state version (0: nothing committed yet)."""

    upper: int = 0
    version: int = 0
    registered: dict[str, Registration] = field(default_factory=dict)
    writes: list[CommittedWrite] = field(default_factory=list)

    def writes_of(self, shard_id: str) -> list[CommittedWrite]:
        return [w for w in self.writes if w.shard_id == shard_id]


def read_view(txns: Shard) -> TxnsView:
    """The txns shard's newest snapshot as a `TxnsView` (`CorruptData` for rows that are not
    a txns shard's). Its parts are few and small (inline, mostly): they are read one by one
    and summed here, without the read planner; a version gc collected meanwhile is read
    again (`VersionCollected` after `VIEW_ATTEMPTS`)."""
    for attempt in range(VIEW_ATTEMPTS):
        state = txns._machine.state()
        if state.version == 0 or state.schema is None or state.upper == 0:
            return TxnsView(upper=state.upper, version=state.version)
        if [f.name for f in state.schema] != TXNS_SCHEMA.names:
            raise CorruptData(
                f"the shard holds columns {state.schema.names}, not a txns shard's "
                f"{TXNS_SCHEMA.names}",
                location=txns.location,
            )
        try:
            with pinned_read(state.version, txns._machine.state, txns.location):
                tables = [
                    _rows_of_part(txns, ref)
                    for b in (*state.trace, *state.unsealed)
                    for ref in b.parts
                    if ref.num_rows
                ]
        except VersionCollected:
            if attempt == VIEW_ATTEMPTS - 1:
                raise
            continue
        return _view_of_rows(txns.location, state, tables)
    raise AssertionError("unreachable")  # pragma: no cover


def _rows_of_part(txns: Shard, ref: PartRef) -> tuple[tuple[Any, ...], ...]:
    """The updates of one part of the txns shard as tuples (its columns, then time and diff),
    remembered per part (`_PART_ROWS`: a part's key names immutable bytes)."""
    key = (txns.location, ref.key, ref.size, ref.rewrite_time)
    known = _PART_ROWS.get(key)
    if known is not None:
        return known
    table = read_part(txns._blob, ref)
    columns = [table.column(n).to_pylist() for n in (*TXNS_SCHEMA.names, TIME, DIFF)]
    rows = tuple(zip(*columns, strict=True))
    _PART_ROWS.put(key, rows, ref.size)
    return rows


#: The rows of the txns shards' parts this process read (`_rows_of_part`).
_PART_ROWS: BytesMemo[tuple[tuple[Any, ...], ...]] = BytesMemo(4096, 1 << 20, 64 << 20)


def _view_of_rows(
    location: str, state: ShardState, parts: list[tuple[tuple[Any, ...], ...]]
) -> TxnsView:
    """The view of the updates of ``parts``, their diffs summed over every time below the
    upper; every row left must count once."""
    counts: dict[tuple[Any, ...], int] = {}
    width = len(TXNS_SCHEMA.names)
    for rows in parts:
        for values in rows:
            if values[-2] >= state.upper:
                continue  # unsealed
            key = tuple(values[:width])
            counts[key] = counts.get(key, 0) + values[-1]
    view = TxnsView(upper=state.upper, version=state.version)
    for key, count in counts.items():
        if count == 0:
            continue
        row = dict(zip(TXNS_SCHEMA.names, key, strict=True))
        if count != 1:
            raise CorruptData(
                f"txns row {row['kind']} of shard {row['shard']} has count {count}",
                location=location,
            )
        if row["kind"] == REGISTER:
            view.registered[row["shard"]] = Registration(row["shard"], row["location"], row["at"])
        elif row["kind"] == WRITE:
            view.writes.append(CommittedWrite.from_row(row))
        else:
            raise CorruptData(f"txns row of unknown kind {row['kind']!r}", location=location)
    view.writes.sort(key=lambda w: (w.at, w.shard_id))
    return view


def related_by_id(shard: Shard, location: str, shard_id: str, what: str) -> Shard:
    """A handle on the shard ``shard_id`` at ``location`` (`Shard.related`): `CorruptData`
    naming both when another shard is there now (references are by identity)."""
    other = cast(Shard, shard._related(location))
    found = identity(other)
    if found != shard_id:
        raise CorruptData(
            f"the {what} {shard_id} at {location} is gone: the shard there is {found}",
            location=shard.location,
        )
    return other


def _view_of(shard: Shard, state: ShardState) -> tuple[Shard, TxnsView]:
    """The txns shard a registered ``shard`` names and its view; `CorruptData` when another
    shard is at its location now."""
    ref = state.txns
    assert ref is not None
    txns = related_by_id(shard, ref.location, ref.shard_id, "txns shard")
    return txns, read_view(txns)


def with_pending(
    state: ShardState, view: TxnsView, shard_id: str, location: str | None
) -> ShardState:
    """``state`` of the data shard ``shard_id`` with the writes ``view`` holds for it that it
    has not applied added (in memory, as `ApplyTxn` would), and sealed at the txns shard's
    upper while the view registers it. The version stays ``state``'s."""
    out = state
    for w in view.writes_of(shard_id):
        if w.at < out.upper:
            continue  # applied
        step = ApplyTxn(
            out.upper, w.at + 1, w.batch(out.upper), schema=w.schema, txn=w.txn, id=w.txn
        )
        out = step.apply(out, location)
    if shard_id in view.registered and view.upper > out.upper:
        last = out.trace[-1] if out.trace else None
        if last is not None and not last.parts and last.level == 0:
            trace = (*out.trace[:-1], replace(last, upper=view.upper))
        else:
            trace = (*out.trace, Batch(f"txns-{view.upper}-seal", out.upper, view.upper, ()))
        out = replace(out, upper=view.upper, trace=trace)
    return out


def logical_state(shard: Shard) -> ShardState:
    """The state reads of ``shard`` see: its newest state, or for a registered shard that
    state with the committed writes not yet applied and the txns shard's upper (module
    docstring: the txns shard's view is read before the data shard's state)."""
    state = shard._machine.state()
    if state.txns is None:
        return state
    _txns, view = _view_of(shard, state)
    state = shard._machine.state()
    if state.txns is None:  # forgotten meanwhile: a plain shard, sealed
        return state
    return with_pending(state, view, identity(shard), shard.location)


def release_dangling(shard: Shard, now_ms: int | None = None) -> list[str]:
    """Release the pins on the registered ``shard`` of transactions that never committed:
    pinned more than `PIN_PENDING_MS` ago and not among the txns shard's committed writes
    (a committed write's pin goes when it is applied). The transactions released."""
    state = shard._machine.state()
    if not state.txn_pins or state.txns is None:
        return []
    now = shard.config.clock() if now_ms is None else now_ms
    old = [t for t, p in state.txn_pins.items() if now - p.at_ms > PIN_PENDING_MS]
    if not old:
        return []
    _txns, view = _view_of(shard, state)
    committed = {w.txn for w in view.writes}
    released = []
    for txn in sorted(set(old) - committed):
        shard._machine.commit(ReleaseTxn(txn, id=shard._machine.new_id()))
        log.info("%s: released the dangling pin of transaction %s", shard.location, txn)
        released.append(txn)
    return released
