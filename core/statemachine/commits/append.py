"""``append``: updates sealed at the upper (and perhaps unsealed beyond it), a seal, a
micro-batch of a streaming writer, the difference of an overwrite or an upsert.

Precondition: ``AssertUpper(expected_upper)``, except for a *plain* append (``rebase``: all
its updates at ``expected_upper``, ``new_upper = expected_upper + 1``, nothing unsealed) that
finds the upper moved: it is applied at the current upper instead, its batch becomes
``[upper, upper + 1)`` and its parts carry ``rewrite_time = upper`` (nothing is rewritten). A
streaming writer's batch id must be new (`judge_writer_batch`; a replay is
`WriterAlreadyCommitted`, anything else at or below the record `InvalidUpdates`).

Effect: adds the trace batch ``[expected_upper, new_upper)`` (a seal after a seal widens the
empty batch) and the unsealed batch, if any; sets the schema on the first write and widens it
by nullable columns appended at the end (schema metadata, the upsert key columns, is kept);
records the writer's batch id, time and `BatchIdentity`; releases the explicit leases of the
writes whose parts it adds; with a retention, records a mark and moves since as the
retention allows. `check_step`: no new unsealed update below the new upper.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import pyarrow as pa

from persistshard.core.statemachine import retention as ret
from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import (
    AssertUpper,
    Batch,
    BatchIdentity,
    PartRef,
    ShardState,
    WriterBatch,
    WriterVerdict,
    follow_retention,
    judge_writer_batch,
    released,
    schema_from_b64,
    schema_to_b64,
)
from persistshard.errors import InvalidOption, InvalidUpdates, WriterAlreadyCommitted


@dataclass(frozen=True)
class Append(Commit):
    """An append (module docstring). ``writer``: a streaming writer's ``(writer id, batch
    id)``; a `WriterBatch` also gives ``identity``. ``label`` names what the user did
    (``overwrite``, ``upsert``) for `history`; `apply` ignores it."""

    kind = "append"
    #: Whether this kind adds a transaction's write (``apply_txn``): the only data a shard
    #: registered with a txns shard takes (`ShardState.txns`); every other append there is
    #: `InvalidOption` naming the txns shard.
    through_txns: ClassVar[bool] = False

    expected_upper: int
    new_upper: int
    batch: Batch
    unsealed: Batch | None = None
    schema: pa.Schema | None = None
    writer: tuple[str, int] | None = None
    identity: BatchIdentity = field(default_factory=BatchIdentity)
    rebase: bool = False
    label: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.writer, WriterBatch):
            if not self.identity.known():
                object.__setattr__(self, "identity", self.writer.identity)
            object.__setattr__(self, "writer", (self.writer[0], self.writer[1]))

    def args_json(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "expected_upper": self.expected_upper,
            "new_upper": self.new_upper,
            "batch": self.batch.to_json(),
            "unsealed": self.unsealed.to_json() if self.unsealed is not None else None,
            "schema": schema_to_b64(self.schema) if self.schema is not None else None,
            "writer": list(self.writer) if self.writer is not None else None,
        }
        if self.identity.known():
            args["writer_identity"] = self.identity.to_json()
        if self.rebase:
            args["rebase"] = True
        if self.label is not None:
            args["label"] = self.label
        return args

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        unsealed, schema, writer = args.get("unsealed"), args.get("schema"), args.get("writer")
        if writer is not None:
            writer_id, batch_id = writer
            writer = (writer_id, batch_id)
        return {
            "expected_upper": args["expected_upper"],
            "new_upper": args["new_upper"],
            "batch": Batch.from_json(args["batch"]),
            "unsealed": Batch.from_json(unsealed) if unsealed is not None else None,
            "schema": schema_from_b64(schema) if schema is not None else None,
            "writer": writer,
            "identity": BatchIdentity.from_json(args.get("writer_identity")),
            "rebase": bool(args.get("rebase")),
            "label": args.get("label"),
        }

    def added_parts(self) -> tuple[PartRef, ...]:
        return (*self.batch.parts, *(self.unsealed.parts if self.unsealed is not None else ()))

    def rebased(self, state: ShardState, location: str | None) -> Batch | None:
        """The batch of a plain append (``rebase``) moved to the shard's newer upper, or None
        when the append is not plain or the upper did not move.

        A plain append's updates are all at its ``expected_upper`` and it moves the upper by
        one; when another append landed first, the batch becomes ``[upper, upper + 1)`` and
        its parts are read at ``upper`` (`PartRef.at_time`): nothing is rewritten.
        """
        expected, upper = self.expected_upper, state.upper
        if not self.rebase or upper <= expected:
            return None
        batch = self.batch
        if (
            self.unsealed is not None
            or self.new_upper != expected + 1
            or any(
                p.num_rows and (p.min_time != expected or p.max_time != expected)
                for p in batch.parts
            )
        ):
            raise InvalidUpdates(
                f"append {batch.id} asks to be rebased but is not plain (one time, upper + 1)",
                location=location,
            )
        return replace(
            batch, lower=upper, upper=upper + 1, parts=tuple(p.at_time(upper) for p in batch.parts)
        )

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        if state.txns is not None and not self.through_txns:
            raise InvalidOption(
                f"the shard is registered with the txns shard at {state.txns.location} "
                f"(id {state.txns.shard_id}): write to it in a transaction of that txns shard "
                "(txns.begin()), or forget it there first (txns.forget); nothing was applied",
                location=location,
            )
        writer, identity = self.writer, self.identity
        if writer is not None:
            verdict = judge_writer_batch(state, writer[0], writer[1], identity, location)
            if verdict == WriterVerdict.REPLAY:
                raise WriterAlreadyCommitted(writer[0], writer[1], location=location)
        rebased = self.rebased(state, location)
        if rebased is None:
            AssertUpper(self.expected_upper).check(state, location)
            new_upper, batch = self.new_upper, self.batch
        else:
            new_upper, batch = rebased.upper, rebased
        if new_upper < state.upper:
            raise InvalidOption(
                f"new upper {new_upper} is below the shard's upper {state.upper}; upper only "
                "moves forward",
                location=location,
            )
        schema = state.schema
        if self.schema is not None:
            incoming = self.schema
            if schema is None or _is_evolution(schema, incoming):
                schema = incoming
            elif not _is_evolution(incoming, schema):
                raise InvalidUpdates(
                    f"schema {incoming} does not match the shard's schema {schema}; a shard's "
                    "columns only grow by nullable columns added at the end",
                    location=location,
                )
        if schema is not None and state.schema is not None and state.schema.metadata:
            # Schema metadata (the upsert key columns, core/upsert.py) is kept across commits
            # that do not carry it.
            schema = schema.with_metadata({**state.schema.metadata, **(schema.metadata or {})})
        trace = state.trace
        if batch.upper > batch.lower:
            last = trace[-1] if trace else None
            if not batch.parts and last is not None and not last.parts and last.level == 0:
                # A seal after a seal: widen the empty batch instead of piling up empty ones.
                trace = (*trace[:-1], replace(last, upper=batch.upper))
            else:
                trace = (*trace, batch)
        unsealed = state.unsealed
        if self.unsealed is not None:
            unsealed = (*unsealed, self.unsealed)
        writers, seen, identities = state.writers, state.writers_seen_ms, state.writer_batches
        if writer is not None:
            writers = {**writers, writer[0]: writer[1]}
            if self.at_ms is not None:
                seen = {**seen, writer[0]: self.at_ms}
            if identity.known():
                identities = {**identities, writer[0]: identity}
            elif writer[0] in identities:  # the record now names a batch of unknown identity
                identities = {w: i for w, i in identities.items() if w != writer[0]}
        added = [*batch.parts, *(self.unsealed.parts if self.unsealed is not None else ())]
        if new_upper > state.upper and state.retention is not None:
            marks = ret.add_mark(state.retention, state.retention_marks, self.at_ms, new_upper)
            state = follow_retention(replace(state, retention_marks=marks), self.at_ms)
        return replace(
            state,
            upper=new_upper,
            schema=schema,
            trace=trace,
            unsealed=unsealed,
            writers=writers,
            writers_seen_ms=seen,
            writer_batches=identities,
            leases=released(state.leases, added),
        )

    def check_step(self, old: ShardState, new: ShardState) -> str | None:
        before = {b.id for b in old.unsealed}
        for b in new.unsealed:
            if b.id not in before and b.lower < new.upper:
                return (
                    f"unsealed batch {b.id} has updates from time {b.lower}, below the new "
                    f"upper {new.upper}"
                )
        return None

    def history_kind(self) -> str:
        if self.label:
            return str(self.label)
        if self.writer:
            return "stream append"
        if not self.batch.parts and self.unsealed is None:
            return "seal"
        return "append"

    def summary(self) -> str:
        rows = sum(p.num_rows for p in self.batch.parts)
        urows = sum(p.num_rows for p in self.unsealed.parts) if self.unsealed is not None else 0
        if self.rebase:
            planned = self.expected_upper
            return f"{_rows(rows)} sealed at the upper found at commit (planned at {planned})"
        text = f"upper {self.expected_upper} -> {self.new_upper}"
        if rows or not urows:
            text += f", {_rows(rows)} sealed"
        if urows:
            text += f", {_rows(urows)} unsealed"
        if self.writer:
            text += f", writer {self.writer[0]} batch {self.writer[1]}"
        return text


def _is_evolution(old: pa.Schema, new: pa.Schema) -> bool:
    """Whether ``new`` is ``old`` (same names and types) with nullable columns appended."""
    if len(new) < len(old):
        return False
    same = [(f.name, f.type) for f in old] == [(f.name, f.type) for f in new][: len(old)]
    return same and all(f.nullable for f in list(new)[len(old) :])


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"
