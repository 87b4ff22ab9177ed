"""``fork``: the first version of a fork, a shard made from another's snapshot at ``as_of``
(`persistshard.core.fork`).

Precondition: the shard is empty (version 0: nothing was ever committed there), else
`StateConflict`. Effect: upper ``as_of + 1``, since ``as_of``, the source's schema, and the
source's batches restricted to times ``<= as_of``: its parts named through `SourceRef`
(never by a key outside this shard), parts the fork had to cut written as its own, and
``sources``, the shards whose parts it names (where its pins are). No holds, no consumers, no
writer records, no retention: a fork starts with none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import (
    Batch,
    PartRef,
    ShardState,
    schema_from_b64,
    schema_to_b64,
)
from persistshard.errors import StateConflict


@dataclass(frozen=True)
class Fork(Commit):
    """A fork's first version (module docstring). ``sources``: shard id -> canonical location,
    stored as sorted pairs."""

    kind = "fork"

    as_of: int
    schema: pa.Schema | None
    trace: tuple[Batch, ...]
    unsealed: tuple[Batch, ...]
    sources: tuple[tuple[str, str], ...]

    def args_json(self) -> dict[str, Any]:
        return {
            "as_of": self.as_of,
            "schema": schema_to_b64(self.schema) if self.schema is not None else None,
            "trace": [b.to_json() for b in self.trace],
            "unsealed": [b.to_json() for b in self.unsealed],
            "sources": [list(s) for s in self.sources],
        }

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        as_of, schema = args["as_of"], args.get("schema")
        if not isinstance(as_of, int) or isinstance(as_of, bool):
            raise TypeError(f"fork argument as_of is {as_of!r}, not int")
        return {
            "as_of": as_of,
            "schema": schema_from_b64(schema) if schema is not None else None,
            "trace": tuple(Batch.from_json(b) for b in args["trace"]),
            "unsealed": tuple(Batch.from_json(b) for b in args["unsealed"]),
            "sources": tuple((str(i), str(loc)) for i, loc in args["sources"]),
        }

    def added_parts(self) -> tuple[PartRef, ...]:
        """The fork's own parts (those it cut); referenced parts are the source's."""
        return tuple(p for b in (*self.trace, *self.unsealed) for p in b.parts if p.source is None)

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        if state.version != 0:
            raise StateConflict(
                f"a fork is created only where no shard is; this location holds version "
                f"{state.version}",
                location=location,
            )
        return replace(
            state,
            upper=self.as_of + 1,
            since=self.as_of,
            schema=self.schema,
            trace=self.trace,
            unsealed=self.unsealed,
            sources=dict(self.sources),
        )

    def summary(self) -> str:
        names = ", ".join(loc for _, loc in self.sources) or "an empty shard"
        parts = sum(len(b.parts) for b in (*self.trace, *self.unsealed))
        return f"fork of {names} at {self.as_of}: {parts} parts named"
