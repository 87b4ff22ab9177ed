"""``compact``: consecutive trace batches replaced by one batch covering their union.

Precondition: its input batches are all still present (``AssertBatchesPresent``) and
consecutive; the output covers exactly their interval and keeps levels ordered
(``AssertLevelsOrdered``). It may also name unsealed input batches (whose updates below the
upper the output absorbed) and unsealed outputs (their trimmed remainders), which replace
them. Releases the explicit leases of the writes whose parts it adds. Built by
`persistshard.core.maintenance.compact.compact_commit`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import (
    AssertBatchesPresent,
    AssertLevelsOrdered,
    Batch,
    PartRef,
    ShardState,
    released,
)
from persistshard.errors import StateConflict


@dataclass(frozen=True)
class Compact(Commit):
    """A compaction (module docstring). ``unsealed_inputs`` and ``unsealed_outputs`` are None
    when the compaction touched no unsealed batch (and then are not stored)."""

    kind = "compact"

    inputs: tuple[str, ...]
    output: Batch
    unsealed_inputs: tuple[str, ...] | None = None
    unsealed_outputs: tuple[Batch, ...] | None = None

    def args_json(self) -> dict[str, Any]:
        args: dict[str, Any] = {"inputs": list(self.inputs), "output": self.output.to_json()}
        if self.unsealed_inputs is not None:
            args["unsealed_inputs"] = list(self.unsealed_inputs)
        if self.unsealed_outputs is not None:
            args["unsealed_outputs"] = [b.to_json() for b in self.unsealed_outputs]
        return args

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        unsealed_inputs = args.get("unsealed_inputs")
        unsealed_outputs = args.get("unsealed_outputs")
        return {
            "inputs": tuple(args["inputs"]),
            "output": Batch.from_json(args["output"]),
            "unsealed_inputs": tuple(unsealed_inputs) if unsealed_inputs is not None else None,
            "unsealed_outputs": (
                tuple(Batch.from_json(b) for b in unsealed_outputs)
                if unsealed_outputs is not None
                else None
            ),
        }

    def added_parts(self) -> tuple[PartRef, ...]:
        return (*self.output.parts, *(p for b in self.unsealed_outputs or () for p in b.parts))

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        inputs, output = self.inputs, self.output
        unsealed_inputs = self.unsealed_inputs or ()
        AssertBatchesPresent(trace_ids=inputs, unsealed_ids=unsealed_inputs).check(state, location)
        ids = [b.id for b in state.trace]
        positions = sorted(ids.index(i) for i in inputs)
        if positions != list(range(positions[0], positions[0] + len(positions))):
            raise StateConflict(f"compaction inputs {list(inputs)} are not consecutive")
        first, last = state.trace[positions[0]], state.trace[positions[-1]]
        if output.lower != first.lower or output.upper != last.upper:
            raise StateConflict(
                f"compaction output [{output.lower}, {output.upper}) does not cover its inputs "
                f"[{first.lower}, {last.upper})"
            )
        AssertLevelsOrdered(positions[0], positions[-1], output.level).check(state, location)
        trace = (*state.trace[: positions[0]], output, *state.trace[positions[-1] + 1 :])
        unsealed = state.unsealed
        if unsealed_inputs or self.unsealed_outputs:
            kept = tuple(b for b in state.unsealed if b.id not in unsealed_inputs)
            unsealed = kept + tuple(self.unsealed_outputs or ())
        return replace(
            state,
            trace=trace,
            unsealed=unsealed,
            leases=released(state.leases, self.added_parts()),
        )

    def summary(self) -> str:
        n = len(self.inputs)
        out = self.output
        return f"{n} batch{'' if n == 1 else 'es'} -> 1 ({out.lower}..{out.upper})"
